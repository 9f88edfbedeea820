"""A saga with a human task, for the task inbox's tests: refunds over a limit need a manager."""

from __future__ import annotations

from datetime import timedelta

import msgspec

from saga import Saga
from saga.definition.human_tasks import Escalation, Role, User

CONTEXT = "refunds"


class Refund(msgspec.Struct, frozen=True):
    id: str
    amount: int


class Approval(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    approved: bool
    note: str = ""


refund = Saga("refund", version=1, context=CONTEXT, data=Refund)
approve = refund.human_task(
    "approve",
    title=lambda r: f"Approve refund {r.id} of {r.amount}",
    form=Approval,
    assignee=Role("managers"),
    due=timedelta(hours=4),
    reminder=timedelta(hours=1),
    notify="notices",
    escalation=Escalation(reassign_to=User("boss"), extend=timedelta(hours=2)),
)


@refund.action()
async def pay(data: Refund, ctx: object) -> str:
    answer = ctx.output(approve)  # type: ignore[attr-defined]
    return f"paid {data.amount}" if answer.approved else "refused"


lenient = Saga("lenient", version=1, context=CONTEXT, data=Refund)
lenient_approve = lenient.human_task(
    "approve",
    title="Approve",
    form=Approval,
    assignee=lambda r: User("ann") if r.amount < 100 else Role("managers"),
    due=timedelta(hours=1),
    escalation=Escalation(notify=False, then="default", default=Approval(approved=False, note="timed out")),
)
