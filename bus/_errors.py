"""The bus's errors, and the one place where redis-py's exceptions are translated.

::

    BusError
    ├── RedisUnavailable        connection refused, reset or timed out (a retry may help)
    ├── RedisCommandError       Redis rejected a command or a script failed (a bug or misconfiguration)
    │   ├── RedisOutOfMemory    Redis hit maxmemory (a retry after back-off may help)
    │   ├── RedisPermissionDenied  the Redis ACL user may not run the command or touch the key
    │   │   └── LibraryNotLoaded   a function library is missing and this user may not load it
    │   ├── FunctionMissing     Redis has no such function (its library is not loaded)
    │   └── LibraryExists       ``FUNCTION LOAD`` found the library there already
    ├── RedisDataLost           Redis came back without its data (the epoch key is gone)
    ├── EpochNotSet             the epoch key is not set yet and this worker may only read it
    ├── UnsafeRedisConfig       Redis settings that lose data (an eviction policy); refused
    ├── ReplicaAckTimeout       written on the master, too few replicas acknowledged (WAIT)
    ├── GroupMissing            the stream or its consumer group vanished (NOGROUP)
    │   └── StreamDeleted       a blocking read was ended because its stream was deleted
    ├── GroupExists             the consumer group is there already (BUSYGROUP)
    ├── MalformedEntry          a stream entry cannot be decoded into an envelope
    ├── Unauthenticated         a stream entry is not signed, or not by a principal that may write it
    ├── AuthError               a keyring or principal name is unusable (configuration)
    ├── InvalidRedisURL         a Redis URL that cannot be used as written (configuration)
    ├── PayloadTooLarge         a message is over the configured size limit
    ├── DefinitionError         a handler or subscription is declared wrongly
    └── HandlerFailure          raised by handlers to say how a failure should be treated
        ├── TransientError      retry with back-off until the delivery limit
        └── PermanentError      no retry: dead-letter now

Every exception carries ``retryable`` so callers decide without matching text.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager

from redis import exceptions as rx


class BusError(Exception):
    """Base class of every error the bus raises."""

    retryable: bool = False


class RedisUnavailable(BusError):
    """Redis could not be reached or did not answer in time; the outcome of a write is unknown."""

    retryable = True


class RedisCommandError(BusError):
    """Redis rejected a command: a bug, a misconfiguration or a missing permission."""


class RedisOutOfMemory(RedisCommandError):
    """Redis is at ``maxmemory`` and refuses writes; back off and retry, nothing was written."""

    retryable = True


class RedisPermissionDenied(RedisCommandError):
    """The Redis ACL user may not run this command or touch this key (``NOPERM``).

    A command a script runs is checked against the caller's ACL too, but Redis 7.0 reports a
    refusal inside a script as a plain script error (:class:`RedisCommandError`).
    """


class LibraryNotLoaded(RedisPermissionDenied):
    """A redsaga function library is not loaded on Redis and this user may not load it.

    Raised for the calls that met the missing library; nothing ran. ``library`` is the
    library's name (``redsaga_<package>_<hash>``). An admin loads it with ``saga functions
    load``; retrying without that cannot help.
    """

    def __init__(self, library: str) -> None:
        super().__init__(
            f"the redsaga function library {library} is not loaded on this Redis; load it as an "
            "admin with `saga functions load --redis-url …`"
        )
        self.library = library


class FunctionMissing(RedisCommandError):
    """Redis has no function of that name: its library was never loaded, or was flushed.

    The call did not run. :func:`bus.run_batch` loads the library and sends the call again,
    so this reaches a caller only when the library vanished again each time it was loaded.
    """

    retryable = True


class LibraryExists(RedisCommandError):
    """``FUNCTION LOAD`` found a library of that name; a name is a hash of its source, so loading is done."""


class RedisDataLost(BusError):
    """Redis no longer holds the data this deployment wrote: ``rs:epoch`` is gone or changed.

    Raised by a running worker (which stops consuming) and by a starting worker once a
    loss was seen. Not retryable: an operator restores a backup or accepts a new epoch
    (``saga epoch accept``). ``expected`` is the epoch the worker joined (``None`` at
    start), ``found`` what ``rs:epoch`` holds now (``None``: nothing).
    """

    def __init__(self, *, expected: str | None, found: str | None) -> None:
        if expected is None:
            what = f"a worker saw Redis lose its data earlier (rs:epoch is {found!r})"
        elif found is None:
            what = f"rs:epoch (epoch {expected!r}) is gone: Redis restarted empty or was flushed"
        else:
            what = f"rs:epoch changed from {expected!r} to {found!r} under this worker"
        super().__init__(
            f"Redis lost its data: {what}. Consumption stopped; sagas in flight may be lost. "
            "Restore Redis from a backup, or accept a fresh epoch with `saga epoch accept`, "
            "then restart the workers."
        )
        self.expected = expected
        self.found = found


class EpochNotSet(BusError):
    """``rs:epoch`` does not exist yet and this worker may only read it (a participant).

    The first orchestrator's worker of a deployment creates it; retried until then.
    """

    retryable = True

    def __init__(self) -> None:
        super().__init__(
            "rs:epoch is not set yet: the first orchestrator's worker sets it (this worker may only "
            "read it); waiting"
        )


class UnsafeRedisConfig(BusError):
    """Redis is configured to lose data silently, and ``BusConfig`` says to refuse it.

    ``problems`` names each setting and what to set instead (``bus/_safety.py``).
    """

    def __init__(self, problems: list[str]) -> None:
        super().__init__(
            "refusing to start on unsafe Redis settings: "
            + "; ".join(problems)
            + " (or set BusConfig.on_eviction / on_no_aof to 'warn')"
        )
        self.problems = problems


class ReplicaAckTimeout(BusError):
    """A write reached the master but fewer replicas than asked acknowledged it in time.

    Raised with ``BusConfig.replica_acks`` set (``WAIT``). The write stands on the master;
    a failover before the replicas catch up could lose it. Every redsaga write is safe to
    repeat, so a caller that needs it on replicas retries.
    """

    retryable = True

    def __init__(self, acked: int, wanted: int, timeout_ms: int) -> None:
        super().__init__(
            f"written on the master, but acknowledged by {acked} of {wanted} replicas within "
            f"{timeout_ms} ms: a failover now could lose it; the call is safe to repeat"
        )
        self.acked = acked
        self.wanted = wanted


class GroupMissing(BusError):
    """A stream or consumer group disappeared (deleted by an operator?); it will be recreated."""

    retryable = True


class StreamDeleted(GroupMissing):
    """A blocking read was ended by the server (``UNBLOCKED``): its stream was deleted.

    Redis 7 wakes a reader blocked on a stream that is deleted with this error (and so
    does ``CLIENT UNBLOCK … ERROR``); the group went with the stream, so it is recreated.
    """


class GroupExists(BusError):
    """``XGROUP CREATE`` found the group already there; creating groups is idempotent."""


class MalformedEntry(BusError):
    """A stream entry is not a valid envelope; it goes to the dead-letter stream with ``reason``."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Unauthenticated(BusError):
    """An entry is not signed, or not by whom it may be; ``reason`` says which (``bus/_auth.py``).

    ``principal`` is the signer the entry names (``""`` when it names none). The entry goes
    to the dead-letter stream with the reason and changes nothing.
    """

    def __init__(self, reason: str, principal: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.principal = principal


class AuthError(BusError):
    """A keyring or a principal name is unusable: a configuration problem, not an entry's."""


class InvalidRedisURL(BusError, ValueError):
    """A Redis URL that cannot be used as written; nothing was opened.

    An unknown scheme, an option redis-py does not take, or TLS asked for where the
    connection would not speak it.

    ``url`` is the URL with its password masked; ``reason`` says what is wrong with it.
    """

    def __init__(self, url: str, reason: str) -> None:
        super().__init__(f"unusable Redis URL {url}: {reason}")
        self.url = url
        self.reason = reason


class PayloadTooLarge(BusError):
    """A message is larger than ``BusConfig.max_payload_bytes``; nothing was written."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"payload of {size} bytes is over the {limit}-byte limit")
        self.size = size
        self.limit = limit


class DefinitionError(BusError):
    """A handler or subscription is declared wrongly; raised when the decorator is applied."""


class HandlerFailure(BusError):
    """Raised by a handler to say how its failure should be treated.

    Any other exception a handler raises counts as transient.
    """

    def __init__(self, message: str, *, details: object = None) -> None:
        super().__init__(message)
        self.details = details


class TransientError(HandlerFailure):
    """A failure that may go away: the entry is redelivered with back-off until the limit."""

    retryable = True


class PermanentError(HandlerFailure):
    """A failure that will not go away: the entry goes to the dead-letter stream now."""


_UNAVAILABLE: tuple[type[Exception], ...] = (
    rx.BusyLoadingError,
    rx.MaxConnectionsError,
    rx.TryAgainError,
    rx.ClusterDownError,
    rx.ClusterError,  # redirections ran out (TTL exhausted): a slot is moving between masters
    rx.ReadOnlyError,  # a replica promoted under us, or a failover in progress
    rx.TimeoutError,
    rx.RedisClusterException,  # no node of the cluster serves the slot (yet)
)


def translate(error: rx.RedisError | rx.RedisClusterException) -> BusError:
    """Map one redis-py exception to the bus's error tree (the only such mapping)."""
    if isinstance(error, rx.OutOfMemoryError):
        return RedisOutOfMemory(str(error))
    if isinstance(error, rx.NoPermissionError):
        return RedisPermissionDenied(
            f"Redis refused: {error} (the ACL user lacks this permission; `saga acl --app …` prints "
            "the users each process needs, see docs/security.md)"
        )
    if isinstance(error, _UNAVAILABLE) or (
        type(error) is rx.ConnectionError  # its subclasses are auth failures: not retryable
    ):
        return RedisUnavailable(f"Redis unavailable: {error}")
    # Redis reports these only through the error code that starts the reply.
    by_code = _BY_CODE.get(str(error).partition(" ")[0]) if isinstance(error, rx.ResponseError) else None
    if by_code is not None:
        return by_code(str(error))
    if type(error) is rx.ResponseError:  # plain ERR replies: only their text tells them apart
        for pattern, kind in _BY_MESSAGE:
            if pattern.fullmatch(str(error)):
                return kind(str(error))
    return RedisCommandError(f"{type(error).__name__}: {error}")


_BY_CODE: dict[str, type[BusError]] = {
    "NOGROUP": GroupMissing,
    "UNBLOCKED": StreamDeleted,
    "BUSYGROUP": GroupExists,
}
_BY_MESSAGE: tuple[tuple[re.Pattern[str], type[BusError]], ...] = (
    (re.compile(r"Function not found"), FunctionMissing),  # FCALL of a function no library has
    (re.compile(r"Library '[^']*' already exists"), LibraryExists),  # FUNCTION LOAD without REPLACE
)


@contextmanager
def redis_errors() -> Iterator[None]:
    """Translate redis-py exceptions raised in the block into :class:`BusError`."""
    try:
        yield
    except (rx.RedisError, rx.RedisClusterException) as error:
        raise translate(error) from error
