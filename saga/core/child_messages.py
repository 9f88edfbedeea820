"""What the decider sends to start and cancel child sagas, and the ids it gives children.

Commands for the participant :data:`CHILD`, which the parent's orchestrator handles
(``saga/runtime/children.py``; the test runner's ``saga/testing/runner_children.py``).
"""

from __future__ import annotations

from typing import Final

import msgspec

from saga.core.model import ParentLink

CHILD: Final = "_child"
"""The participant name of child-saga commands (handled by the parent's orchestrator)."""


class StartChild(msgspec.Struct, tag="StartChild", kw_only=True):
    """The command that starts a child saga (idempotent by the child's id)."""

    saga: str
    """The child's definition, ``name@version``."""
    saga_id: str
    data: msgspec.Raw
    parent: ParentLink


class CancelChild(msgspec.Struct, tag="CancelChild", kw_only=True):
    """The command that cancels a child saga whose parent no longer waits for it."""

    saga: str
    saga_id: str
    reason: str


def child_saga_id(parent_id: str, key: str, generation: int = 0) -> str:
    """The id of the child started by step (or branch) ``key`` of saga ``parent_id``."""
    return f"{parent_id}/{key}" + (f"/g{generation}" if generation else "")
