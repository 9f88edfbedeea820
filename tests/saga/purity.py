"""A decider wrapped so that a test fails when a decision changes the state it was given.

The decider's working copy shares the step and branch records it does not change with its
input (``saga/core/decider.py`` copies a record on its first change); a rule that changed a
record it only read would change the caller's state. Suites that drive many kinds of
decision (operator actions, waits, redrives) check every decision with :func:`check_purity`.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import msgspec
import pytest

import saga.testing.runner_sagas as runner_module
from saga import SagaState
from saga.core.decider import Decision, decide

_Decide = Callable[..., Decision]


def leaves_input_alone(real: _Decide, calls: list[int] | None = None) -> _Decide:
    """``real``, asserting that every call leaves the state it is given unchanged."""

    def checked(definition: Any, state: SagaState, event: Any, **kwargs: Any) -> Decision:
        before = msgspec.json.encode(state)
        decision = real(definition, state, event, **kwargs)
        assert msgspec.json.encode(state) == before, f"deciding {type(event).__name__} changed its input"
        if calls is not None:
            calls[0] += 1
        return decision

    return checked


def check_purity(monkeypatch: pytest.MonkeyPatch, module: str) -> None:
    """Check every decision of the test module ``module`` and of the in-process runner."""
    monkeypatch.setattr(runner_module, "decide", leaves_input_alone(decide))
    if hasattr(sys.modules[module], "decide"):
        monkeypatch.setattr(sys.modules[module], "decide", leaves_input_alone(decide))
