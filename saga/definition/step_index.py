"""A definition's steps by name, so a decision finds a step without walking the list.

The decider asks its definition for steps by name many times per saga (each reply, timer
and dispatch names its step), and whether any step waits for a signal once per decision.
Both are worked out again only when the definition's step list has grown (steps are
declared by appending), and a name not found is looked for once more in a fresh index, so
a branch declared after its group was indexed is still found.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from saga.definition.step import Step


class StepIndex:
    """The steps of one definition (``steps``) and its groups' branches, by name."""

    __slots__ = ("_branch_steps", "_by_name", "_indexed", "_signals", "_steps")

    def __init__(self, steps: list[Step[Any, Any]], branch_steps: Callable[[], list[Step[Any, Any]]]) -> None:
        self._steps = steps
        self._branch_steps = branch_steps
        self._by_name: dict[str, Step[Any, Any]] = {}
        self._signals = False
        self._indexed = -1

    def find(self, name: str) -> Step[Any, Any] | None:
        """The step called ``name`` (a step of its own first, then a branch), or ``None``."""
        if self._indexed != len(self._steps):
            self._rebuild()
        step = self._by_name.get(name)
        if step is None:
            self._rebuild()
            step = self._by_name.get(name)
        return step

    @property
    def takes_signals(self) -> bool:
        """Whether any step of the definition itself waits for a signal."""
        if self._indexed != len(self._steps):
            self._rebuild()
        return self._signals

    def _rebuild(self) -> None:
        by_name: dict[str, Step[Any, Any]] = {}
        for step in (*self._steps, *self._branch_steps()):
            by_name.setdefault(step.name, step)
        self._by_name = by_name
        self._signals = any(step.kind == "signal" for step in self._steps)
        self._indexed = len(self._steps)
