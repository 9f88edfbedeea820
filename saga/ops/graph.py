"""Diagrams generated from code: a definition's steps and the lifecycle tables.

``saga graph`` prints these; the docs' state tables come from the same tables, so the
pictures cannot drift from what the engine enforces. ``saga inspect --graph`` draws one
saga's path over its definition's diagram (:func:`path_graph`): steps coloured by status,
the edges it took drawn thick.

A ``parallel`` or ``first_of`` group is drawn as a box (a Mermaid subgraph, a DOT cluster)
around its branches, with one node for undoing its completed branches, newest first; a map
is one node (it runs its branch step once per item); a child step names the saga it runs;
a TCC step's confirmation is drawn between the last step and ``completed``.
"""

from __future__ import annotations

from typing import Any, Literal

from saga.core.model import SagaState
from saga.core.states import SAGA_TRANSITIONS, STEP_TRANSITIONS, SagaStatus, StepStatus
from saga.definition.saga import Saga, Step
from saga.definition.waits import EventWait
from saga.ops.text import printable

Format = Literal["mermaid", "dot"]


Node = tuple[str, str, str]
Edge = tuple[str, str, str, bool]
Cluster = tuple[str, str, list[str]]
"""A box around nodes: its id, its label and the ids of the nodes inside."""

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
    StepStatus.CONFIRMING: "done",
    StepStatus.CONFIRM_RETRYING: "done",
    StepStatus.CONFIRMED: "done",
    StepStatus.CONFIRM_FAILED: "done",
}
_CONFIRM_STYLE = {
    StepStatus.CONFIRMING: "active",
    StepStatus.CONFIRM_RETRYING: "active",
    StepStatus.CONFIRMED: "done",
    StepStatus.CONFIRM_FAILED: "failed",
}
_UNDO_STYLE = {
    StepStatus.COMPENSATING: "active",
    StepStatus.COMPENSATION_RETRYING: "active",
    StepStatus.COMPENSATED: "done",
    StepStatus.COMPENSATION_FAILED: "failed",
}


def _what(step: Step[Any, Any]) -> str:  # noqa: PLR0911 - one line per kind of step
    """A step's second label line: what it sends, runs or waits for."""
    if step.local:
        return "local action"
    if isinstance(step.wait, EventWait):
        return f"waits for {step.wait.message_type} on {step.wait.stream.key}"
    if step.kind == "sleep":
        return "sleeps"
    if step.kind == "signal":
        return f"waits for a signal ({_type_name(step.output_type)})"
    if step.child is not None:
        return f"child saga {step.child.definition.key}"
    if step.group is not None and step.group.dynamic:
        branch = step.group.branches[0]
        at_once = f", {step.group.concurrency} at a time" if step.group.concurrency else ""
        return f"map: one per item (at most {step.group.limit}{at_once}); {_what(branch)}"
    if step.tcc is not None:
        return f"try: reply {_type_name(step.output_type)}; expires after {step.tcc.expires_s:g}s"
    return f"reply {_type_name(step.output_type)}"


def _type_name(output_type: Any) -> str:
    return getattr(output_type, "__name__", None) or (str(output_type) if output_type else "-")


def _node_id(step: Step[Any, Any]) -> str:
    """A node id for a step (a branch's is ``<group>__<branch>``: ids allow no ``#``)."""
    return f"{step.within}__{step.name}" if step.within else step.name


def definition_graph(definition: Saga[Any], fmt: Format = "mermaid") -> str:
    """The steps in order, each step's compensation, and the failure path through them."""
    nodes, edges, clusters = _definition_shape(definition)
    return _render(f"{definition.key}", nodes, edges, fmt, clusters=clusters)


def path_graph(definition: Saga[Any], state: SagaState, fmt: Format = "mermaid") -> str:
    """:func:`definition_graph` with one saga's path drawn over it.

    Steps (and branches) are coloured by status (done, in progress, failed, undone),
    compensations by theirs, the end the saga reached is marked, and the edges it took are
    drawn thick.
    """
    nodes, edges, clusters = _definition_shape(definition)
    styles: dict[str, str] = {}
    reached: set[str] = {"start"}
    for step in definition.steps:
        step_state = state.steps.get(step.name)
        if step_state is None or not (step_state.attempts or step_state.group):
            continue
        node = step.name
        reached.add(node)
        styles[node] = _STEP_STYLE.get(step_state.status, "active")
        if step_state.count("undo"):
            reached.add(f"undo_{step.name}")
            styles[f"undo_{step.name}"] = _UNDO_STYLE.get(step_state.status, "done")
        if step_state.status in (StepStatus.CONFIRMING, StepStatus.CONFIRMED, StepStatus.CONFIRM_FAILED):
            reached.add(f"confirm_{step.name}")
            styles[f"confirm_{step.name}"] = _CONFIRM_STYLE.get(step_state.status, "active")
        if step.group is not None and not step.group.dynamic:
            _style_branches(step, state, styles, reached)
    end = {
        SagaStatus.COMPLETED: "completed",
        SagaStatus.COMPENSATED: "compensated",
        SagaStatus.CANCELLED: "compensated",
    }.get(state.status)
    if end is not None:
        reached.add(end)
        styles[end] = "done"
    taken = {i for i, (source, target, _, _) in enumerate(edges) if source in reached and target in reached}
    title = f"{definition.key} saga {printable(state.id)}: {state.status}"  # one line, whatever the id holds
    return _render(title, nodes, edges, fmt, styles=styles, taken=taken, clusters=clusters)


