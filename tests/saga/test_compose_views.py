"""Composed sagas as people see them: shapes (versioning), inspect, graph, the admin client."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

import bus
from bus import FakeClock
from saga import App, Command, Saga, SagaAdmin, SagaClient, SagaWorker, command
from saga.definition.shape import shape_of
from saga.errors import ActionRefused
from saga.ops.graph import definition_graph, path_graph
from saga.ops.inspect import build_inspection
from saga.testing import Behaviour, FakeParticipant, SagaRunner
from saga.testing.fakes import Response
from saga.versions.compatibility import compare_shapes
from tests.saga.compose_sagas import DEFINITIONS, Plan, Services, Work, Worked, fan, parent, seats


def test_a_groups_shape_has_its_branches_by_position_and_name() -> None:
    shape = shape_of(fan)
    steps = {s.name: s for s in shape.steps}
    assert steps["book"].kind == "parallel"
    assert list(steps["book"].branches) == ["0:flight", "1:hotel", "2:car"]
    assert steps["book"].branches["0:flight"][0].compensation is not None
    assert steps["item"].kind == "map"
    assert [s.name for s in steps["item"].branches["each"]] == ["item"]
    assert {s.name: s for s in shape_of(parent).steps}["bill"].waits == ("child invoicing@1",)
    assert {s.name: s for s in shape_of(seats).steps}["hold_seat"].waits == ("confirm confirm_seat", "expiry")


def _parallel(name: str, branches: list[str]) -> Saga[Plan]:
    saga: Saga[Plan] = Saga("shaped", context="compose", data=Plan)
    group = saga.parallel(name)
    for branch in branches:

        def build(data: Plan) -> Command:
            return command("worker", Work(piece="x", saga="", plan=data))

        group.step(reply=Worked, name=branch)(build)
    return saga


def test_reordering_branches_breaks_a_version_and_appending_one_does_not() -> None:
    old = shape_of(_parallel("g", ["a", "b"]))
    appended = compare_shapes(old, shape_of(_parallel("g", ["a", "b", "c"])))
    assert [(c.rule, c.breaking) for c in appended] == [("branch-added", False)]
    reordered = compare_shapes(old, shape_of(_parallel("g", ["b", "a"])))
    assert {c.rule for c in reordered} == {"branch-removed", "branch-added"}
    assert any(c.breaking for c in reordered)


def quiet_items() -> Behaviour:
    """The worker does not answer the map's items (they stay in flight)."""

    def bind(previous: Behaviour | None) -> Any:
        assert previous is not None

        def respond(message: Work, ctx: Any) -> Response:
            return Response(None) if message.piece.startswith("item-") else previous.respond(message, ctx)

        return respond

    return Behaviour("quiet_items", bind)


def running_fan() -> SagaRunner:
    async def cancel(_saga_id: str) -> None:
        return None

    worker = FakeParticipant.of(Services(cancel).build()).on(Work, quiet_items())
    runner = SagaRunner(*DEFINITIONS, participants=[worker])
    saga_id = runner.start(Plan(id="p", items=["a", "b", "c", "d", "e"]), definition=fan, saga_id="f")
    runner.run_until_idle()  # prepare, book, then the map's first three items in flight
    assert runner.state(saga_id).steps["item"].group is not None
    return runner


def test_inspect_shows_branches_with_their_index_and_state() -> None:
    runner = running_fan()
    state = runner.state("f")
    found = build_inspection(
        state, runner.history("f"), [], [], now_ms=runner.now_ms, shape=shape_of(fan), full_history=False
    )
    views = {b.key: b for b in found.branches}
    assert [(v.group, v.index, v.branch, v.status) for v in found.branches if v.group == "book"] == [
        ("book", 0, "flight", "succeeded"),
        ("book", 1, "hotel", "succeeded"),
        ("book", 2, "car", "succeeded"),
    ]
    assert views["item#0"].branch == "item"
    assert views["item#0"].status == "dispatched"
    assert views["book#0"].completed == 1
    assert views["book#0"].compensation == "undo_flight"
    assert found.current_step == "item"
    assert "0 of 5 branches of item succeeded" in found.waiting_for
    assert "3 in flight (item#0, item#1, item#2), 2 not started yet" in found.waiting_for
    step = {s.name: s for s in found.steps}["item"]
    assert step.kind == "map"
    assert step.group is not None
    assert step.group.running == [0, 1, 2]


