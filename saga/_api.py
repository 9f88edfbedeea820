"""Everything :mod:`saga` exports, imported eagerly.

``saga/__init__.py`` imports this module on the first access to one of its names, so that
importing the pure core (:mod:`saga.core`, :mod:`saga.definition`) loads neither the bus
nor redis. Each name is re-exported explicitly (``X as X``); ``saga.__all__`` lists them
and ``tests/test_public_api.py`` keeps the two equal.
"""

from bus import PermanentError as PermanentError
from bus import TransientError as TransientError
from saga.core.migration import KEEP as KEEP
from saga.core.migration import Instance as Instance
from saga.core.migration import Plan as Plan
from saga.core.migration import migration as migration
from saga.core.model import SagaState as SagaState
from saga.core.states import SagaStatus as SagaStatus
from saga.core.states import StepStatus as StepStatus
from saga.definition.composition import Group as Group
from saga.definition.concurrency import Key as Key
from saga.definition.human_tasks import Escalation as Escalation
from saga.definition.human_tasks import Role as Role
from saga.definition.human_tasks import User as User
from saga.definition.rate import RateLimit as RateLimit
from saga.definition.registry import Registry as Registry
from saga.definition.retry import Retry as Retry
from saga.definition.saga import Command as Command
from saga.definition.saga import Context as Context
from saga.definition.saga import Saga as Saga
from saga.definition.saga import StepContext as StepContext
from saga.definition.saga import command as command
from saga.definition.schedule import Schedule as Schedule
from saga.errors import DefinitionError as DefinitionError
from saga.errors import InvalidInput as InvalidInput
from saga.errors import InvalidToken as InvalidToken
from saga.errors import KeyBusy as KeyBusy
from saga.errors import ResultTimeout as ResultTimeout
from saga.errors import SagaEnded as SagaEnded
from saga.errors import SagaError as SagaError
from saga.errors import SagaExists as SagaExists
from saga.errors import SagaNotFound as SagaNotFound
from saga.errors import StartConflict as StartConflict
from saga.errors import StartPending as StartPending
from saga.errors import TaskError as TaskError
from saga.errors import WaitEnded as WaitEnded
from saga.ops.admin import SagaAdmin as SagaAdmin
from saga.runtime.app import App as App
from saga.runtime.client import SagaClient as SagaClient
from saga.runtime.config import EngineConfig as EngineConfig
from saga.runtime.participant import CommandContext as CommandContext
from saga.runtime.participant import Participant as Participant
from saga.runtime.schedule_runner import ScheduleClient as ScheduleClient
from saga.runtime.sync_client import SyncSagaClient as SyncSagaClient
from saga.runtime.task_client import TaskClient as TaskClient
from saga.runtime.tasks import role_table as role_table
from saga.runtime.worker import SagaWorker as SagaWorker
from saga.versions.migrator import run_migration as run_migration
from saga.versions.registry import Versions as Versions
