"""Diagrams generated from code: a definition's steps and the lifecycle tables.

``saga graph`` prints these; the docs' state tables come from the same tables, so the
pictures cannot drift from what the engine enforces.
"""

from __future__ import annotations

from typing import Any, Literal

from saga._definition import Saga, Step
from saga._states import SAGA_TRANSITIONS, STEP_TRANSITIONS
from saga._wait_steps import EventWait

Format = Literal["mermaid", "dot"]


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
    nodes: list[tuple[str, str, str]] = [("start", "start", "circle")]
    edges: list[tuple[str, str, str, bool]] = []
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
    return _render(f"{definition.key}", nodes, edges, fmt)


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
    title: str, nodes: list[tuple[str, str, str]], edges: list[tuple[str, str, str, bool]], fmt: Format
) -> str:
    if fmt == "mermaid":
        shapes = {"circle": "(({}))", "box": '["{}"]', "undo": '[/"{}"/]', "end": "(({}))"}
        lines = ["flowchart LR", f"    %% {title}"]
        for node, label, shape in nodes:
            lines.append(f"    {node}{shapes[shape].format(label.replace(chr(92) + 'n', '<br/>'))}")
        for source, target, label, dashed in edges:
            arrow = "-.->" if dashed else "-->"
            lines.append(f"    {source} {arrow}{'|' + label + '|' if label else ''} {target}")
        return "\n".join(lines)
    shapes = {"circle": "circle", "box": "box", "undo": "parallelogram", "end": "doublecircle"}
    lines = [f'digraph "{title}" {{', "  rankdir=LR;"]
    for node, label, shape in nodes:
        lines.append(f'  "{node}" [label="{label}", shape={shapes[shape]}];')
    for source, target, label, dashed in edges:
        style = ", style=dashed" if dashed else ""
        lines.append(f'  "{source}" -> "{target}" [label="{label}"{style}];')
    lines.append("}")
    return "\n".join(lines)
