"""The rule that another context's orchestrator may start and cancel only the definitions its
sagas run as children: what a registry knows of it (``saga/definition/lineage.py``) and how
the check of who may send what applies it (``saga/store/trust.py``)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import msgspec
import pytest
from structlog.testing import capture_logs

from bus import Envelope, Unauthenticated
from saga import DefinitionError, Saga
from saga.core.model import CancelRequested, ParentLink, SagaState, SagaStatus, Started
from saga.definition.lineage import Lineage
from saga.definition.registry import Registry
from saga.runtime.protocol import CANCEL, START
from saga.store.trust import allowed_senders, authorize
from tests.saga import compose_sagas as sagas
from tests.saga.compose_sagas import Plan
from tests.saga.compose_sagas import billing_saga as billing

PARENT = "orchestrator:compose"


refunds = billing("refunds")
"""A definition of billing that no saga of compose runs as a child."""


def link(context: str = sagas.CONTEXT) -> ParentLink:
    return ParentLink(
        context=context, partition=0, saga_id="p1", saga="parent@1", step="bill", attempt=1, command_id="c"
    )


def start(definition: Saga[Any], context: str = sagas.CONTEXT) -> Started:
    return Started(id="s1", at_ms=1, data=msgspec.Raw(b"{}"), saga=definition.key, parent=link(context))


def child_state(definition: Saga[Any], context: str = sagas.CONTEXT) -> SagaState:
    return SagaState(
        id="s1", name=definition.name, version=definition.version, context="billing", partition=0,
        status=SagaStatus.RUNNING, data=msgspec.Raw(b"{}"), steps={}, parent=link(context),
    )  # fmt: skip


def test_a_contexts_definitions_say_which_definitions_it_runs_as_children() -> None:
    lineage = Registry([sagas.parent, sagas.invoicing, refunds, sagas.fan]).lineage
    assert lineage.children_of(sagas.CONTEXT) == frozenset({("billing", "invoicing")})
    assert lineage.may_start(sagas.CONTEXT, sagas.invoicing) is True
    assert lineage.may_start(sagas.CONTEXT, refunds) is False  # compose's code is here, and runs no refunds
    assert lineage.may_start("shop", refunds) is None  # nothing here knows shop's sagas
    assert lineage.children_of(sagas.CONTEXT) is lineage.children_of(sagas.CONTEXT)  # worked out once


def test_child_steps_in_groups_branches_and_maps_count() -> None:
    invoice, receipt, statement = billing("invoice"), billing("receipt"), billing("statement")
    parent: Saga[Plan] = Saga("grouped", context="shop", data=Plan)
    group = parent.parallel("both")
    group.child("invoice", saga=invoice, data=lambda plan: plan)
    group.child("receipt", saga=receipt, data=lambda plan: plan)
    parent.map_child("statements", saga=statement, items=lambda plan: [1], data=lambda plan, _item: plan)
    lineage = Registry([parent, invoice, receipt, statement, refunds]).lineage
    assert lineage.children_of("shop") == frozenset(
        {("billing", "invoice"), ("billing", "receipt"), ("billing", "statement")}
    )
    assert lineage.child_contexts("shop") == frozenset({"billing"})
    assert [lineage.may_start("shop", d) for d in (invoice, receipt, statement, refunds)] == [
        True, True, True, False
    ]  # fmt: skip


def test_a_declaration_alone_says_who_may_start_a_definition() -> None:
    declared = billing("declared", parents=["orders", "shop", "orders"])
    assert declared.parents == ("orders", "shop")
    lineage = Lineage([declared])  # no parent's definitions here: separate deployments
    assert lineage.may_start("orders", declared) is True
    assert lineage.may_start("compose", declared) is False
    assert lineage.may_start("orders", billing("nobody", parents=())) is False  # none may
    # either record is enough: compose's code runs no such child, but the definition names it
    assert Registry([sagas.parent, billing("named", parents=[sagas.CONTEXT])]).lineage.may_start(
        sagas.CONTEXT, billing("named", parents=[sagas.CONTEXT])
    )


@pytest.mark.parametrize(
    ("parents", "message"),
    [
        ("orders", "not one string"),
        (["orders", "bad:name"], "invalid parent context name 'bad:name'"),
        ([""], "invalid parent context name ''"),
        (["billing"], "this saga's own context"),
    ],
)
def test_a_declaration_names_other_contexts(parents: Any, message: str) -> None:
    with pytest.raises(DefinitionError, match=message) as refused:
        billing("checked", parents=parents)
    assert refused.value.saga == "checked"


def test_a_parent_context_may_start_and_cancel_only_the_children_it_runs() -> None:
    lineage = Registry([sagas.parent, sagas.invoicing, refunds]).lineage
    cancel = CancelRequested(id="x", at_ms=1)
    for event, state in ((start(sagas.invoicing), None), (cancel, child_state(sagas.invoicing))):
        assert PARENT in allowed_senders("billing", sagas.invoicing, state, event, lineage)
    for event, state in ((start(refunds), None), (cancel, child_state(refunds))):
        assert allowed_senders("billing", refunds, state, event, lineage) == {
            "client:*", "operator:*", "orchestrator:billing"
        }  # fmt: skip
    # unknown here (neither the parent's code nor a declaration): accepted, as before the rule
    assert "orchestrator:shop" in allowed_senders("billing", refunds, None, start(refunds, "shop"), lineage)


class _Auth(SimpleNamespace):
    enabled = True
    mode = "require"


def _check(lineage: Lineage, definition: Saga[Any], event: Any, state: SagaState | None, signer: str) -> None:
    kind = START if isinstance(event, Started) else CANCEL
    envelope = Envelope(id="e1", type=kind, correlation_id="s1", payload=b"{}")
    authorize(_Auth(), "billing", definition, state, event, envelope, signer, lineage)  # type: ignore[arg-type]


def test_a_refusal_names_the_parent_and_the_definition() -> None:
    lineage = Registry([sagas.parent, sagas.invoicing, refunds]).lineage
    with pytest.raises(Unauthenticated) as refused:
        _check(lineage, refunds, start(refunds), None, PARENT)
    reason = str(refused.value)
    assert "\n" not in reason
    assert "signed by orchestrator:compose, which may not send it" in reason
    assert "saga refunds@1 is not a child of context compose" in reason
    assert "no child step of context compose's definitions runs refunds" in reason
    declared = billing("declared", parents=["orders"])
    with pytest.raises(Unauthenticated, match=r"declares parents=\('orders',\)"):
        _check(Lineage([declared]), declared, CancelRequested(id="x", at_ms=1), child_state(declared), PARENT)
    _check(lineage, sagas.invoicing, start(sagas.invoicing), None, PARENT)  # its own child: accepted


def test_a_start_nothing_here_can_check_is_accepted_and_logged_once_per_parent_and_definition() -> None:
    lineage = Registry([refunds, sagas.invoicing]).lineage  # compose's and shop's code live elsewhere
    with capture_logs() as logs:
        for _ in range(3):
            _check(lineage, refunds, start(refunds), None, PARENT)
            _check(lineage, refunds, start(refunds, "shop"), None, "orchestrator:shop")
        cancel = CancelRequested(id="x", at_ms=1)
        _check(lineage, sagas.invoicing, cancel, child_state(sagas.invoicing), PARENT)
        _check(lineage, refunds, start(refunds), None, "client:web")  # a client: nothing to say
    unchecked = [log for log in logs if "accepted unchecked" in log["event"]]
    assert [(log["parent"], log["saga"]) for log in unchecked] == [
        (sagas.CONTEXT, "refunds@1"), ("shop", "refunds@1"), (sagas.CONTEXT, "invoicing@1")
    ]  # fmt: skip
    assert all(log["log_level"] == "warning" and "declare parents=" in log["event"] for log in unchecked)
    assert "parents=('compose',)" in unchecked[0]["fix"]
