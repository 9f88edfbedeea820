"""Which sagas each context runs as children, and which contexts may start a definition as one.

Another context's orchestrator may start and cancel sagas of a context only as children its
own sagas run (``saga/store/trust.py``). A worker knows that from two records, neither of
which the parent's credentials can rewrite, and either is enough:

- the child steps of the parent context's definitions, when this worker's registry holds
  them (one app serving both contexts): each child step (in groups, branches and maps too)
  names the definition it runs, matched by context and name, any version;
- the ``parents=`` a child definition declares (``Saga(..., parents=("orders",))``), which
  is all a worker has when the parent's code is deployed elsewhere.

When neither is known (the parent's definitions are not here and the definition declares no
parents) the start is accepted as before this rule existed, so separate deployments keep
working on an upgrade; the orchestrator says so once per parent and definition.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from saga.definition.saga import Saga


class Lineage:
    """What a registry's definitions say about parents and children, worked out once per context."""

    def __init__(self, definitions: Iterable[Saga[Any]]) -> None:
        self._definitions = list(definitions)
        self._contexts = frozenset(d.context.name for d in self._definitions)
        self._children: dict[str, frozenset[tuple[str, str]]] = {}
        self._child_contexts: dict[str, frozenset[str]] = {}
        self._unchecked: set[tuple[str, str]] = set()

    def children_of(self, context: str) -> frozenset[tuple[str, str]]:
        """``(context, name)`` of every definition the child steps of ``context``'s sagas run."""
        found = self._children.get(context)
        if found is None:
            found = self._children[context] = frozenset(
                (step.child.definition.context.name, step.child.definition.name)
                for parent in self._definitions
                if parent.context.name == context
                for step in [*parent.steps, *parent.branch_steps()]
                if step.child is not None
            )
        return found

    def child_contexts(self, context: str) -> frozenset[str]:
        """The other contexts the child steps of ``context``'s sagas run in."""
        found = self._child_contexts.get(context)
        if found is None:
            found = self._child_contexts[context] = frozenset(
                child for child, _ in self.children_of(context) if child != context
            )
        return found

    def may_start(self, parent: str, definition: Saga[Any]) -> bool | None:
        """Whether context ``parent``'s sagas may start (and cancel) ``definition`` as a child.

        ``True`` when a registered definition of ``parent`` runs it in a child step, or it
        declares ``parent`` among its ``parents``; ``False`` when this registry holds
        ``parent``'s definitions or ``definition`` declares its parents, and neither names
        the other; ``None`` when nothing here knows (no definition of ``parent`` registered,
        no ``parents=`` declared).
        """
        declared = definition.parents
        if declared is not None and parent in declared:
            return True
        if parent in self._contexts:
            return (definition.context.name, definition.name) in self.children_of(parent)
        return None if declared is None else False

    def refusal(self, parent: str, definition: Saga[Any]) -> str:
        """Why ``parent`` may not start ``definition`` (when :meth:`may_start` is ``False``)."""
        known = []
        if parent in self._contexts:
            known.append(f"no child step of context {parent}'s definitions runs {definition.name}")
        if definition.parents is not None:
            known.append(f"it declares parents={definition.parents!r}")
        return f"saga {definition.key} is not a child of context {parent} ({'; '.join(known)})"

    def first_unchecked(self, parent: str, definition: Saga[Any]) -> bool:
        """Whether this is the first start by ``parent`` of ``definition`` accepted unchecked.

        The caller logs it then: once per parent and definition, for this registry's life.
        """
        key = (parent, definition.key)
        if key in self._unchecked:
            return False
        self._unchecked.add(key)
        return True
