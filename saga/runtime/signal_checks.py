"""What ``SagaClient.signal`` checks of the saga before it sends: the wait is open, and no task's.

A wait that has ended would record the signal and ignore it, so the client says so first
(:class:`WaitEnded`). A human task's wait is answered through the task inbox
(``saga/runtime/tasks.py``), whose authorizer, claim and task log a bare signal would skip:
the client refuses it (:class:`NotAuthorized`), and only the task client, which alone reads
the task's resume token, sends that signal. The orchestrator checks it again
(:func:`check_task_path`): the signal must be the one the write that closed the task sent.
"""

from __future__ import annotations

from typing import Any, Final

from bus import Envelope, PermanentError
from saga.core.model import SagaState
from saga.definition.human_tasks import ANSWER_SUFFIX, TASKS
from saga.errors import NotAuthorized, WaitEnded
from saga.runtime.tasks import message_id, task_id_of
from saga.store.keys import Partition
from saga.store.tasks import RedisTaskStore

PAST_THE_TASK_INBOX: Final = "answer through `saga signal`, past the authorizer (use `saga tasks complete`):"
"""The action :class:`NotAuthorized` names when a task's wait is signalled directly."""


def check_wait_open(state: SagaState, step: str, n: int) -> None:
    """Raise :class:`WaitEnded` when wait ``n`` of ``step`` can no longer be resumed.

    A wait not begun yet (the signal comes early) is open: the saga keeps the signal for it.
    """
    record = state.steps.get(step)
    current = state.wait is not None and (state.wait.step, state.wait.n) == (step, n)
    if record is None or current:
        return
    attempt = next((a for a in record.attempts if a.kind == "do" and a.n == n), None)
    if state.status.terminal or attempt is not None:
        how = state.status.value if attempt is None or attempt.outcome is None else attempt.outcome
        raise WaitEnded(state.id, step, n, "resumed" if how == "ok" else how)


def refuse_task_wait(state: SagaState, step: str, n: int, *, by: str) -> None:
    """Raise :class:`NotAuthorized` when ``step`` is a human task's wait for its answer.

    Such a wait's ``<task>.open`` step sent its command to the task inbox. Its answer goes
    through ``TaskClient``, whose authorizer, claim check and task log a bare signal would skip.
    """
    task = task_of_wait(state, step, n)
    if task is not None:
        raise NotAuthorized(task, by=by, action=PAST_THE_TASK_INBOX)


def task_of_wait(state: SagaState, step: str, n: int) -> str | None:
    """The id of the human task whose answer wait ``n`` of ``step`` is (``None``: no task's)."""
    base = step.removesuffix(ANSWER_SUFFIX)
    opened = state.steps.get(f"{base}.open") if base != step else None
    if opened is None or not any(a.participant == TASKS for a in opened.attempts):
        return None
    return task_id_of(state.context, state.partition, state.id, base, n)


_MESSAGES_PER_WRITE: Final = 8
"""More than a task write sends (its signal and its notices)."""


async def check_task_path(redis: Any, state: SagaState, step: str, n: int, envelope: Envelope) -> None:
    """Refuse a signal to a task's wait that the write closing the task did not send.

    ``TaskClient`` closes the task (after its authorizer and claim checks, with the task log)
    and adds the signal in one script, the signal's id derived from the task's revision; a
    signal written past it, even with a valid token, finds the task open or its id another.
    """
    task_id = task_of_wait(state, step, n)
    if task_id is None:
        return
    task = await RedisTaskStore(redis).load(Partition(state.context, state.partition), task_id)
    if task is not None and task.state != "open":
        if envelope.id in {message_id(task, i) for i in range(_MESSAGES_PER_WRITE)}:
            return
        raise PermanentError(
            f"signal refused: task {task_id} was closed by another write (revision {task.rev}), "
            "not this signal's: a task is answered through the task client alone"
        )
    raise PermanentError(
        f"signal refused: task {task_id} is {'gone' if task is None else 'still open'}: a task is "
        "answered through the task client alone (its authorizer and task log), not by a bare signal"
    )
