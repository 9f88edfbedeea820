"""redsaga's saga engine: definitions, the pure decider, the Redis store and the runtime.

Declare a :class:`Saga` with steps and compensations, handle its commands with a
:class:`Participant`, run both with a :class:`SagaWorker` (or ``saga worker``), and start
sagas with a :class:`SagaClient`. :mod:`saga.testing` runs sagas in-process without Redis.
"""

from bus import PermanentError, TransientError
from saga._app import App
from saga._client import SagaClient
from saga._config import EngineConfig
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
    UnknownDefinition,
)
from saga._keys import Partition, partition_of
from saga._model import (
    Attempt,
    CancelRequested,
    Event,
    ForceCompleted,
    HistoryEntry,
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
from saga._states import SAGA_TRANSITIONS, STEP_TRANSITIONS, SagaStatus, StepStatus
from saga._worker import SagaWorker

__all__ = [
    "LOCAL",
    "SAGA_TRANSITIONS",
    "STEP_TRANSITIONS",
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
    "InvalidInput",
    "LocalCall",
    "Note",
    "Orchestrator",
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
    "SagaState",
    "SagaStatus",
    "SagaWorker",
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
    "command",
    "decide",
    "partition_of",
    "start",
]
