"""redsaga's saga engine: definitions, the pure decider, the Redis store and the runtime.

Declare a :class:`Saga` with steps and compensations, handle its commands with a
:class:`Participant`, run both with a :class:`SagaWorker` (or ``saga worker``), and start
sagas with a :class:`SagaClient`. :mod:`saga.testing` runs sagas in-process without Redis.
Versions of a definition run side by side; :class:`Versions` registers their shapes,
drains and decommissions them, :func:`run_migration` moves sagas between them (see
docs/versioning.md).
"""

from bus import PermanentError, TransientError
from saga._app import App
from saga._client import SagaClient
from saga._compat import RULES as COMPATIBILITY_RULES
from saga._compat import Change, Rule, compare_shapes
from saga._config import EngineConfig
from saga._decider import Decision, LocalCall, decide, start
from saga._definition import LOCAL, Command, Compensation, Context, Retry, Saga, Step, StepContext, command
from saga._errors import (
    ConcurrentUpdate,
    DefinitionError,
    IllegalTransition,
    IncompatibleChange,
    InvalidInput,
    MigrationRefused,
    SagaError,
    SagaExists,
    SagaNotFound,
    UnknownDefinition,
    VersionDrained,
    VersionError,
    VersionInUse,
)
from saga._keys import Partition, partition_of
from saga._migrate import MigrationReport, MigrationResult, run_migration
from saga._migration import KEEP, Instance, Migration, Plan, migration
from saga._model import (
    Attempt,
    CancelRequested,
    Event,
    ForceCompleted,
    HistoryEntry,
    Migrated,
    Note,
    RetryRequested,
    SagaState,
    Started,
    StepReplied,
    StepState,
    TimerFired,
)
from saga._orchestrator import Orchestrator
from saga._participant import CommandContext, Participant
from saga._protocol import StepFailed, StepSucceeded
from saga._registry import Registry
from saga._shape import CompensationShape, Shape, StepShape, TypeShape, shape_of
from saga._states import SAGA_TRANSITIONS, STEP_TRANSITIONS, SagaStatus, StepStatus
from saga._versions import (
    DrainNote,
    Registration,
    RegistrySnapshot,
    Stranded,
    Versions,
    VersionStatus,
    WorkerInfo,
    check_registry,
    stranded_instances,
)
from saga._worker import SagaWorker

__all__ = [
    "COMPATIBILITY_RULES",
    "KEEP",
    "LOCAL",
    "SAGA_TRANSITIONS",
    "STEP_TRANSITIONS",
    "App",
    "Attempt",
    "CancelRequested",
    "Change",
    "Command",
    "CommandContext",
    "Compensation",
    "CompensationShape",
    "ConcurrentUpdate",
    "Context",
    "Decision",
    "DefinitionError",
    "DrainNote",
    "EngineConfig",
    "Event",
    "ForceCompleted",
    "HistoryEntry",
    "IllegalTransition",
    "IncompatibleChange",
    "Instance",
    "InvalidInput",
    "LocalCall",
    "Migrated",
    "Migration",
    "MigrationRefused",
    "MigrationReport",
    "MigrationResult",
    "Note",
    "Orchestrator",
    "Participant",
    "Partition",
    "PermanentError",
    "Plan",
    "Registration",
    "Registry",
    "RegistrySnapshot",
    "Retry",
    "RetryRequested",
    "Rule",
    "Saga",
    "SagaClient",
    "SagaError",
    "SagaExists",
    "SagaNotFound",
    "SagaState",
    "SagaStatus",
    "SagaWorker",
    "Shape",
    "Started",
    "Step",
    "StepContext",
    "StepFailed",
    "StepReplied",
    "StepShape",
    "StepState",
    "StepStatus",
    "StepSucceeded",
    "Stranded",
    "TimerFired",
    "TransientError",
    "TypeShape",
    "UnknownDefinition",
    "VersionDrained",
    "VersionError",
    "VersionInUse",
    "VersionStatus",
    "Versions",
    "WorkerInfo",
    "check_registry",
    "command",
    "compare_shapes",
    "decide",
    "migration",
    "partition_of",
    "run_migration",
    "shape_of",
    "start",
    "stranded_instances",
]
