"""The task inbox's rules: what each action on a human task changes (pure: no I/O, no clock).

A task is one :class:`Task` record. Every action -- open, claim, release, complete,
reassign, withdraw, and each step of the reminder and escalation policy -- is a function of
(task, who, now) returning a :class:`TaskChange`: the new record, the index moves (one
sorted set per assignee, scored by due time), the timers started and removed, the log
entries (who did what, when) and the signals to send. Both stores apply a change in one
atomic write checked against the task's revision (``saga/store/tasks.py``), so two people
racing for one claim cannot both win, and a timer step fires once: the second writer finds
the revision moved, reads again, and sees the claim taken or the step done.

States: ``open`` (claimed or not) -> ``completed`` | ``failed`` | ``withdrawn``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import msgspec

from saga.core.times import utc_text
from saga.core.tokens import peek
from saga.definition.human_tasks import OpenTask
from saga.errors import InvalidInput, NotAuthorized, TaskAlreadyClaimed, TaskClosed

TaskState = Literal["open", "completed", "failed", "withdrawn"]
Stage = Literal["remind", "due", "final"]


class Task(msgspec.Struct, kw_only=True):
    """One human task as the inbox keeps it."""

    id: str
    context: str
    partition: int
    saga_id: str
    saga: str
    step: str
    n: int
    title: str
    details: msgspec.Raw
    form: str
    assignee: str
    """``role:<name>`` or ``user:<name>``."""
    due_ms: int
    created_ms: int
    token: str = ""
    """The wait's resume token while the task is being opened or answered; the stores keep it
    apart from the record (``saga/store/tasks.py``), so a task as loaded has ``""`` here."""
    token_expires_ms: int = 0
    """When the token stops resuming the wait (0: never); what operators see of it."""
    state: TaskState = "open"
    holder: str = ""
    claim_until_ms: int = 0
    remind_ms: int = 0
    notify: str = ""
    escalate_to: str = ""
    escalate_notify: bool = False
    extend_ms: int = 0
    then: str = "fail"
    default: msgspec.Raw = msgspec.Raw(b"null")
    escalated: bool = False
    answer: msgspec.Raw = msgspec.Raw(b"null")
    answered_by: str = ""
    voters: list[str] = msgspec.field(default_factory=list)
    """A quorum task's voters (``user:<name>``), each indexed; empty for a task of one assignee."""
    quorum: int = 0
    vote: str = ""
    """The form's boolean field that counts toward the quorum."""
    ballots: dict[str, msgspec.Raw] = msgspec.field(default_factory=dict)
    """A quorum task's answers so far, by voter, in the order they came."""
    rev: int = 0

    @property
    def indexed(self) -> list[str]:
        """The assignee indexes that list the task while it is open."""
        return self.voters or [self.assignee]

    def holder_at(self, now_ms: int) -> str:
        """Who holds the claim at ``now_ms`` (``""``: nobody, or the claim expired)."""
        return self.holder if self.holder and self.claim_until_ms > now_ms else ""


