"""Diagrams generated from code: a definition's steps and the lifecycle tables.

``saga graph`` prints these; the docs' state tables come from the same tables, so the
pictures cannot drift from what the engine enforces. ``saga inspect --graph`` draws one
saga's path over its definition's diagram (:func:`path_graph`): steps coloured by status,
the edges it took drawn thick.
"""

from __future__ import annotations

from typing import Any, Literal

from saga._definition import Saga, Step
from saga._model import SagaState
from saga._states import SAGA_TRANSITIONS, STEP_TRANSITIONS, SagaStatus, StepStatus
from saga._wait_steps import EventWait

Format = Literal["mermaid", "dot"]


Node = tuple[str, str, str]
Edge = tuple[str, str, str, bool]

_STYLES: dict[str, tuple[str, str]] = {
    # class: (mermaid classDef, DOT fill colour)
    "done": ("fill:#d4edda,stroke:#28a745", "#d4edda"),
    "active": ("fill:#fff3cd,stroke:#e0a800,stroke-width:3px", "#fff3cd"),
    "failed": ("fill:#f8d7da,stroke:#dc3545,stroke-width:3px", "#f8d7da"),
    "undone": ("fill:#e2e3e5,stroke:#6c757d", "#e2e3e5"),
}
_STEP_STYLE = {
    StepStatus.SCHEDULED: "active",
    StepStatus.DISPATCHED: "active",
    StepStatus.RETRYING: "active",
    StepStatus.WAITING: "active",
    StepStatus.SUCCEEDED: "done",
    StepStatus.FAILED: "failed",
    StepStatus.COMPENSATING: "done",
    StepStatus.COMPENSATION_RETRYING: "done",
    StepStatus.COMPENSATED: "undone",
    StepStatus.COMPENSATION_FAILED: "done",
}
_UNDO_STYLE = {
    StepStatus.COMPENSATING: "active",
    StepStatus.COMPENSATION_RETRYING: "active",
    StepStatus.COMPENSATED: "done",
    StepStatus.COMPENSATION_FAILED: "failed",
}


def _what(step: Step[Any, Any]) -> str:
    """A step's second label line: what it sends, runs or waits for."""
    if step.local:
        return "local action"
    if isinstance(step.wait, EventWait):
        return f"waits for {step.wait.message_type} on {step.wait.stream.key}"
    if step.kind == "sleep":
        return "sleeps"
    if step.kind == "signal":
        return f"waits for a signal ({step.output_type.__name__ if step.output_type else '-'})"
    return f"reply {step.output_type.__name__ if step.output_type else '-'}"


def definition_graph(definition: Saga[Any], fmt: Format = "mermaid") -> str:
    """The steps in order, each step's compensation, and the failure path through them."""
    nodes, edges = _definition_shape(definition)
    return _render(f"{definition.key}", nodes, edges, fmt)


def path_graph(definition: Saga[Any], state: SagaState, fmt: Format = "mermaid") -> str:
    """:func:`definition_graph` with one saga's path drawn over it.

    Steps are coloured by status (done, in progress, failed, undone), compensations by
    theirs, the end the saga reached is marked, and the edges it took are drawn thick.
    """
    nodes, edges = _definition_shape(definition)
    styles: dict[str, str] = {}
    reached: set[str] = {"start"}
    for step in definition.steps:
        step_state = state.steps.get(step.name)
        if step_state is None or not step_state.attempts:
            continue
        reached.add(step.name)
        styles[step.name] = _STEP_STYLE.get(step_state.status, "active")
        if step_state.count("undo"):
            reached.add(f"undo_{step.name}")
            styles[f"undo_{step.name}"] = _UNDO_STYLE.get(step_state.status, "done")
    end = {SagaStatus.COMPLETED: "completed", SagaStatus.COMPENSATED: "compensated"}.get(state.status)
    if end is not None:
        reached.add(end)
        styles[end] = "done"
    taken = {i for i, (source, target, _, _) in enumerate(edges) if source in reached and target in reached}
    title = f"{definition.key} saga {state.id}: {state.status}"
    return _render(title, nodes, edges, fmt, styles=styles, taken=taken)


