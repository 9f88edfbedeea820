"""The orchestrator's flow gates keep each round's rebuilds apart from concurrent rounds'."""

from __future__ import annotations

from typing import Any

import msgspec

from bus import FakeClock
from bus.lowlevel import ScriptCall
from saga.core.decision import Decision
from saga.core.model import SagaState, SagaStatus
from saga.definition.rate import RateLimit
from saga.definition.registry import Registry
from saga.runtime.flow_gates import FlowGates
from saga.store.codec import Loaded


def decision(saga_id: str) -> Decision:
    state = SagaState(
        id=saga_id, name="s", version=1, context="c", partition=0, status=SagaStatus.RUNNING,
        data=msgspec.Raw(b"{}"), steps={},
    )  # fmt: skip
    return Decision(state=state)


def built(tag: str) -> Any:
    return lambda _decision: (ScriptCall(None, (), (tag,)), None)  # type: ignore[arg-type]


def test_a_round_forgets_only_its_own_decisions() -> None:
    """Two partitions' rounds interleave: the first to end must not drop the other's rebuilds.

    (Forgetting every round's rebuilds at the end of one made the other round's rebuild of a
    held command fail with a KeyError under load.)
    """
    gate = FlowGates(None, Registry([], limits=[RateLimit("api", "1/s")]), FakeClock(), None)
    first, second = decision("a"), decision("b")
    gate.remember(first, built("a"))
    gate.remember(second, built("b"))
    gate.forget([first])
    call: tuple[ScriptCall, Loaded] = gate.rebuild(second)
    assert call[0].args == ("b",)
    gate.forget([second])
    assert not gate._rebuild
