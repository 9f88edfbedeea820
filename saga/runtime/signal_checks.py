"""What ``SagaClient.signal`` checks of the saga before it sends: the wait is open, and no task's.

A wait that has ended would record the signal and ignore it, so the client says so first
(:class:`WaitEnded`). A human task's wait is answered through the task inbox
(``saga/runtime/tasks.py``), whose authorizer, claim and task log a bare signal would skip:
the client refuses it (:class:`NotAuthorized`), and only the task client, which alone reads
the task's resume token, sends that signal.
"""

from __future__ import annotations

from typing import Final

from saga.core.model import SagaState
from saga.definition.human_tasks import ANSWER_SUFFIX, TASKS
from saga.errors import NotAuthorized, WaitEnded
from saga.runtime.tasks import task_id_of

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
    base = step.removesuffix(ANSWER_SUFFIX)
    opened = state.steps.get(f"{base}.open") if base != step else None
    if opened is not None and any(a.participant == TASKS for a in opened.attempts):
        task = task_id_of(state.context, state.partition, state.id, base, n)
        raise NotAuthorized(task, by=by, action=PAST_THE_TASK_INBOX)