def _definition_shape(definition: Saga[Any]) -> tuple[list[Node], list[Edge]]:
    nodes: list[Node] = [("start", "start", "circle")]
    edges: list[Edge] = []
    previous = "start"
    for step in definition.steps:
        target = _what(step)
        nodes.append((step.name, f"{step.name}\\n{target}", "box"))
        edges.append((previous, step.name, "", False))
        previous = step.name
        if step.compensation:
            undo = f"undo_{step.name}"
            nodes.append((undo, f"{step.compensation.name}", "undo"))
            edges.append((step.name, undo, "compensate", True))
    nodes.append(("completed", "completed", "end"))
    edges.append((previous, "completed", "", False))
    undone = [s for s in definition.steps if s.compensation]
    for later, earlier in zip(reversed(undone), list(reversed(undone))[1:], strict=False):
        edges.append((f"undo_{later.name}", f"undo_{earlier.name}", "then", True))
    if undone:
        nodes.append(("compensated", "compensated", "end"))
        edges.append((f"undo_{undone[0].name}", "compensated", "", True))
    return nodes, edges


def lifecycle_graph(kind: Literal["saga", "step"] = "saga", fmt: Format = "mermaid") -> str:
    """The saga (or step) lifecycle: every state and every allowed transition."""
    table: dict[Any, dict[Any, str]] = SAGA_TRANSITIONS if kind == "saga" else STEP_TRANSITIONS
    if fmt == "mermaid":
        lines = ["stateDiagram-v2"]
        first = next(iter(table))
        lines.append(f"    [*] --> {first.value}")
        for source, targets in table.items():
            for target, why in targets.items():
                lines.append(f"    {source.value} --> {target.value}: {why}")
            if not targets:
                lines.append(f"    {source.value} --> [*]")
        return "\n".join(lines)
    lines = [f'digraph "{kind} lifecycle" {{', "  rankdir=LR;"]
    for source, targets in table.items():
        for target, why in targets.items():
            lines.append(f'  "{source.value}" -> "{target.value}" [label="{why}"];')
    lines.append("}")
    return "\n".join(lines)


def lifecycle_table(kind: Literal["saga", "step"] = "saga") -> str:
    """The lifecycle as a Markdown table (from, to, when): what ``docs/concepts.md`` shows."""
    table: dict[Any, dict[Any, str]] = SAGA_TRANSITIONS if kind == "saga" else STEP_TRANSITIONS
    lines = ["| from | to | when |", "| --- | --- | --- |"]
    for source, targets in table.items():
        for target, why in targets.items():
            lines.append(f"| `{source.value}` | `{target.value}` | {why} |")
    return "\n".join(lines)


def _render(
    title: str,
    nodes: list[Node],
    edges: list[Edge],
    fmt: Format,
    *,
    styles: dict[str, str] | None = None,
    taken: set[int] | None = None,
) -> str:
    styles, taken = styles or {}, taken or set()
    if fmt == "mermaid":
        shapes = {"circle": "(({}))", "box": '["{}"]', "undo": '[/"{}"/]', "end": "(({}))"}
        lines = ["flowchart LR", f"    %% {title}"]
        for node, label, shape in nodes:
            lines.append(f"    {node}{shapes[shape].format(label.replace(chr(92) + 'n', '<br/>'))}")
        for source, target, label, dashed in edges:
            arrow = "-.->" if dashed else "-->"
            lines.append(f"    {source} {arrow}{'|' + label + '|' if label else ''} {target}")
        for name in sorted(set(styles.values())):
            lines.append(f"    classDef {name} {_STYLES[name][0]}")
            lines.append(f"    class {','.join(n for n, c in styles.items() if c == name)} {name}")
        if taken:
            lines.append(f"    linkStyle {','.join(map(str, sorted(taken)))} stroke-width:3px")
        return "\n".join(lines)
    shapes = {"circle": "circle", "box": "box", "undo": "parallelogram", "end": "doublecircle"}
    lines = [f'digraph "{title}" {{', "  rankdir=LR;"]
    for node, label, shape in nodes:
        fill = f', style=filled, fillcolor="{_STYLES[styles[node]][1]}"' if node in styles else ""
        lines.append(f'  "{node}" [label="{label}", shape={shapes[shape]}{fill}];')
    for index, (source, target, label, dashed) in enumerate(edges):
        style = ", style=dashed" if dashed else ""
        width = ", penwidth=3" if index in taken else ""
        lines.append(f'  "{source}" -> "{target}" [label="{label}"{style}{width}];')
    lines.append("}")
    return "\n".join(lines)