def _style_branches(
    step: Step[Any, Any], state: SagaState, styles: dict[str, str], reached: set[str]
) -> None:
    assert step.group is not None  # noqa: S101 - group steps only
    undone = False
    for branch in step.group.branches:
        record = state.branches.get(f"{step.name}#{branch.position}")
        if record is None:
            continue
        node = _node_id(branch)
        reached.add(node)
        styles[node] = _STEP_STYLE.get(record.status, "active")
        undone = undone or bool(record.count("undo"))
    if undone:
        reached.add(f"undo_{step.name}")
        styles[f"undo_{step.name}"] = _UNDO_STYLE.get(state.steps[step.name].status, "done")


def _undoes(step: Step[Any, Any]) -> str | None:
    """The label of a step's undo node (``None``: nothing of it is ever undone)."""
    if step.group is None:
        return step.compensation.name if step.compensation else None
    names = [b.compensation.name for b in step.group.branches if b.compensation]
    if not names:
        return None
    if step.group.dynamic:
        return f"{names[0]} per completed item, newest first"
    return f"undo completed branches, newest first ({', '.join(names)})"


def _definition_shape(definition: Saga[Any]) -> tuple[list[Node], list[Edge], list[Cluster]]:
    nodes: list[Node] = [("start", "start", "circle")]
    edges: list[Edge] = []
    clusters: list[Cluster] = []
    previous = ["start"]
    for step in definition.steps:
        if step.group is not None and not step.group.dynamic:
            members = []
            for branch in step.group.branches:
                node = _node_id(branch)
                members.append(node)
                nodes.append((node, f"{branch.name}\\n{_what(branch)}", "box"))
                edges.extend((p, node, "", False) for p in previous)
            at_once = f", {step.group.concurrency} at a time" if step.group.concurrency else ""
            label = "all of" if step.group.mode == "all" else "first of"
            clusters.append((step.name, f"{step.name}: {label} {len(members)}{at_once}", members))
            previous = members
        else:
            nodes.append((step.name, f"{step.name}\\n{_what(step)}", "box"))
            edges.extend((p, step.name, "", False) for p in previous)
            previous = [step.name]
        undo_label = _undoes(step)
        if undo_label:
            undo = f"undo_{step.name}"
            nodes.append((undo, undo_label, "undo"))
            fixed = step.group is not None and not step.group.dynamic
            sources = (
                [_node_id(b) for b in (step.group.branches if step.group else []) if b.compensation]
                if fixed
                else [step.name]
            )
            edges.extend((source, undo, "compensate", True) for source in sources)
    for step in definition.steps:
        if step.tcc is not None:
            node = f"confirm_{step.name}"
            nodes.append((node, f"{step.tcc.confirm}\\nconfirm {step.name}", "undo"))
            edges.extend((p, node, "confirm", False) for p in previous)
            previous = [node]
    nodes.append(("completed", "completed", "end"))
    edges.extend((p, "completed", "", False) for p in previous)
    undone = [s for s in definition.steps if _undoes(s)]
    for later, earlier in zip(reversed(undone), list(reversed(undone))[1:], strict=False):
        edges.append((f"undo_{later.name}", f"undo_{earlier.name}", "then", True))
    if undone:
        nodes.append(("compensated", "compensated", "end"))
        edges.append((f"undo_{undone[0].name}", "compensated", "", True))
    return nodes, edges, clusters


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
    clusters: list[Cluster] | None = None,
) -> str:
    styles, taken, clusters = styles or {}, taken or set(), clusters or []
    inside = {member: cluster for cluster in clusters for member in cluster[2]}
    if fmt == "mermaid":
        shapes = {"circle": "(({}))", "box": '["{}"]', "undo": '[/"{}"/]', "end": "(({}))"}
        lines = ["flowchart LR", f"    %% {title}"]

        def mermaid_node(node: str, label: str, shape: str, indent: str = "    ") -> str:
            return f"{indent}{node}{shapes[shape].format(label.replace(chr(92) + 'n', '<br/>'))}"

        for node, label, shape in nodes:
            if node not in inside:
                lines.append(mermaid_node(node, label, shape))
        for cluster_id, cluster_label, members in clusters:
            lines.append(f'    subgraph {cluster_id} ["{cluster_label}"]')
            lines.extend(mermaid_node(n, lb, sh, "        ") for n, lb, sh in nodes if n in members)
            lines.append("    end")
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

    def dot_node(node: str, label: str, shape: str) -> str:
        fill = f', style=filled, fillcolor="{_STYLES[styles[node]][1]}"' if node in styles else ""
        return f'"{node}" [label="{label}", shape={shapes[shape]}{fill}];'

    for node, label, shape in nodes:
        if node not in inside:
            lines.append(f"  {dot_node(node, label, shape)}")
    for cluster_id, cluster_label, members in clusters:
        lines.append(f'  subgraph "cluster_{cluster_id}" {{')
        lines.append(f'    label="{cluster_label}"; style=rounded;')
        lines.extend(f"    {dot_node(n, lb, sh)}" for n, lb, sh in nodes if n in members)
        lines.append("  }")
    for index, (source, target, label, dashed) in enumerate(edges):
        style = ", style=dashed" if dashed else ""
        width = ", penwidth=3" if index in taken else ""
        lines.append(f'  "{source}" -> "{target}" [label="{label}"{style}{width}];')
    lines.append("}")
    return "\n".join(lines)
