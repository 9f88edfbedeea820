"""The definitions an app, a worker or a client knows, by name and version."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from saga.definition.lineage import Lineage
from saga.definition.rate import Limits, RateLimit
from saga.definition.saga import Context, Saga
from saga.errors import DefinitionError, UnknownDefinition


class Registry:
    """Validated saga definitions, several versions of one name side by side.

    ``limits`` are the rate limits on the commands these sagas send (every process that
    decides for them applies them: orchestrators, and clients that start sagas themselves).
    """

    def __init__(self, sagas: Iterable[Saga[Any]], *, limits: Iterable[RateLimit] = ()) -> None:
        self.limits = Limits(limits)
        self._by_key: dict[tuple[str, int], Saga[Any]] = {}
        self.contexts: dict[str, Context] = {}
        for definition in sagas:
            definition.validate()
            key = (definition.name, definition.version)
            if key in self._by_key and self._by_key[key] is not definition:
                raise DefinitionError(f"two definitions of {definition.key}", saga=definition.name)
            known = self.contexts.setdefault(definition.context.name, definition.context)
            if known != definition.context:
                raise DefinitionError(
                    f"context {known.name!r} is declared with {known.partitions} and "
                    f"{definition.context.partitions} partitions",
                    saga=definition.name,
                )
            self._by_key[key] = definition
        self.lineage = Lineage(self._by_key.values())
        """Which definitions each context's sagas run as children (who may start what)."""

    def __iter__(self) -> Any:
        return iter(self._by_key.values())

    def __len__(self) -> int:
        return len(self._by_key)

    def get(self, name: str, version: int) -> Saga[Any]:
        """The definition ``name@version`` (:class:`UnknownDefinition` if not registered)."""
        try:
            return self._by_key[(name, version)]
        except KeyError:
            raise UnknownDefinition(f"no definition {name}@{version} is registered here") from None

    def latest(self, name: str) -> Saga[Any]:
        """The newest registered version of ``name``."""
        versions = [d for (n, _), d in self._by_key.items() if n == name]
        if not versions:
            raise UnknownDefinition(f"no definition named {name!r} is registered here")
        return max(versions, key=lambda d: d.version)

    def child_contexts(self, context: str) -> frozenset[str]:
        """The other contexts the child steps of ``context``'s sagas run in.

        Worked out once per context (the registry does not change): every signed entry's
        check asks (``saga.store.trust.authorize``).
        """
        return self.lineage.child_contexts(context)

    def context(self, name: str | None) -> Context:
        """The context ``name``, or the only one when ``name`` is ``None``."""
        if name is None:
            if len(self.contexts) != 1:
                raise UnknownDefinition(
                    f"name a context: this registry has {', '.join(sorted(self.contexts))}"
                )
            return next(iter(self.contexts.values()))
        try:
            return self.contexts[name]
        except KeyError:
            raise UnknownDefinition(
                f"no context {name!r} here (known: {', '.join(sorted(self.contexts)) or 'none'})"
            ) from None
