"""redsaga's saga engine: definitions, the pure decider, the Redis store and the runtime.

Declare a :class:`Saga` with steps and compensations (and sleeps, signal and event waits,
a deadline), handle its commands with a :class:`Participant`, run both with a
:class:`SagaWorker` (or ``saga worker``), and start, query and signal sagas with a
:class:`SagaClient`; start them on a calendar with a :class:`Schedule` and a
:class:`ScheduleClient`. :mod:`saga.testing` runs sagas in-process without Redis.
"""

from bus import PermanentError, TransientError
from saga._app import App
from saga._client import SagaClient
from saga._config import EngineConfig
from saga._cron import CronError
from saga._decider import Decision, LocalCall, decide, start
from saga._definition import LOCAL, Command, Compensation, Context, Retry, Saga, Step, StepContext, command
from saga._errors import (
    ConcurrentUpdate,
    DefinitionError,
    IllegalTransition,
    InvalidInput,
    SagaError,
    SagaExists,
    SagaNotFound,
    ScheduleExists,
    ScheduleNotFound,
    UnknownDefinition,
)
from saga._keys import Partition, partition_of
from saga._model import (
    Attempt,
    CancelRequested,
    Event,
    EventReceived,
    ForceCompleted,
    HistoryEntry,
    Note,
    RetryRequested,
    SagaState,
    SignalReceived,
    Started,
    StepReplied,
    StepState,
    TimerFired,
    Wait,
)
from saga._orchestrator import Orchestrator
from saga._participant import CommandContext, Participant
from saga._protocol import StepFailed, StepSucceeded
from saga._query import SagaQuery, WaitInfo
from saga._registry import Registry
from saga._schedule import CatchUp, Overlap, Schedule, ScheduleState
from saga._scheduler import ScheduleClient, ScheduleInfo
from saga._states import SAGA_TRANSITIONS, STEP_TRANSITIONS, SagaStatus, StepStatus
from saga._tokens import InvalidToken, Signer
from saga._worker import SagaWorker

__all__ = [
    "LOCAL",
    "SAGA_TRANSITIONS",
    "STEP_TRANSITIONS",
    "App",
    "Attempt",
    "CancelRequested",
    "CatchUp",
    "Command",
    "CommandContext",
    "Compensation",
    "ConcurrentUpdate",
    "Context",
    "CronError",
    "Decision",
    "DefinitionError",
    "EngineConfig",
    "Event",
    "EventReceived",
    "ForceCompleted",
    "HistoryEntry",
    "IllegalTransition",
    "InvalidInput",
    "InvalidToken",
    "LocalCall",
    "Note",
    "Orchestrator",
    "Overlap",
    "Participant",
    "Partition",
    "PermanentError",
    "Registry",
    "Retry",
    "RetryRequested",
    "Saga",
    "SagaClient",
    "SagaError",
    "SagaExists",
    "SagaNotFound",
    "SagaQuery",
    "SagaState",
    "SagaStatus",
    "SagaWorker",
    "Schedule",
    "ScheduleClient",
    "ScheduleExists",
    "ScheduleInfo",
    "ScheduleNotFound",
    "ScheduleState",
    "SignalReceived",
    "Signer",
    "Started",
    "Step",
    "StepContext",
    "StepFailed",
    "StepReplied",
    "StepState",
    "StepStatus",
    "StepSucceeded",
    "TimerFired",
    "TransientError",
    "UnknownDefinition",
    "Wait",
    "WaitInfo",
    "command",
    "decide",
    "partition_of",
    "start",
]
