"""The approval chain template: several approvers, each through a signal.

Two definitions: the chain (``<name>``), whose one step is a map over the approvers that
runs one child saga per approver -- one at a time (``sequential``) or all at once
(``parallel``) -- and the single approval (``<name>.approval``), which asks its approver
(your ``ask`` function gets the resume token to send them), waits for their decision
(a signal carrying a :class:`Decision`, with a time limit) and fails if they rejected.

A rejection or a timeout fails that approval (its ``ask`` is undone with ``withdraw``, if
given), so the chain's map fails: no further approver is asked, the approvals in flight
are cancelled, and every approval already given is withdrawn, newest first. The chain's
output is the list of decisions, in approver order; add your own steps after it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Generic, Literal, TypeVar

import msgspec

from bus import PermanentError
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
"""``async def ask(request, approver, token)``: send the approver the request and the token."""
Withdraw = Callable[[R, str], Awaitable[None]]
"""``async def withdraw(request, approver)``: tell an approver the request is withdrawn."""


def approval_chain(
    name: str,
    *,
    request: type[R],
    approvers: Callable[[R], Sequence[str]],
    ask: Ask[R],
    withdraw: Withdraw[R] | None = None,
    mode: Literal["sequential", "parallel"] = "sequential",
    timeout: timedelta = timedelta(days=3),
    limit: int = 20,
    version: int = 1,
    context: str = "approvals",
) -> ApprovalChain[R]:
    """An approval chain over ``approvers(request)`` (see the module docstring).

    ``ask`` and ``withdraw`` run as local actions (retried on failure; make them
    idempotent). Deliver a decision with ``SagaClient.signal(token, Decision(...))``.
    """
    if mode not in ("sequential", "parallel"):
        raise DefinitionError(f"approval chain {name!r}: mode is 'sequential' or 'parallel', not {mode!r}")
    approval: Saga[ApprovalRequest[R]] = Saga(
        f"{name}.approval",
        version=version,
        context=context,
        data=ApprovalRequest[request],  # type: ignore[valid-type]
    )

    async def ask_approver(data: ApprovalRequest[R], ctx: StepContext) -> None:
        await ask(data.request, data.approver, ctx.resume_token("decision"))

    approval.action(name="ask", compensate="withdraw" if withdraw else None)(ask_approver)
    decision_step = approval.wait_signal("decision", output=Decision, timeout=timeout)

    async def check(_data: ApprovalRequest[R], ctx: StepContext) -> Decision:
        decision = ctx.output(decision_step)
        if not decision.approved:
            who = decision.by or _data.approver
            raise PermanentError(
                f"{who} rejected the request" + (f": {decision.comment}" if decision.comment else "")
            )
        return decision

    approval.action(name="check")(check)

    chain: Saga[R] = Saga(name, version=version, context=context, data=request)
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

        async def withdraw_asked(data: ApprovalRequest[R], _ctx: StepContext) -> None:
            await send_withdrawal(data.request, data.approver)

        async def withdraw_approval(data: R, ctx: StepContext) -> None:
            await send_withdrawal(data, ctx.item)

        approval.compensation("withdraw")(withdraw_asked)
        chain.compensation("withdraw_approval")(withdraw_approval)
    return ApprovalChain(chain=chain, approval=approval)


def _request_of(request: Any, approver: str, approvers: Sequence[str]) -> ApprovalRequest[Any]:
    listed = list(approvers)
    return ApprovalRequest(
        request=request, approver=approver, position=listed.index(approver), of=len(listed)
    )
