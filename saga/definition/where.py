"""Where in a definition a check runs: the saga and the step a :class:`DefinitionError` names."""

from __future__ import annotations

from dataclasses import dataclass

from saga.errors import DefinitionError


@dataclass(frozen=True, slots=True)
class Where:
    """The saga (and step, branch or compensation) being declared.

    The checks that run while a definition is declared take one, so that every error they
    raise names both, as fields and in its message.
    """

    saga: str
    step: str = ""

    def error(self, reason: str) -> DefinitionError:
        """The :class:`DefinitionError` for ``reason`` here (raise it)."""
        return DefinitionError(reason, saga=self.saga, step=self.step)

    def __str__(self) -> str:
        return f"{self.saga}.{self.step}" if self.step else self.saga
