"""``saga graph``: a definition's steps and compensations, or the lifecycles, as diagrams."""

from __future__ import annotations

from typing import Annotated, Literal

import typer

from redsaga.cli._load import load_object
from saga import Saga
from saga.ops.graph import definition_graph, lifecycle_graph, lifecycle_table


def graph(
    target: Annotated[
        str,
        typer.Argument(help="A saga definition as module:attribute, or 'lifecycle' / 'step-lifecycle'."),
    ],
    fmt: Annotated[
        Literal["mermaid", "dot", "table"],
        typer.Option("--format", help="mermaid, dot, or (lifecycles only) a Markdown table."),
    ] = "mermaid",
) -> None:
    """Print a saga definition (steps, compensations, failure path) or a lifecycle as a diagram."""
    if target in ("lifecycle", "step-lifecycle"):
        kind: Literal["saga", "step"] = "saga" if target == "lifecycle" else "step"
        typer.echo(lifecycle_table(kind) if fmt == "table" else lifecycle_graph(kind, fmt))
        return
    if fmt == "table":
        raise typer.BadParameter("--format table is for lifecycles; use mermaid or dot for a definition")
    definition = load_object(target)
    if not isinstance(definition, Saga):
        raise typer.BadParameter(f"{target} is a {type(definition).__name__}, not a Saga")
    typer.echo(definition_graph(definition, fmt))
