"""A bounded context: the name and the partitions a saga's state lives under."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from saga.definition.step import NAME
from saga.errors import DefinitionError


@dataclass(frozen=True, slots=True)
class Context:
    """A bounded context: its name and how many partitions its sagas are spread over.

    Every saga of the context lives in partition ``crc32(saga_id) % partitions``; all keys of
    one partition share a hash tag, so transitions stay single-slot on Redis Cluster.
    """

    name: str
    partitions: int = 1

    def __post_init__(self) -> None:
        if not is_context_name(self.name):
            raise DefinitionError(f"invalid context name {self.name!r}")
        if not 1 <= self.partitions <= 1024:
            raise DefinitionError(f"context {self.name!r}: partitions must be between 1 and 1024")


def parent_contexts(parents: Iterable[str] | None, context: Context, saga: str) -> tuple[str, ...] | None:
    """A definition's ``parents=`` checked: the other contexts that may start it as a child.

    ``None`` (undeclared) stays ``None``; ``()`` declares that no other context may.
    """
    if parents is None:
        return None
    if isinstance(parents, str):
        raise DefinitionError(f"parents must be context names, not one string ({parents!r})", saga=saga)
    found = list(parents)
    for name in found:
        if not isinstance(name, str) or not is_context_name(name):
            raise DefinitionError(f"invalid parent context name {name!r}", saga=saga)
        if name == context.name:
            raise DefinitionError(
                f"parents names {name!r}, this saga's own context (its orchestrator may start it anyway)",
                saga=saga,
            )
    return tuple(sorted(set(found)))


def is_context_name(name: str) -> bool:
    """Whether ``name`` may name a context (the step-name alphabet, no ``:``)."""
    return bool(NAME.fullmatch(name)) and ":" not in name
