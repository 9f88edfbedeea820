"""The demo's managers: they answer the large orders' approvals, one of them late.

The demo is not interactive, so its managers are code acting through a ``TaskClient``, as
a web app would for people: ``ann`` approves each large order as its task appears, but the
first, which she leaves; once nothing else is in flight the demo moves its clock past that
task's due time, the escalation policy gives the task to ``senior-managers``, and ``sam``
approves it. Nothing waits on real time: the clock jumps (:class:`DemoClock`).
"""

from __future__ import annotations

import time

import anyio
import msgspec

from redsaga.examples.orders import MANAGERS, SENIOR_MANAGERS, Approval
from saga import TaskClient
from saga.core.task_rules import Task
from saga.runtime.tasks import role_table

PEOPLE = {MANAGERS.name: {"ann"}, SENIOR_MANAGERS.name: {"sam"}}
authorize = role_table(PEOPLE)
"""Who may act: ann is a manager, sam a senior manager (the application's decision)."""


class DemoClock:
    """Real time plus what the demo skipped; timers and task due times are judged by it.

    Its :meth:`sleep` waits real time, so the worker's loops run as usual; :meth:`skip`
    moves every timer judged by this clock closer at once.
    """

    def __init__(self) -> None:
        self.skipped_ms = 0
        self.skips: list[tuple[int, int]] = []
        """(when, by how much) each skip moved the clock, in this clock's time after it."""

    def now_ms(self) -> int:
        """Unix time in ms, plus what was skipped."""
        return time.time_ns() // 1_000_000 + self.skipped_ms

    def script_now_ms(self) -> int:
        """The same time for the scripts: they judge timers by it instead of Redis ``TIME``."""
        return self.now_ms()

    async def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` of real time."""
        await anyio.sleep(seconds)

    def skip(self, ms: int) -> None:
        """Jump ``ms`` ahead."""
        self.skipped_ms += ms
        self.skips.append((self.now_ms(), ms))

    def real_ms(self, start_ms: int, end_ms: int) -> int:
        """How long from ``start_ms`` to ``end_ms`` (this clock's times) took in real time."""
        return end_ms - start_ms - sum(ms for at, ms in self.skips if start_ms < at <= end_ms)


class ApprovalNote(msgspec.Struct, kw_only=True):
    """How one large order's approval went, read back from its task log."""

    order: str
    approved_by: str
    escalated: bool
    actions: list[str]


class Desk:
    """The managers at work (see the module docstring)."""

    def __init__(self, tasks: TaskClient, clock: DemoClock) -> None:
        self.tasks, self.clock = tasks, clock
        self.late = ""
        """The task ann leaves until it is overdue."""
        self.skipped = False

    async def work(self, in_flight: int) -> None:
        """Answer what is open; with only the late order left in flight, let its time run out."""
        for task in await self.tasks.list(role=SENIOR_MANAGERS.name):
            await self._approve(task, "sam", "approved after escalation")
        for task in await self.tasks.list(role=MANAGERS.name):
            self.late = self.late or task.id
            if task.id != self.late:
                await self._approve(task, "ann", "")
            elif in_flight == 1 and not self.skipped:
                self.clock.skip(task.due_ms - self.clock.now_ms() + 1_000)
                self.skipped = True

    async def _approve(self, task: Task, by: str, note: str) -> None:
        await self.tasks.claim(task.id, by=by)
        await self.tasks.complete(task.id, Approval(approved=True, note=note), by=by)

    async def notes(self, order_ids: list[str]) -> list[ApprovalNote]:
        """What happened to each large order's approval, from the saga's task log."""
        found = []
        for order_id in order_ids:
            log = await self.tasks.log(order_id)
            done = [e.by for e in log if e.action == "completed"]
            found.append(
                ApprovalNote(
                    order=order_id,
                    approved_by=done[-1] if done else "",
                    escalated=any(e.action.startswith("escalation") for e in log),
                    actions=[f"{e.action} by {e.by}" for e in log],
                )
            )
        return found
