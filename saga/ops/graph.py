"""Diagrams generated from code: a definition's steps and the lifecycle tables.

``saga graph`` prints these; the docs' state tables come from the same tables, so the
pictures cannot drift from what the engine enforces. ``saga inspect --graph`` draws one
saga's path over its definition's diagram (:func:`path_graph`): steps coloured by status,
the edges it took drawn thick.

A ``parallel`` or ``first_of`` group is drawn as a box (a Mermaid subgraph, a DOT cluster)
around its branches, with one node for undoing its completed branches, newest first; a map
is one node (it runs its branch step once per item); a child step names the saga it runs;
a TCC step's confirmation is drawn between the last step and ``completed``.

Both draw from the definition's code or, without it, from its shape as registered in Redis
(``saga/definition/shape.py``): the same nodes and edges, with what only the code knows (a group's
concurrency, a map's limit, a reservation's lifetime) left out of the labels.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal, get_args, get_origin

from saga.core.model import SagaState
from saga.core.states import SAGA_TRANSITIONS, STEP_TRANSITIONS, SagaStatus, StepStatus
from saga.definition.human_tasks import TaskResult
from saga.definition.saga import Saga, Step
from saga.definition.shape import Shape, StepShape
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
_BOXES = {"parallel": "all of", "first_of": "first of"}
"""The kinds of the groups drawn as boxes, and their boxes' labels."""


def _what(step: Step[Any, Any]) -> str:  # noqa: PLR0911 - one line per kind of step
    """A step's second label line: what it sends, runs or waits for."""
    if step.local:
        return "local action"
    if isinstance(step.wait, EventWait):
        return f"waits for {step.wait.message_type} on {step.wait.stream.key}"
    if step.kind == "sleep":
        return "sleeps"
    if step.kind == "signal" and get_origin(step.output_type) is TaskResult:
        return f"waits for a person's answer ({_type_name(get_args(step.output_type)[0])})"
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
    """``Approval``, ``list[Line]``: a type as its code names it, without module paths."""
    origin = get_origin(output_type)
    if origin is not None:
        return f"{_type_name(origin)}[{', '.join(_type_name(a) for a in get_args(output_type))}]"
    return getattr(output_type, "__name__", None) or (str(output_type) if output_type else "-")


def _node_id(step: Step[Any, Any]) -> str:
    """A node id for a step (a branch's is ``<group>__<branch>``: ids allow no ``#``)."""
    return f"{step.within}__{step.name}" if step.within else step.name


@dataclass(frozen=True, slots=True)
class _Drawn:
    """One step (or branch) as the diagram draws it, read from code or from a shape.

    ``what`` is its label's second line, ``undo`` its undo node's label (``None``: nothing
    of it is undone), ``box`` the label of a fixed group's box around its ``branches``,
    ``confirm`` a TCC step's confirmation. A branch has the ``node`` id
    ``<group>__<name>`` and the state ``key`` ``<group>#<position>``.
    """

    name: str
    node: str
    key: str
    what: str
    undo: str | None
    branches: tuple[_Drawn, ...] | None = None
    box: str = ""
    confirm: str | None = None


def _drawn_step(step: Step[Any, Any]) -> _Drawn:
    group = step.group if step.group is not None and not step.group.dynamic else None
    box = ""
    if group is not None:
        at_once = f", {group.concurrency} at a time" if group.concurrency else ""
        box = f"{_BOXES[step.kind]} {len(group.branches)}{at_once}"
    return _Drawn(
        name=step.name,
        node=_node_id(step),
        key=f"{step.within}#{step.position}" if step.within else step.name,
        what=_what(step),
        undo=_undoes(step),
        branches=tuple(_drawn_step(b) for b in group.branches) if group is not None else None,
        box=box,
        confirm=step.tcc.confirm if step.tcc is not None else None,
    )


def _drawn_shape(step: StepShape, within: str = "", position: int = 0) -> _Drawn:
    """A step of a registered shape, drawn without the code (see the module docstring)."""
    fixed: list[tuple[int, StepShape]] = []
    if step.kind in _BOXES:  # branches keyed '<index>:<name>'
        fixed = sorted(((int(k.partition(":")[0]), b[0]) for k, b in step.branches.items()), key=_first)
    each = step.branches.get("each", ()) if step.kind == "map" else ()
    grouped = [b for _, b in fixed] or list(each)
    return _Drawn(
        name=step.name,
        node=f"{within}__{step.name}" if within else step.name,
        key=f"{within}#{position}" if within else step.name,
        what=_shape_what(step),
        undo=_undo_label(
            step.compensation.name if step.compensation else None,
            [b.compensation.name for b in grouped if b.compensation],
            grouped=bool(grouped),
            per_item=bool(each),
        ),
        branches=tuple(_drawn_shape(b, step.name, i) for i, b in fixed) if fixed else None,
        box=f"{_BOXES[step.kind]} {len(fixed)}" if fixed else "",
        confirm=next((w.removeprefix("confirm ") for w in step.waits if w.startswith("confirm ")), None),
    )


def _first(pair: tuple[int, StepShape]) -> int:
    return pair[0]


