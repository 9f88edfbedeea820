"""The result of deciding one event (:func:`saga.core.decider.decide`). Pure."""

from __future__ import annotations

from dataclasses import dataclass, field

from saga.core.effects import Effect
from saga.core.model import SagaState


@dataclass(slots=True)
class Decision:
    """The result of deciding one event.

    ``touched`` names the branch records the decision may have changed (it copied them), so
    a commit writes those and looks at no other branch.
    """

    state: SagaState
    effects: list[Effect] = field(default_factory=list)
    ignored: str = ""
    touched: frozenset[str] = frozenset()

    @property
    def changed(self) -> bool:
        """Whether the state must be written (an ignored event is only recorded)."""
        return not self.ignored