def test_graph_draws_groups_and_a_sagas_path_through_them() -> None:
    mermaid = definition_graph(fan)
    assert 'subgraph book ["book: all of 3, 2 at a time"]' in mermaid
    assert "book__flight -.->|compensate| undo_book" in mermaid
    assert "map: one per item (at most 50, 3 at a time)" in mermaid
    dot = definition_graph(fan, "dot")
    assert 'subgraph "cluster_book"' in dot
    assert "child saga invoicing@1" in definition_graph(parent)
    assert "pay --> confirm_hold_seat" in definition_graph(seats).replace("-->|confirm|", "-->")
    runner = running_fan()
    lines = path_graph(fan, runner.state("f")).splitlines()
    done = next(line for line in lines if line.strip().startswith("class ") and line.endswith(" done"))
    assert {"prepare", "book__flight", "book__hotel", "book__car"} <= set(done.split()[1].split(","))
    assert "    class item active" in lines


@pytest.mark.anyio
async def test_the_admin_client_inspects_branches_from_the_branch_hash(redis: bus.Redis) -> None:
    app = App("compose", sagas=DEFINITIONS)
    clock = FakeClock()
    client = SagaClient(redis, app.registry, clock=clock)

    async def cancel(_saga_id: str) -> None:
        return None

    orchestrator = SagaWorker(redis, app, clock=clock)
    worker = SagaWorker(redis, App("w", participants=[Services(cancel).build()]), clock=clock)
    await client.start(fan, Plan(id="p", items=["a", "b"]), saga_id="f")
    for _ in range(10):
        await worker.run_until_idle()
        await orchestrator.run_until_idle()
    found = await SagaAdmin(redis, app, clock=clock).inspect("f", context="compose")
    assert found.status == "completed"
    assert [b.key for b in found.branches] == ["book#0", "book#1", "book#2", "item#0", "item#1"]
    assert msgspec.json.decode(bytes(found.branches[3].output)) == {"type": "Worked", "piece": "item-a"}


def test_saga_inspect_prints_the_branches_and_the_groups_progress(capsys: pytest.CaptureFixture[str]) -> None:
    from redsaga.cli._show import inspection

    runner = running_fan()
    found = build_inspection(
        runner.state("f"),
        runner.history("f"),
        [],
        [],
        now_ms=runner.now_ms,
        shape=shape_of(fan),
        full_history=False,
    )
    inspection(found, history=False)
    out = capsys.readouterr().out
    assert "branches" in out
    assert "0/5 branches succeeded, 3 in flight" in out  # the map's line in the steps table
    lines = [line for line in out.splitlines() if line.startswith("item#")]
    assert [line.split()[:3] for line in lines] == [["item#0", "item", "dispatched"]] + [
        [f"item#{i}", "item", "dispatched"] for i in (1, 2)
    ]


@pytest.mark.anyio
async def test_the_admin_client_force_completes_one_branch_of_a_dead_lettered_group(redis: bus.Redis) -> None:
    app = App("compose", sagas=DEFINITIONS)
    clock = FakeClock()
    client = SagaClient(redis, app.registry, clock=clock)

    async def cancel(_saga_id: str) -> None:
        return None

    orchestrator = SagaWorker(redis, app, clock=clock)
    worker = SagaWorker(redis, App("w", participants=[Services(cancel).build()]), clock=clock)

    async def settle() -> None:
        for _ in range(30):
            await worker.run_until_idle()
            await orchestrator.run_until_idle()
            due = await redis.zrange("rs:{compose:0}:timers", 0, 0, withscores=True)
            if due:
                clock.set(max(int(due[0][1]), clock.now_ms()))

    await client.start(fan, Plan(id="p", items=["a"], flaky={"hotel": 9}), saga_id="f")
    await settle()
    assert (await client.get("f", context="compose")).status == "dead_lettered"
    admin = SagaAdmin(redis, app, clock=clock, wait_s=0)
    hotel = {"type": "Worked", "piece": "hotel"}
    with pytest.raises(ActionRefused, match="force-complete a branch"):
        await admin.force_complete("f", "book", hotel, reason="by hand", context="compose")
    await admin.force_complete("f", "book#1", hotel, reason="booked by phone", context="compose")
    await settle()
    state = await client.get("f", context="compose")
    assert state.status == "completed"
    assert state.branches["book#1"].attempts[-1].outcome == "forced"