def _shape_what(step: StepShape) -> str:  # noqa: PLR0911 - one line per kind of step
    """:func:`_what` from a shape: the same words, less what only the code knows."""
    # a generic's registered name is its repr: drop the module paths (as _type_name does)
    output = re.sub(r"[\w.]+\.(\w+)", r"\1", step.output.name) if step.output else "-"
    waits = step.waits[0] if step.waits else ""
    if step.kind == "action":
        return "local action"
    if waits.startswith("event "):
        return f"waits for {waits.removeprefix('event ')}"
    if step.kind == "sleep":
        return "sleeps"
    if step.kind == "signal" and output.startswith(f"{TaskResult.__name__}["):
        return f"waits for a person's answer ({output.removeprefix(TaskResult.__name__)[1:-1]})"
    if step.kind == "signal":
        return f"waits for a signal ({output})"
    if waits.startswith("child "):
        return f"child saga {waits.removeprefix('child ')}"
    each = step.branches.get("each", ())
    if each:
        return f"map: one per item; {_shape_what(each[0])}"
    if step.kind == "tcc":
        return f"try: reply {output}"
    return f"reply {output}"


def _drawn(definition: Saga[Any] | Shape) -> list[_Drawn]:
    if isinstance(definition, Shape):
        return [_drawn_shape(step) for step in definition.steps]
    return [_drawn_step(step) for step in definition.steps]


def definition_graph(definition: Saga[Any] | Shape, fmt: Format = "mermaid") -> str:
    """The steps in order, each step's compensation, and the failure path through them.

    ``definition`` is the code, or the shape registered in Redis (no code needed).
    """
    nodes, edges, clusters = _definition_shape(_drawn(definition))
    return _render(f"{definition.key}", nodes, edges, fmt, clusters=clusters)


def path_graph(definition: Saga[Any] | Shape, state: SagaState, fmt: Format = "mermaid") -> str:
    """:func:`definition_graph` with one saga's path drawn over it.

    Steps (and branches) are coloured by status (done, in progress, failed, undone),
    compensations by theirs, the end the saga reached is marked, and the edges it took are
    drawn thick.
    """
    steps = _drawn(definition)
    nodes, edges, clusters = _definition_shape(steps)
    styles: dict[str, str] = {}
    reached: set[str] = {"start"}
    for step in steps:
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
        if step.branches is not None:
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


def _style_branches(step: _Drawn, state: SagaState, styles: dict[str, str], reached: set[str]) -> None:
    undone = False
    for branch in step.branches or ():
        record = state.branches.get(branch.key)
        if record is None:
            continue
        reached.add(branch.node)
        styles[branch.node] = _STEP_STYLE.get(record.status, "active")
        undone = undone or bool(record.count("undo"))
    if undone:
        reached.add(f"undo_{step.name}")
        styles[f"undo_{step.name}"] = _UNDO_STYLE.get(state.steps[step.name].status, "done")


def _undoes(step: Step[Any, Any]) -> str | None:
    """The label of a step's undo node (``None``: nothing of it is ever undone)."""
    branches = step.group.branches if step.group is not None else []
    return _undo_label(
        step.compensation.name if step.compensation else None,
        [b.compensation.name for b in branches if b.compensation],
        grouped=step.group is not None,
        per_item=step.group is not None and step.group.dynamic,
    )


def _undo_label(own: str | None, branches: list[str], *, grouped: bool, per_item: bool) -> str | None:
    """An undo node's label: the step's compensation, or what undoes a group's branches."""
    if not grouped:
        return own
    if not branches:
        return None
    if per_item:
        return f"{branches[0]} per completed item, newest first"
    return f"undo completed branches, newest first ({', '.join(branches)})"


def _definition_shape(steps: list[_Drawn]) -> tuple[list[Node], list[Edge], list[Cluster]]:
    nodes: list[Node] = [("start", "start", "circle")]
    edges: list[Edge] = []
    clusters: list[Cluster] = []
    previous = ["start"]
    for step in steps:
        if step.branches is not None:
            members = []
            for branch in step.branches:
                members.append(branch.node)
                nodes.append((branch.node, f"{branch.name}\\n{branch.what}", "box"))
                edges.extend((p, branch.node, "", False) for p in previous)
            clusters.append((step.name, f"{step.name}: {step.box}", members))
            previous = members
        else:
            nodes.append((step.name, f"{step.name}\\n{step.what}", "box"))
            edges.extend((p, step.name, "", False) for p in previous)
            previous = [step.name]
        if step.undo:
            undo = f"undo_{step.name}"
            nodes.append((undo, step.undo, "undo"))
            sources = [b.node for b in step.branches if b.undo] if step.branches is not None else [step.name]
            edges.extend((source, undo, "compensate", True) for source in sources)
    for step in steps:
        if step.confirm is not None:
            node = f"confirm_{step.name}"
            nodes.append((node, f"{step.confirm}\\nconfirm {step.name}", "undo"))
            edges.extend((p, node, "confirm", False) for p in previous)
            previous = [node]
    nodes.append(("completed", "completed", "end"))
    edges.extend((p, "completed", "", False) for p in previous)
    undone = [s for s in steps if s.undo]
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
