"""redsaga's Redis Streams transport.

Declare handlers on a :class:`Bus`, publish with a :class:`Publisher`, run them with a
:class:`Worker`. Entries are leased to one consumer at a time (heartbeats keep a lease,
XAUTOCLAIM takes over an expired one), completions are fenced by the lease, failures are
retried with back-off and then dead-lettered with their context, and idempotent handlers
run once per idempotency key.
"""

from bus._app import Bus, Route, Subscription
from bus._auth import OFF as SIGNING_OFF
from bus._auth import Authenticator, Keyring, principal
from bus._client import MEMORY_URL, URL_ENV, Redis, connect, resolve_url
from bus._clock import Clock, FakeClock, SystemClock
from bus._config import BusConfig, ClientConfig
from bus._dead_letters import DeadLetter, LetterFilter, Requeued, dead_letter_sizes, dead_letters
from bus._dead_letters import purge as purge_dead_letters
from bus._dead_letters import requeue as requeue_dead_letters
from bus._delivery import Delivery, LeaseLost
from bus._envelope import Envelope, decode_fields, new_envelope
from bus._epoch import EPOCH_KEY, accept_epoch, read_epoch
from bus._errors import (
    AuthError,
    BusError,
    DefinitionError,
    EpochNotSet,
    FunctionMissing,
    GroupExists,
    GroupMissing,
    HandlerFailure,
    InvalidRedisURL,
    LibraryExists,
    LibraryNotLoaded,
    MalformedEntry,
    PayloadTooLarge,
    PermanentError,
    RedisCommandError,
    RedisDataLost,
    RedisOutOfMemory,
    RedisPermissionDenied,
    RedisUnavailable,
    ReplicaAckTimeout,
    StreamDeleted,
    TransientError,
    Unauthenticated,
    UnsafeRedisConfig,
)
from bus._outcomes import Reply
from bus._publisher import Publisher
from bus._signals import serve
from bus._stats import GroupStats, StreamStats, stream_stats
from bus._worker import Worker
from redsaga.ids import derived_id, message_type, uuid7
from redsaga.streams import Stream

__all__ = [
    "EPOCH_KEY",
    "MEMORY_URL",
    "SIGNING_OFF",
    "URL_ENV",
    "AuthError",
    "Authenticator",
    "Bus",
    "BusConfig",
    "BusError",
    "ClientConfig",
    "Clock",
    "DeadLetter",
    "DefinitionError",
    "Delivery",
    "Envelope",
    "EpochNotSet",
    "FakeClock",
    "FunctionMissing",
    "GroupExists",
    "GroupMissing",
    "GroupStats",
    "HandlerFailure",
    "InvalidRedisURL",
    "Keyring",
    "LeaseLost",
    "LetterFilter",
    "LibraryExists",
    "LibraryNotLoaded",
    "MalformedEntry",
    "PayloadTooLarge",
    "PermanentError",
    "Publisher",
    "Redis",
    "RedisCommandError",
    "RedisDataLost",
    "RedisOutOfMemory",
    "RedisPermissionDenied",
    "RedisUnavailable",
    "ReplicaAckTimeout",
    "Reply",
    "Requeued",
    "Route",
    "Stream",
    "StreamDeleted",
    "StreamStats",
    "Subscription",
    "SystemClock",
    "TransientError",
    "Unauthenticated",
    "UnsafeRedisConfig",
    "Worker",
    "accept_epoch",
    "connect",
    "dead_letter_sizes",
    "dead_letters",
    "decode_fields",
    "derived_id",
    "message_type",
    "new_envelope",
    "principal",
    "purge_dead_letters",
    "read_epoch",
    "requeue_dead_letters",
    "resolve_url",
    "serve",
    "stream_stats",
    "uuid7",
]
