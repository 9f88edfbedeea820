"""The operations pieces that need no Redis: the public names, replay reports, the path graph."""

from __future__ import annotations

import msgspec
import pytest

import saga
from redsaga.cli._format import parse_duration
from redsaga.examples.orders import order_fulfilment
from saga import SagaStatus
from saga.core.decider import decide, start
from saga.core.history_entry import HistoryEntry
from saga.core.model import Started, StepReplied
from saga.core.replay import replay_history
from saga.ops.graph import path_graph
from tests.ops import changed
from tests.saga.test_operator_decisions import began, dead_lettered_at_shipping, reply


def test_the_admin_client_has_every_operation_documented() -> None:
    public = [m for m in dir(saga.SagaAdmin) if not m.startswith("_")]
    assert {
        "inspect",
        "list",
        "replay",
        "redrive",
        "force_complete",
        "cancel",
        "retry",
        "export",
        "stats",
    } <= set(public)
    for method in public:
        assert getattr(saga.SagaAdmin, method).__doc__, method


def _history(state_events: list[object]) -> list[HistoryEntry]:
    """Histories as the store records them, built by running the decider."""
    from saga.core.replay import _revision

    entries, state = [], None
    for event in state_events:
        decision = (
            start(order_fulfilment, "s1", bytes(event.data), 0, event)  # type: ignore[attr-defined]
            if state is None
            else decide(order_fulfilment, state, event)  # type: ignore[arg-type]
        )
        revision = _revision(state, decision)
        entries.append(
            HistoryEntry(
                event=event,  # type: ignore[arg-type]
                effects=decision.effects,
                status=decision.state.status,
                revision=revision,
                ignored=decision.ignored,
            )
        )
        if decision.changed or state is None:
            state = decision.state
        state.revision = revision
    return entries


def test_a_replay_names_the_first_differing_decision() -> None:
    state = reply(began(), "reserve_stock")
    data = bytes(state.data)
    started = Started(id="e0", at_ms=1, data=msgspec.Raw(data))
    attempt = began().steps["reserve_stock"].attempts[0]
    replied = StepReplied(
        id="r1",
        at_ms=2,
        step="reserve_stock",
        kind="do",
        attempt=1,
        command_id=attempt.command_id,
        ok=True,
        output=msgspec.Raw(b'{"type":"StockReserved","reservation_id":"r1"}'),
    )
    history = _history([started, replied])
    report = replay_history(order_fulfilment, history, saga_id="s1")
    assert (report.ok, report.matched, report.entries) == (True, 2, 2)

    different = replay_history(changed.charging_a_cent_more(), history, saga_id="s1")
    assert different.mismatch is not None
    assert (different.mismatch.index, different.mismatch.step, different.mismatch.what) == (
        1,
        "charge_payment",
        "effects",
    )
    assert '"amount_cents":101' in different.mismatch.replayed
    assert '"amount_cents":100' in different.mismatch.recorded
    assert different.matched == 1
    assert "history entry 1 (replied r1) at step 'charge_payment'" in different.mismatch.message

    not_started = replay_history(order_fulfilment, history[1:], saga_id="s1")
    assert not_started.mismatch is not None
    assert not_started.mismatch.what == "error"


def test_a_replay_flags_a_status_or_revision_that_differs() -> None:
    history = _history([Started(id="e0", at_ms=1, data=msgspec.Raw(bytes(began().data)))])
    history[0].status = SagaStatus.COMPLETED
    report = replay_history(order_fulfilment, history, saga_id="s1")
    assert report.mismatch is not None
    assert (report.mismatch.what, report.mismatch.recorded, report.mismatch.replayed) == (
        "status",
        "completed",
        "running",
    )
    history[0].status = SagaStatus.RUNNING
    history[0].revision = 7
    report = replay_history(order_fulfilment, history, saga_id="s1")
    assert report.mismatch is not None
    assert (report.mismatch.what, report.mismatch.recorded, report.mismatch.replayed) == (
        "revision",
        "7",
        "1",
    )


def test_the_path_graph_colours_each_step_by_status() -> None:
    dead = dead_lettered_at_shipping()
    mermaid = path_graph(order_fulfilment, dead)
    assert "%% order_fulfilment@1 saga s1: dead_lettered" in mermaid
    assert "class reserve_stock,charge_payment done" in mermaid
    assert "class arrange_shipping failed" in mermaid
    assert "linkStyle 0,2,4 stroke-width:3px" in mermaid  # start->reserve->charge->ship, no end reached
    running = path_graph(order_fulfilment, began(), "dot")
    assert (
        '"reserve_stock" [label="reserve_stock\\nreply StockReserved", shape=box, style=filled, '
        'fillcolor="#fff3cd"];' in running
    )
    assert '"start" -> "reserve_stock" [label="", penwidth=3];' in running


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        ("90s", 90_000),
        ("10m", 600_000),
        ("1h30m", 5_400_000),
        ("2d", 172_800_000),
        ("45", 45_000),
        ("250ms", 250),
    ],
)
def test_durations(text: str, ms: int) -> None:
    assert parse_duration(text) == ms


@pytest.mark.parametrize("text", ["", "soon", "10 m", "m10", "1h 30m", "-5s"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(ValueError, match="is not a duration"):
        parse_duration(text)
