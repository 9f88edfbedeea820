"""redsaga's saga engine: definitions, the pure decider, the Redis store and the runtime.

Declare a :class:`Saga` with steps and compensations, handle its commands with a
:class:`Participant`, run both with a :class:`SagaWorker` (or ``saga worker``), and start
sagas with a :class:`SagaClient`. :mod:`saga.testing` runs sagas in-process without Redis.
Operate them with a :class:`SagaAdmin` (what the ``saga`` command line calls): inspect,
list, replay, force-complete, cancel, retry, dead letters, traces and stats;
:func:`replay_trace` replays an exported trace in CI.
"""

from bus import PermanentError, TransientError
from saga._admin import SagaAdmin
from saga._app import App
from saga._client import SagaClient
from saga._config import EngineConfig
from saga._decider import Decision, LocalCall, decide, start
from saga._definition import LOCAL, Command, Compensation, Context, Retry, Saga, Step, StepContext, command
from saga._errors import (
    ActionRefused,
    ConcurrentUpdate,
    DefinitionError,
    IllegalTransition,
    InvalidInput,
    SagaError,
    SagaExists,
    SagaNotFound,
    UnknownDefinition,
)
from saga._inspect import Inspection, StepView, TimelineRow, TimerView
from saga._keys import Partition, partition_of
from saga._listing import SagaPage, SagaRow
from saga._model import (
    Attempt,
    CancelRequested,
    Event,
    ForceCompleted,
    HistoryEntry,
    Note,
    RedriveRequested,
    RetryRequested,
    SagaState,
    Started,
    StepReplied,
    StepState,
    TimerFired,
)
from saga._operator import ActionResult
from saga._orchestrator import Orchestrator
from saga._participant import CommandContext, Participant
from saga._protocol import StepFailed, StepSucceeded
from saga._registry import Registry
from saga._replay import Mismatch, ReplayReport
from saga._states import SAGA_TRANSITIONS, STEP_TRANSITIONS, SagaStatus, StepStatus
from saga._stats import OutboxBacklog, SagaCount, Stats
from saga._trace import Trace, TraceMismatch, decode_trace, encode_trace, replay_trace
from saga._worker import SagaWorker

__all__ = [
    "LOCAL",
    "SAGA_TRANSITIONS",
    "STEP_TRANSITIONS",
    "ActionRefused",
    "ActionResult",
    "App",
    "Attempt",
    "CancelRequested",
    "Command",
    "CommandContext",
    "Compensation",
    "ConcurrentUpdate",
    "Context",
    "Decision",
    "DefinitionError",
    "EngineConfig",
    "Event",
    "ForceCompleted",
    "HistoryEntry",
    "IllegalTransition",
    "Inspection",
    "InvalidInput",
    "LocalCall",
    "Mismatch",
    "Note",
    "Orchestrator",
    "OutboxBacklog",
    "Participant",
    "Partition",
    "PermanentError",
    "RedriveRequested",
    "Registry",
    "ReplayReport",
    "Retry",
    "RetryRequested",
    "Saga",
    "SagaAdmin",
    "SagaClient",
    "SagaCount",
    "SagaError",
    "SagaExists",
    "SagaNotFound",
    "SagaPage",
    "SagaRow",
    "SagaState",
    "SagaStatus",
    "SagaWorker",
    "Started",
    "Stats",
    "Step",
    "StepContext",
    "StepFailed",
    "StepReplied",
    "StepState",
    "StepStatus",
    "StepSucceeded",
    "StepView",
    "TimelineRow",
    "TimerFired",
    "TimerView",
    "Trace",
    "TraceMismatch",
    "TransientError",
    "UnknownDefinition",
    "command",
    "decide",
    "decode_trace",
    "encode_trace",
    "partition_of",
    "replay_trace",
    "start",
]
