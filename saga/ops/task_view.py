"""A human task as ``saga inspect`` shows it: who holds it, when it is due, what escalates.

A saga waiting on a human task is suspended on the task's ``<name>.answer`` signal wait; the
operator needs the task, not the wait's mechanics. The view says that the task's resume
token exists and when it expires, never the token (the operator cannot read it: it is kept
apart from the task, ``saga/store/tasks.py``), and leaves out its answer form's details.
"""

from __future__ import annotations

import msgspec

from saga.core.task_rules import Task
from saga.core.times import utc_text


class TaskView(msgspec.Struct, kw_only=True):
    """The open human task a saga waits for.

    Attributes:
        id: The task's id (``saga tasks show``).
        step: The human task's step name.
        title: What the person is asked.
        assignee: ``role:<name>`` or ``user:<name>``.
        state: ``open`` (or how it closed).
        due_ms: When it is due (after an escalation's extension: the extended time).
        holder: Who holds its claim now (``""``: nobody).
        claim_until_ms: Until when (0: no claim holds).
        escalated: Whether its escalation ran already.
        at_due: What happens at the due time, in words.
        token: Whether the task inbox holds the wait's resume token (while the task is open).
        token_expires_ms: When that token expires (0: never).

    """

    id: str
    step: str
    title: str
    assignee: str
    state: str
    due_ms: int
    holder: str
    claim_until_ms: int
    escalated: bool
    at_due: str
    token: bool = False
    token_expires_ms: int = 0


def task_view(task: Task, now_ms: int) -> TaskView:
    """The view of ``task`` at ``now_ms``."""
    holder = task.holder_at(now_ms)
    return TaskView(
        id=task.id,
        step=task.step,
        title=task.title,
        assignee=task.assignee,
        state=task.state,
        due_ms=task.due_ms,
        holder=holder,
        claim_until_ms=task.claim_until_ms if holder else 0,
        escalated=task.escalated,
        at_due=_at_due(task),
        token=task.state == "open",
        token_expires_ms=task.token_expires_ms,
    )


def task_waiting(view: TaskView, now_ms: int) -> str:
    """What the saga waits for, in one sentence: a person's answer to the task."""
    due = f"due {utc_text(view.due_ms)}" + (" (overdue)" if view.due_ms <= now_ms else "")
    claim = f"claimed by {view.holder} until {utc_text(view.claim_until_ms)}" if view.holder else "unclaimed"
    ends = f"expires {utc_text(view.token_expires_ms)}" if view.token_expires_ms else "never expires"
    token = f"; its resume token is held by the task inbox and {ends}" if view.token else ""
    task = f"task {view.step!r} for {view.assignee}, {due}, {claim}"
    return f"a person: {task}; at the due time {view.at_due}{token}"


def _at_due(task: Task) -> str:
    end = "it takes its default answer" if task.then == "default" else "it fails"
    if task.escalated or not (task.escalate_to or task.escalate_notify or task.extend_ms):
        return end
    steps = []
    if task.escalate_to:
        steps.append(f"it goes to {task.escalate_to}")
    if task.escalate_notify:
        steps.append(f"{task.notify} is notified")
    if task.extend_ms:
        steps.append(f"its due time moves {task.extend_ms // 1000} s later, then {end}")
    else:
        steps.append(end)
    return ", ".join(steps)
