"""Diagrams without the code: a registered shape draws the same graph as the definition."""

from __future__ import annotations

from typing import Any

import pytest

from redsaga.examples.orders import order_fulfilment
from saga import Saga
from saga.definition.shape import shape_of
from saga.ops.graph import definition_graph, path_graph
from tests.saga.compose_sagas import DEFINITIONS, fan
from tests.saga.task_sagas import refund
from tests.saga.test_compose_views import running_fan
from tests.saga.test_operator_decisions import dead_lettered_at_shipping


def _wiring(mermaid: str) -> list[str]:
    """The diagram less its labels: node ids, boxes, edges and styles (what the path is drawn on)."""
    return [
        line.split("[")[0].split("((")[0].rstrip()
        for line in mermaid.splitlines()
        if not line.strip().startswith("%%")
    ]


@pytest.mark.parametrize("definition", [order_fulfilment, *DEFINITIONS], ids=lambda d: d.key)
def test_a_shape_draws_the_definitions_nodes_and_edges(definition: Saga[Any]) -> None:
    shape = shape_of(definition)
    assert _wiring(definition_graph(shape)) == _wiring(definition_graph(definition))
    assert _edges(definition_graph(shape, "dot")) == _edges(definition_graph(definition, "dot"))


def _edges(dot: str) -> list[str]:
    return [line for line in dot.splitlines() if " -> " in line]


def test_a_plain_definitions_graph_is_the_same_from_its_shape() -> None:
    assert definition_graph(shape_of(order_fulfilment)) == definition_graph(order_fulfilment)
    dead = dead_lettered_at_shipping()
    assert path_graph(shape_of(order_fulfilment), dead) == path_graph(order_fulfilment, dead)


def test_a_shape_leaves_out_only_what_the_code_knows() -> None:
    mermaid = definition_graph(shape_of(fan))
    assert 'subgraph book ["book: all of 3"]' in mermaid  # the code adds ", 2 at a time"
    assert "map: one per item; reply Worked" in mermaid
    assert "book__flight -.->|compensate| undo_book" in mermaid


def test_a_sagas_path_through_groups_is_drawn_from_the_shape() -> None:
    state = running_fan().state("f")
    assert _path(path_graph(shape_of(fan), state)) == _path(path_graph(fan, state))
    assert "    class item active" in _path(path_graph(shape_of(fan), state))


def _path(mermaid: str) -> list[str]:
    """The lines that draw a saga's path: node classes and thick edges."""
    return [line for line in mermaid.splitlines() if line.strip().startswith(("class ", "linkStyle"))]


def test_a_human_task_is_drawn_as_a_person_s_answer_from_code_and_from_its_shape() -> None:
    for drawn in (definition_graph(refund), definition_graph(shape_of(refund))):
        assert "approve.answer<br/>waits for a person's answer (Approval)" in drawn
        assert "saga.definition" not in drawn
