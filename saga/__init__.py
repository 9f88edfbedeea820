"""redsaga's saga engine: definitions, the pure decider, the Redis store and the runtime.

Declare a :class:`Saga` with steps and compensations (and sleeps, signal and event waits,
a deadline; parallel groups, first-of-N, maps, child sagas and TCC steps: see
docs/composition.md; ready-made ones in :mod:`saga.templates`), handle its commands with a
:class:`Participant`, run both with a :class:`SagaWorker` (or ``saga worker``), and start,
query and signal sagas with a :class:`SagaClient`; start them on a calendar with a :class:`Schedule` and a
:class:`ScheduleClient`. :mod:`saga.testing` runs sagas in-process without Redis.
Versions of a definition run side by side; :class:`Versions` registers their shapes,
drains and decommissions them, :func:`run_migration` moves sagas between them (see
docs/versioning.md). Operate sagas with a :class:`SagaAdmin` (what the ``saga`` command
line calls): inspect, list, replay, force-complete, cancel, retry, dead letters, traces and
stats; :func:`replay_trace` replays an exported trace in CI.
"""

from bus import PermanentError, TransientError
from saga.core.decider import Decision, LocalCall, decide, start
from saga.core.migration import KEEP, Instance, Migration, Plan, migration
from saga.core.model import (
    Attempt,
    CancelRequested,
    Event,
    EventReceived,
    ForceCompleted,
    GroupState,
    HistoryEntry,
    Migrated,
    Note,
    ParentLink,
    RedriveRequested,
    RetryRequested,
    SagaState,
    SignalReceived,
    Started,
    StepReplied,
    StepState,
    TimerFired,
    Wait,
)
from saga.core.query import SagaQuery, WaitInfo
from saga.core.replay import Mismatch, ReplayReport
from saga.core.states import SAGA_TRANSITIONS, STEP_TRANSITIONS, SagaStatus, StepStatus
from saga.core.tokens import Signer
from saga.definition.calendar import CalendarError
from saga.definition.composition import Group
from saga.definition.cron import CronError
from saga.definition.registry import Registry
from saga.definition.retry import Retry
from saga.definition.saga import LOCAL, Command, Compensation, Context, Saga, Step, StepContext, command
from saga.definition.schedule import CatchUp, Overlap, Schedule, ScheduleState
from saga.definition.shape import CompensationShape, Shape, StepShape, TypeShape, shape_of
from saga.errors import (
    ActionRefused,
    CodeRequired,
    ConcurrentUpdate,
    DefinitionError,
    IllegalTransition,
    IncompatibleChange,
    InvalidInput,
    InvalidToken,
    MigrationRefused,
    PartitionMismatch,
    SagaError,
    SagaExists,
    SagaNotFound,
    ScheduleExists,
    ScheduleNotFound,
    StartConflict,
    UnknownDefinition,
    VersionDrained,
    VersionError,
    VersionInUse,
    WaitEnded,
)
from saga.ops.acl import AclUser, acl_rules
from saga.ops.admin import SagaAdmin
from saga.ops.inspect import BranchView, Inspection, StepView, TimelineRow, TimerView
from saga.ops.listing import SagaPage, SagaRow
from saga.ops.operator_actions import ActionResult
from saga.ops.stats import GroupLoad, OutboxBacklog, SagaCount, SagaTally, Stats, StreamLoad
from saga.ops.trace import Trace, TraceMismatch, decode_trace, encode_trace, replay_trace
from saga.runtime.app import App
from saga.runtime.client import SagaClient
from saga.runtime.config import EngineConfig
from saga.runtime.gc_tuning import tune_gc
from saga.runtime.orchestrator import Orchestrator
from saga.runtime.participant import CommandContext, Participant
from saga.runtime.protocol import StepFailed, StepSucceeded
from saga.runtime.schedule_runner import ScheduleClient, ScheduleInfo
from saga.runtime.worker import SagaWorker
from saga.store.keys import Partition, partition_of
from saga.versions.catalogue import Catalogue
from saga.versions.compatibility import RULES as COMPATIBILITY_RULES
from saga.versions.compatibility import Change, Rule, compare_shapes
from saga.versions.migrator import MigrationReport, MigrationResult, run_migration
from saga.versions.registry import (
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

__all__ = [
    "COMPATIBILITY_RULES",
    "KEEP",
    "LOCAL",
    "SAGA_TRANSITIONS",
    "STEP_TRANSITIONS",
    "AclUser",
    "ActionRefused",
    "ActionResult",
    "App",
    "Attempt",
    "BranchView",
    "CalendarError",
    "CancelRequested",
    "Catalogue",
    "CatchUp",
    "Change",
    "CodeRequired",
    "Command",
    "CommandContext",
    "Compensation",
    "CompensationShape",
    "ConcurrentUpdate",
    "Context",
    "CronError",
    "Decision",
    "DefinitionError",
    "DrainNote",
    "EngineConfig",
    "Event",
    "EventReceived",
    "ForceCompleted",
    "Group",
    "GroupLoad",
    "GroupState",
    "HistoryEntry",
    "IllegalTransition",
    "IncompatibleChange",
    "Inspection",
    "Instance",
    "InvalidInput",
    "InvalidToken",
    "LocalCall",
    "Migrated",
    "Migration",
    "MigrationRefused",
    "MigrationReport",
    "MigrationResult",
    "Mismatch",
    "Note",
    "Orchestrator",
    "OutboxBacklog",
    "Overlap",
    "ParentLink",
    "Participant",
    "Partition",
    "PartitionMismatch",
    "PermanentError",
    "Plan",
    "RedriveRequested",
    "Registration",
    "Registry",
    "RegistrySnapshot",
    "ReplayReport",
    "Retry",
    "RetryRequested",
    "Rule",
    "Saga",
    "SagaAdmin",
    "SagaClient",
    "SagaCount",
    "SagaError",
    "SagaExists",
    "SagaNotFound",
    "SagaPage",
    "SagaQuery",
    "SagaRow",
    "SagaState",
    "SagaStatus",
    "SagaTally",
    "SagaWorker",
    "Schedule",
    "ScheduleClient",
    "ScheduleExists",
    "ScheduleInfo",
    "ScheduleNotFound",
    "ScheduleState",
    "Shape",
    "SignalReceived",
    "Signer",
    "StartConflict",
    "Started",
    "Stats",
    "Step",
    "StepContext",
    "StepFailed",
    "StepReplied",
    "StepShape",
    "StepState",
    "StepStatus",
    "StepSucceeded",
    "StepView",
    "Stranded",
    "StreamLoad",
    "TimelineRow",
    "TimerFired",
    "TimerView",
    "Trace",
    "TraceMismatch",
    "TransientError",
    "TypeShape",
    "UnknownDefinition",
    "VersionDrained",
    "VersionError",
    "VersionInUse",
    "VersionStatus",
    "Versions",
    "Wait",
    "WaitEnded",
    "WaitInfo",
    "WorkerInfo",
    "acl_rules",
    "check_registry",
    "command",
    "compare_shapes",
    "decide",
    "decode_trace",
    "encode_trace",
    "migration",
    "partition_of",
    "replay_trace",
    "run_migration",
    "shape_of",
    "start",
    "stranded_instances",
    "tune_gc",
]
