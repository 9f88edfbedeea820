"""redsaga's saga engine: definitions, the pure decider, the Redis store and the runtime.

Declare a :class:`Saga` with steps and compensations (and sleeps, signal and event waits,
a deadline; parallel groups, first-of-N, maps, child sagas and TCC steps: see
docs/composition.md; ready-made ones in :mod:`saga.templates`), handle its commands with a
:class:`Participant`, run both with a :class:`SagaWorker` (or ``saga worker``), and start,
query, signal and wait for sagas with a :class:`SagaClient` (from synchronous code, a
:class:`SyncSagaClient`); start them on a calendar with a
:class:`Schedule` and a :class:`ScheduleClient`. :mod:`saga.testing` runs sagas in-process
without Redis and replays exported traces in CI. Versions of a definition run side by side;
:class:`Versions` registers their shapes, drains and decommissions them,
:func:`run_migration` moves sagas between them (see docs/versioning.md). Operate sagas with
a :class:`SagaAdmin` (what the ``saga`` command line calls).

These are the names a user needs, pinned by ``tests/test_public_api.py``. Everything else
lives in the layer it belongs to (docs/architecture.md): the error tree in
:mod:`saga.errors`, the pure decider in :mod:`saga.core`, the events and views in their
modules. The names load on first use (``saga/_api.py``), so that importing the pure core
loads neither the bus nor redis.
"""

from typing import TYPE_CHECKING

__all__ = [
    "KEEP",
    "App",
    "Command",
    "CommandContext",
    "Context",
    "DefinitionError",
    "EngineConfig",
    "Escalation",
    "Group",
    "Instance",
    "InvalidInput",
    "InvalidToken",
    "Key",
    "KeyBusy",
    "Participant",
    "PermanentError",
    "Plan",
    "RateLimit",
    "Registry",
    "ResultTimeout",
    "Retry",
    "Role",
    "Saga",
    "SagaAdmin",
    "SagaClient",
    "SagaEnded",
    "SagaError",
    "SagaExists",
    "SagaNotFound",
    "SagaState",
    "SagaStatus",
    "SagaWorker",
    "Schedule",
    "ScheduleClient",
    "StartConflict",
    "StartPending",
    "StepContext",
    "StepStatus",
    "SyncSagaClient",
    "TaskClient",
    "TaskError",
    "TransientError",
    "User",
    "Versions",
    "WaitEnded",
    "command",
    "migration",
    "role_table",
    "run_migration",
]

if TYPE_CHECKING:
    from saga._api import *
else:

    def __getattr__(name: str) -> object:
        """Import :mod:`saga._api` on the first use of an exported name (see its docstring)."""
        if name not in __all__:
            raise AttributeError(f"module 'saga' has no attribute {name!r}")
        from saga import _api  # noqa: PLC0415 - lazily: importing saga.core must not load redis

        value = getattr(_api, name)
        globals()[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*globals(), *__all__})
