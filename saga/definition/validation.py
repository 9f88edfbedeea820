"""Checking a whole saga definition, once every step and compensation is declared."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from saga.definition.where import Where
from saga.errors import DefinitionError

if TYPE_CHECKING:
    from saga.definition.saga import Saga


def validate_definition(definition: Saga[Any]) -> None:
    """Raise :class:`DefinitionError` when ``definition`` (and each child it runs) is incomplete.

    Every group has a branch, every ``compensate=`` and ``confirm=`` names a declared
    compensation, and every compensation undoes some step.
    """
    if not definition.steps:
        raise DefinitionError("has no steps", saga=definition.name)
    used = set()
    for step in [*definition.steps, *definition.branch_steps()]:
        where = Where(definition.name, step.name)
        if step.group is not None and not step.group.branches:
            raise where.error(f"a {step.kind} group needs at least one branch")
        if step.child is not None:
            step.child.definition.validate()
        names = [("compensate", step.compensate)] if step.compensate else []
        if step.tcc is not None:
            names.append(("confirm", step.tcc.confirm))
        for what, name in names:
            if name not in definition.compensations:
                raise where.error(
                    f"{what}={name!r} names no declared compensation "
                    f"(declared: {', '.join(sorted(definition.compensations)) or 'none'})"
                )
            used.add(name)
    unused = set(definition.compensations) - used
    if unused:
        raise DefinitionError(f"compensations {', '.join(sorted(unused))} undo no step", saga=definition.name)
