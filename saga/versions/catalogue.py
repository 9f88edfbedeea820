"""What operations need to know about the definitions, without their code: a catalogue.

An operator on call has a Redis URL, not the services' code. Everything reading sagas needs
is in Redis already: the contexts (``rs:{redsaga}:contexts``), each context's registered
definition shapes (``rs:{<context>}:versions:shapes``, which carry its partition count) and
the participants its workers run (``rs:{<context>}:versions:participant-names`` and each
one's record). Workers write them when they start (``saga/versions/registry.py``);
:meth:`Catalogue.load` reads them back.

A :class:`Catalogue` answers what :class:`~saga.SagaAdmin` asks of a registry when it only
reads or sends an operator request: which contexts and partitions to look in, a version's
steps in order with their kinds and compensations, a step's output schema, which command
streams to report. What needs the code -- starting a saga (typed data), replay and redrive
(the decider runs the builders), dry runs -- needs a :class:`~saga.Registry` (an ``App``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from saga.definition.registry import Registry
from saga.definition.saga import Context
from saga.definition.shape import Shape, shape_of
from saga.errors import UnknownDefinition
from saga.versions.registry import Versions


class Catalogue:
    """Contexts with their partition counts, definition shapes and participants.

    Build one from code (:meth:`of`) or read one from Redis (:meth:`load`); :meth:`merge`
    puts both together (the code's shapes win for the versions it defines).
    """

    def __init__(
        self,
        contexts: Iterable[Context],
        shapes: Iterable[Shape] = (),
        participants: Mapping[str, Sequence[str]] | None = None,
    ) -> None:
        self.contexts: dict[str, Context] = {c.name: c for c in contexts}
        self._shapes: dict[tuple[str, int], Shape] = {(s.name, s.version): s for s in shapes}
        self._participants = {k: sorted(set(v)) for k, v in (participants or {}).items()}

    @classmethod
    def of(cls, registry: Registry, participants: Mapping[str, Sequence[str]] | None = None) -> Catalogue:
        """The catalogue of ``registry``'s definitions (``participants``: context -> names)."""
        return cls(registry.contexts.values(), [shape_of(d) for d in registry], participants)

    @classmethod
    async def load(cls, redis: Any, *, contexts: Iterable[str] | None = None) -> Catalogue:
        """Read the catalogue from Redis: every registered context (or only ``contexts``)."""
        versions = Versions(redis)
        names = list(contexts) if contexts is not None else await versions.contexts()
        found: list[Context] = []
        shapes: list[Shape] = []
        participants: dict[str, list[str]] = {}
        for name in names:
            registered = list((await versions.shapes(name)).values())
            partitions = max((s.partitions for s in registered), default=1)
            found.append(Context(name, partitions=partitions))
            shapes += registered
            participants[name] = await versions.participants(name)
        return cls(found, shapes, participants)

    def merge(self, other: Catalogue) -> Catalogue:
        """This catalogue with ``other``'s contexts, shapes and participants added (ours win)."""
        return Catalogue(
            [*self.contexts.values(), *(c for n, c in other.contexts.items() if n not in self.contexts)],
            [*other._shapes.values(), *self._shapes.values()],
            {n: [*other.participants(n), *self.participants(n)] for n in {*self.contexts, *other.contexts}},
        )

    def __iter__(self) -> Any:
        return iter(self._shapes.values())

    def context(self, name: str | None) -> Context:
        """The context ``name``, or the only one when ``name`` is ``None``."""
        if name is None:
            if len(self.contexts) != 1:
                raise UnknownDefinition(
                    f"name a context: the known ones are {', '.join(sorted(self.contexts))}"
                )
            return next(iter(self.contexts.values()))
        try:
            return self.contexts[name]
        except KeyError:
            raise UnknownDefinition(
                f"no context {name!r} (known: {', '.join(sorted(self.contexts)) or 'none'})"
            ) from None

    def shape(self, name: str, version: int) -> Shape:
        """The shape of ``name@version`` (:class:`UnknownDefinition` when none is registered)."""
        try:
            return self._shapes[(name, version)]
        except KeyError:
            raise UnknownDefinition(f"no definition {name}@{version} is registered") from None

    def shape_or_none(self, name: str, version: int) -> Shape | None:
        """The shape of ``name@version``, or ``None``."""
        return self._shapes.get((name, version))

    def names(self) -> list[str]:
        """Every definition name, sorted."""
        return sorted({name for name, _ in self._shapes})

    def participants(self, context: str) -> list[str]:
        """The participants consuming ``context``'s command streams, sorted."""
        return self._participants.get(context, [])
