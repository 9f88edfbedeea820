"""The approval chain template: several approvers, each through a human task.

Two definitions: the chain (``<name>``) and the single approval (``<name>.approval``). The
single approval is a human task for its approver (``saga.human_task``: listed in their
inbox, answered with a :class:`Decision` through ``TaskClient.complete`` or ``saga tasks
complete``, due after ``timeout``); your ``ask`` function gets the task's id to send them,
and the approval fails if they rejected. The chain runs them:

- ``sequential``: one child approval per approver, one at a time (a map over the approvers);
- ``parallel``: one child approval per approver, all at once;
- ``quorum``: one k-of-n task (``saga.quorum_task``) every approver answers; ``quorum`` yes
  answers complete it and withdraw the ballots still open, too many noes fail it.

A rejection or a timeout fails the chain: no further approver is asked, the approvals in
flight are withdrawn (their tasks too), and every approval already given is withdrawn,
newest first (``withdraw``, if given). ``escalate_to(approver)`` names who takes over an
approver's task when their time runs out (the task moves to them for another ``timeout``;
sequential and parallel chains). The chain's output is the decisions, in approver order
(``sequential``, ``parallel``) or in the order they came (``quorum``); add your own steps
after it, or start the chain as a child saga of yours.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Generic, Literal, TypeVar

import msgspec

from bus import PermanentError
from saga.definition.human_tasks import Escalation, Unannounce, User
from saga.definition.saga import Saga, StepContext
from saga.errors import DefinitionError

R = TypeVar("R")


class Decision(msgspec.Struct, kw_only=True, frozen=True):
    """An approver's answer: the data their signal carries (and the approval's output)."""

    approved: bool
    by: str = ""
    comment: str = ""


class ApprovalRequest(msgspec.Struct, Generic[R], kw_only=True, frozen=True):
    """The data of one approval: the request, who approves it, and where in the chain."""

    request: R
    approver: str
    position: int
    of: int


@dataclass(frozen=True, slots=True)
class ApprovalChain(Generic[R]):
    """What :func:`approval_chain` returns: both definitions (register both with your app)."""

    chain: Saga[R]
    approval: Saga[ApprovalRequest[R]]

    @property
    def definitions(self) -> list[Saga[Any]]:
        """Both definitions, for ``App(sagas=...)`` and ``SagaRunner(...)``."""
        return [self.chain, self.approval]


Ask = Callable[[R, str, str], Awaitable[None]]
"""``async def ask(request, approver, task_id)``: send the approver the request and the task's id."""
Withdraw = Callable[[R, str], Awaitable[None]]
"""``async def withdraw(request, approver)``: tell an approver the request is withdrawn."""


def approval_chain(
    name: str,
    *,
    request: type[R],
    approvers: Callable[[R], Sequence[str]],
    ask: Ask[R],
    withdraw: Withdraw[R] | None = None,
    mode: Literal["sequential", "parallel", "quorum"] = "sequential",
    timeout: timedelta = timedelta(days=3),
    limit: int = 20,
    version: int = 1,
    context: str = "approvals",
    quorum: int = 0,
    escalate_to: Callable[[str], str] | None = None,
) -> ApprovalChain[R]:
    """An approval chain over ``approvers(request)`` (see the module docstring).

    ``ask`` and ``withdraw`` run as local actions (retried on failure; make them
    idempotent). ``quorum`` is how many yes answers a ``quorum`` chain needs.
    """
    where = f"approval chain {name!r}"
    if mode not in ("sequential", "parallel", "quorum"):
        raise DefinitionError(f"{where}: mode is 'sequential', 'parallel' or 'quorum', not {mode!r}")
    if (mode == "quorum") != (quorum > 0):
        raise DefinitionError(f"{where}: a quorum (k of n) goes with mode='quorum', and only with it")
    if mode == "quorum" and escalate_to is not None:
        raise DefinitionError(f"{where}: a quorum's ballots are not reassigned (escalate_to)")
    approval: Saga[ApprovalRequest[R]] = Saga(
        f"{name}.approval",
        version=version,
        context=context,
        data=ApprovalRequest[request],  # type: ignore[valid-type]
    )
    deputy = escalate_to
    policy = Escalation(
        reassign_to=(lambda d: User(deputy(d.approver))) if deputy else None,
        extend=timeout if deputy else None,
    )

    async def ask_approver(data: ApprovalRequest[R], task_id: str) -> None:
        await ask(data.request, data.approver, task_id)

    async def withdraw_asked(data: ApprovalRequest[R]) -> None:
        if withdraw is not None:
            await withdraw(data.request, data.approver)

    decision_step = approval.human_task(
        "decision",
        title=lambda d: f"{name}: approve ({d.position + 1} of {d.of})",
        form=Decision,
        assignee=lambda d: User(d.approver),
        due=timeout,
        details=lambda d: d.request,
        escalation=policy,
        announce=ask_approver,
        unannounce=withdraw_asked if withdraw else None,
    )

    async def check(data: ApprovalRequest[R], ctx: StepContext) -> Decision:
        decision = ctx.output(decision_step)
        if not decision.approved:
            raise PermanentError(_rejected(decision, data.approver))
        return decision

    approval.action(name="check")(check)
    chain: Saga[R] = Saga(name, version=version, context=context, data=request)
    if mode == "quorum":
        _quorum(chain, name, approvers=approvers, ask=ask, withdraw=withdraw, timeout=timeout, quorum=quorum)
        return ApprovalChain(chain=chain, approval=approval)
    chain.map_child(
        "approvals",
        saga=approval,
        items=lambda r: list(approvers(r)),
        data=lambda r, approver: _request_of(r, approver, approvers(r)),
        concurrency=1 if mode == "sequential" else None,
        limit=limit,
        compensate="withdraw_approval" if withdraw else None,
    )
    if withdraw is not None:
        send_withdrawal = withdraw

        async def withdraw_approval(data: R, ctx: StepContext) -> None:
            await send_withdrawal(data, ctx.item)

        chain.compensation("withdraw_approval")(withdraw_approval)
    return ApprovalChain(chain=chain, approval=approval)


def _quorum(
    chain: Saga[R],
    name: str,
    *,
    approvers: Callable[[R], Sequence[str]],
    ask: Ask[R],
    withdraw: Withdraw[R] | None,
    timeout: timedelta,
    quorum: int,
) -> None:
    """The chain's one k-of-n task; ``ask`` and ``withdraw`` go to every approver."""

    async def ask_all(data: R, task_id: str) -> None:
        for approver in approvers(data):
            await ask(data, approver, task_id)

    withdraw_all: Unannounce | None = None
    if withdraw is not None:
        send_withdrawal = withdraw

        async def withdraw_each(data: R) -> None:
            for approver in approvers(data):
                await send_withdrawal(data, approver)

        withdraw_all = withdraw_each

    chain.quorum_task(
        "approvals",
        title=f"{name}: approve ({quorum} needed)",
        form=Decision,
        voters=lambda r: [User(a) for a in approvers(r)],
        quorum=quorum,
        due=timeout,
        announce=ask_all,
        unannounce=withdraw_all,
    )


def _rejected(decision: Decision, approver: str) -> str:
    who = decision.by or approver
    return f"{who} rejected the request" + (f": {decision.comment}" if decision.comment else "")


def _request_of(request: Any, approver: str, approvers: Sequence[str]) -> ApprovalRequest[Any]:
    listed = list(approvers)
    return ApprovalRequest(
        request=request, approver=approver, position=listed.index(approver), of=len(listed)
    )