class TaskLog(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One line of a saga's task log: who did what to which task, and when."""

    at_ms: int
    task: str
    step: str
    action: str
    by: str
    detail: str = ""


@dataclass(frozen=True, slots=True)
class Outgoing:
    """A message a change sends: a signal to the saga (``signal``) or a notification."""

    kind: Literal["signal", "notify"]
    data: msgspec.Raw
    """The signal's :class:`~saga.definition.human_tasks.TaskResult`, or the notice."""
    participant: str = ""
    """The notifications participant (``notify``)."""
    by: str = ""


@dataclass(slots=True)
class TaskChange:
    """What one action writes (applied atomically if ``before_rev`` is still the task's revision)."""

    task: Task
    before_rev: int
    unindex: list[str] = field(default_factory=list)
    index: list[str] = field(default_factory=list)
    timers: dict[str, int] = field(default_factory=dict)
    """Timer member ``<task>|<stage>`` -> when (ms)."""
    untimers: list[str] = field(default_factory=list)
    log: list[TaskLog] = field(default_factory=list)
    outgoing: list[Outgoing] = field(default_factory=list)

    def note(self, at_ms: int, action: str, by: str, detail: str = "") -> None:
        """Record ``action`` by ``by`` in the saga's task log."""
        self.log.append(
            TaskLog(at_ms=at_ms, task=self.task.id, step=self.task.step, action=action, by=by, detail=detail)
        )


class Notice(msgspec.Struct, tag="TaskNotice", kw_only=True, frozen=True):
    """What the notifications participant receives: a reminder, an escalation, an overdue task."""

    kind: str
    task_id: str
    saga_id: str
    title: str
    assignee: str
    due_ms: int


def timer_member(task_id: str, stage: Stage) -> str:
    """The member of a task's timer in the partition's task-timer set."""
    return f"{task_id}|{stage}"


def opened(task_id: str, ref: tuple[str, int, str, int], command: OpenTask, now_ms: int) -> TaskChange:
    """The change that opens a task; ``ref`` is (context, partition, saga id, wait number)."""
    context, partition, saga_id, n = ref
    due = now_ms + command.due_in_ms
    task = Task(
        id=task_id, context=context, partition=partition, saga_id=saga_id, saga=command.saga,
        step=command.step, n=n, title=command.title, details=command.details, form=command.form,
        assignee=command.assignee, due_ms=due, created_ms=now_ms, token=command.token,
        token_expires_ms=peek(command.token).expires_ms,
        remind_ms=due - command.remind_before_ms if command.remind_before_ms else 0,
        notify=command.notify, escalate_to=command.escalate_to,
        escalate_notify=command.escalate_notify, extend_ms=command.extend_ms, then=command.then,
        default=command.default, voters=list(command.voters), quorum=command.quorum, vote=command.vote,
    )  # fmt: skip
    change = TaskChange(
        task=task, before_rev=0, index=task.indexed, timers={timer_member(task_id, "due"): due}
    )
    if task.remind_ms:
        change.timers[timer_member(task_id, "remind")] = task.remind_ms
    change.note(now_ms, "opened", "engine", f"for {task.assignee}, due {utc_text(due)}")
    return change


def _begin(task: Task) -> TaskChange:
    if task.state != "open":
        raise TaskClosed(task.id, state=task.state)
    return TaskChange(task=msgspec.structs.replace(task, rev=task.rev + 1), before_rev=task.rev)


def _one_assignee(task: Task, action: str) -> None:
    if task.quorum:
        raise InvalidInput(f"task {task.id!r} is a quorum: each voter answers their own; none may {action}")


def claimed(task: Task, by: str, now_ms: int, ttl_ms: int) -> TaskChange:
    """``by`` claims the task until ``now_ms + ttl_ms`` (again: extends their own claim)."""
    _one_assignee(task, "claim it")
    holder = task.holder_at(now_ms)
    if holder and holder != by:
        raise TaskAlreadyClaimed(task.id, holder=holder, until_ms=task.claim_until_ms)
    change = _begin(task)
    change.task.holder, change.task.claim_until_ms = by, now_ms + ttl_ms
    change.note(now_ms, "claimed", by, f"until {utc_text(now_ms + ttl_ms)}")
    return change


def released(task: Task, by: str, now_ms: int) -> TaskChange:
    """The holder gives the claim back."""
    _one_assignee(task, "release it")
    holder = task.holder_at(now_ms)
    if holder and holder != by:
        raise TaskAlreadyClaimed(task.id, holder=holder, until_ms=task.claim_until_ms)
    change = _begin(task)
    change.task.holder, change.task.claim_until_ms = "", 0
    change.note(now_ms, "released", by)
    return change


def _close(change: TaskChange, state: TaskState) -> None:
    task = change.task
    task.state, task.holder, task.claim_until_ms = state, "", 0
    change.unindex += task.indexed
    change.untimers += [timer_member(task.id, s) for s in ("remind", "due", "final")]


def completed(task: Task, by: str, now_ms: int, result: msgspec.Raw, answer: msgspec.Raw) -> TaskChange:
    """``by`` answers the task (``answer``, already checked); the saga gets ``result``."""
    holder = task.holder_at(now_ms)
    if holder and holder != by:
        raise TaskAlreadyClaimed(task.id, holder=holder, until_ms=task.claim_until_ms)
    change = _begin(task)
    change.task.answer, change.task.answered_by = answer, by
    _close(change, "completed")
    change.outgoing.append(Outgoing("signal", data=result, by=by))
    change.note(now_ms, "completed", by)
    return change


def voted(task: Task, by: str, now_ms: int, answer: msgspec.Raw, *, failed: msgspec.Raw) -> TaskChange:
    """Voter ``by`` answers their ballot of a quorum task (``answer``, already checked).

    The quorum reached, the task is completed (the saga gets every answer given, in order)
    and each ballot still open is withdrawn; too few voters left to reach it, the task
    fails (the saga gets ``failed``); otherwise it stays open for the others.
    """
    if f"user:{by}" not in task.voters or by in task.ballots:
        raise NotAuthorized(task.id, by=by, action="answer (not a voter, or answered already)")
    change = _begin(task)
    ballots = change.task.ballots = {**task.ballots, by: answer}
    change.unindex.append(f"user:{by}")
    yes = [who for who, raw in ballots.items() if _says_yes(raw, task.vote)]
    change.note(now_ms, "completed", by, f"{'yes' if by in yes else 'no'}: {len(yes)} of {task.quorum}")
    if len(yes) >= task.quorum:
        for voter in task.voters:
            if voter.partition(":")[2] not in ballots:
                change.note(now_ms, "withdrawn", "engine", f"ballot of {voter}: the quorum was reached")
        _close(change, "completed")
        change.task.answer = msgspec.Raw(b"[" + b",".join(bytes(a) for a in ballots.values()) + b"]")
        change.task.answered_by = ",".join(ballots)
        result = b'{"answer":' + bytes(change.task.answer) + b',"by":' + msgspec.json.encode(by) + b"}"
        change.outgoing.append(Outgoing("signal", data=msgspec.Raw(result), by=by))
    elif len(task.voters) - (len(ballots) - len(yes)) < task.quorum:
        _close(change, "failed")
        change.outgoing.append(Outgoing("signal", data=failed, by=by))
        change.note(now_ms, "failed", "engine", f"{task.quorum} of {len(task.voters)} can no longer say yes")
    return change


def _says_yes(answer: msgspec.Raw, field: str) -> bool:
    decoded = msgspec.json.decode(answer)
    return isinstance(decoded, dict) and decoded.get(field) is True


def reassigned(task: Task, by: str, now_ms: int, assignee: str) -> TaskChange:
    """``by`` gives the task to ``assignee`` (``role:<r>`` or ``user:<u>``); any claim ends."""
    _one_assignee(task, "reassign it")
    change = _begin(task)
    _move(change, assignee)
    change.note(now_ms, "reassigned", by, f"{task.assignee} -> {assignee}")
    return change


def _move(change: TaskChange, assignee: str) -> None:
    task = change.task
    change.unindex.append(task.assignee)
    change.index.append(assignee)
    task.assignee, task.holder, task.claim_until_ms = assignee, "", 0


def withdrawn(task: Task, now_ms: int, reason: str) -> TaskChange:
    """The saga no longer needs the task (it was cancelled, failed, or a quorum was reached)."""
    change = _begin(task)
    _close(change, "withdrawn")
    change.note(now_ms, "withdrawn", "engine", reason)
    return change


def fired(task: Task, stage: Stage, now_ms: int, *, failed: msgspec.Raw, default: msgspec.Raw) -> TaskChange:
    """A task timer fired: remind, escalate at the due time, or end the task for good.

    ``failed`` and ``default`` are the saga's :class:`TaskResult` for the two ends.
    """
    change = _begin(task)
    change.untimers.append(timer_member(task.id, stage))
    if stage == "due" and task.escalated:
        # Another worker's firing of this same timer escalated the task first: only the
        # "final" timer of the extended due time may end it now.
        return change
    if stage == "remind":
        change.outgoing.append(_notice(task, "reminder"))
        change.note(now_ms, "reminded", "engine", f"via {task.notify}")
        return change
    if stage == "due" and not task.escalated and (task.escalate_to or task.escalate_notify or task.extend_ms):
        change.task.escalated = True
        if task.escalate_to:
            _move(change, task.escalate_to)
            change.note(now_ms, "escalation: reassigned", "engine", f"{task.assignee} -> {task.escalate_to}")
        if task.escalate_notify:
            change.outgoing.append(_notice(change.task, "escalated"))
            change.note(now_ms, "escalation: notified", "engine", f"via {task.notify}")
        if task.extend_ms:
            change.task.due_ms = task.due_ms + task.extend_ms
            change.index.append(change.task.assignee)
            change.timers[timer_member(task.id, "final")] = change.task.due_ms
            change.note(now_ms, "escalation: extended", "engine", f"due {utc_text(change.task.due_ms)}")
            return change
    if task.then == "default":
        _close(change, "completed")
        change.task.answer, change.task.answered_by = task.default, "escalation"
        change.outgoing.append(Outgoing("signal", data=default, by="escalation"))
        change.note(now_ms, "escalation: default answer", "engine")
    else:
        _close(change, "failed")
        change.outgoing.append(Outgoing("signal", data=failed, by="escalation"))
        change.note(now_ms, "escalation: failed", "engine", "not answered in time")
    return change


def _notice(task: Task, kind: str) -> Outgoing:
    notice = Notice(
        kind=kind,
        task_id=task.id,
        saga_id=task.saga_id,
        title=task.title,
        assignee=task.assignee,
        due_ms=task.due_ms,
    )
    return Outgoing("notify", participant=task.notify, data=msgspec.Raw(msgspec.json.encode(notice)))
