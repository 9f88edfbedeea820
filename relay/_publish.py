"""Turning claimed outbox rows into stream entries: one script call per hash tag, pipelined.

Rows are checked first (stream key, envelope, size); a row that can never be published is
failed with its reason and does not hold up the others. The rest are grouped by hash tag
into calls of ``lua/publish_rows.lua`` (which publishes in order and dedupes by message id)
and sent in one pipeline. A call Redis refuses for now (out of memory, loading, a failover)
leaves its rows pending for the next round; one it refuses for good (a missing ACL
permission) fails its rows with the reason, to be requeued once the cause is fixed.

Per-key order: rows of one ordering key are published in id order within their call. If a
key's rows go to streams in different tags (so different calls, which could fail apart), only
the rows up to the first change of tag go in this round; the rest wait for the next one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from bus import BusError, MalformedEntry, Redis, Stream
from bus.lowlevel import Script, ScriptCall, get_logger, run_batch
from relay._codec import decode_envelope
from relay._config import RelayConfig

PUBLISH_ROWS = Script.load("relay", "publish_rows")
_log = get_logger("redsaga.relay")
_NOT_A_STREAM = -1
_UNKNOWN_STREAM = -2


@dataclass(frozen=True, slots=True)
class OutboxRow:
    """One claimed, unsent outbox row."""

    id: int
    message_id: str
    stream: str
    ordering_key: str | None
    envelope: bytes


@dataclass(slots=True)
class Outcome:
    """What became of a batch of rows.

    Attributes:
        sent: (row id, entry id) per published row; the entry id is ``None`` when the
            message had been published already (a repeat after a relay crash).
        failed: (row id, reason) per row that can never be published.
        deferred: Rows left pending for a later round.
        error: Why rows were deferred, when Redis refused a call (back off before retrying).

    """

    sent: list[tuple[int, str | None]] = field(default_factory=list)
    failed: list[tuple[int, str]] = field(default_factory=list)
    deferred: list[int] = field(default_factory=list)
    error: BusError | None = None


@dataclass(slots=True)
class _Run:
    published_key: str
    streams: dict[str, int] = field(default_factory=dict)
    rows: list[int] = field(default_factory=list)
    row_streams: list[str] = field(default_factory=list)
    args: list[str | bytes | int] = field(default_factory=list)

    def add(self, row: OutboxRow, fields: dict[str, bytes | str | int]) -> None:
        index = self.streams.setdefault(row.stream, len(self.streams) + 1)
        self.rows.append(row.id)
        self.row_streams.append(row.stream)
        self.args += [index, row.message_id, len(fields)]
        for name, value in fields.items():
            self.args += [name, value]

    def call(self, config: RelayConfig) -> ScriptCall:
        window, create = config.dedupe_window_ms, int(config.create_streams)
        shared: list[str | bytes | int] = [window, create, len(self.streams)]
        return PUBLISH_ROWS.call([self.published_key], [*shared, *self.streams, *self.args])


async def publish_rows(redis: Redis, rows: Sequence[OutboxRow], config: RelayConfig) -> Outcome:
    """Publish ``rows`` (in id order) and say what became of each.

    Raises :class:`bus.RedisUnavailable` when the pipeline's outcome is unknown (the link
    broke): the caller must leave every row pending; the dedupe window makes the retry safe.
    """
    outcome = Outcome()
    runs = _group(rows, config, outcome)
    if not runs:
        return outcome
    results = await run_batch(redis, [run.call(config) for run in runs])
    for run, result in zip(runs, results, strict=True):
        _read(run, result, outcome)
    return outcome


def _group(rows: Sequence[OutboxRow], config: RelayConfig, outcome: Outcome) -> list[_Run]:
    """Check the rows and group the publishable ones into one run per hash tag, in id order."""
    runs: dict[str, _Run] = {}
    key_tags: dict[str, str] = {}
    held_keys: set[str] = set()
    for row in rows:
        checked = _check(row, config)
        if isinstance(checked, str):
            outcome.failed.append((row.id, checked))
            continue
        stream, fields = checked
        if row.ordering_key is not None:
            first_tag = key_tags.setdefault(row.ordering_key, stream.tag)
            if row.ordering_key in held_keys or first_tag != stream.tag:
                held_keys.add(row.ordering_key)
                outcome.deferred.append(row.id)
                continue
        runs.setdefault(stream.tag, _Run(stream.published_key)).add(row, fields)
    return list(runs.values())


def _read(run: _Run, result: object, outcome: Outcome) -> None:
    """Record what one script call did to its rows."""
    if isinstance(result, BusError) and result.retryable:
        _log.warning(
            "redis refused a publish call for now; rows stay pending",
            error=str(result),
            kind=type(result).__name__,
            rows=len(run.rows),
        )
        outcome.deferred += run.rows
        outcome.error = result
        return
    if isinstance(result, BusError):  # NOPERM and the like: waiting will not help
        reason = f"redis refused the publish ({type(result).__name__}): {result}"
        outcome.failed += [(row_id, reason) for row_id in run.rows]
        return
    if not isinstance(result, list):  # the script returns one item per row; anything else is a bug
        outcome.failed += [
            (row_id, f"unexpected reply from publish_rows.lua: {result!r}") for row_id in run.rows
        ]
        return
    for row_id, stream_key, item in zip(run.rows, run.row_streams, result, strict=True):
        if isinstance(item, bytes):
            outcome.sent.append((row_id, item.decode()))
        elif item == 0:
            outcome.sent.append((row_id, None))
        elif item == _NOT_A_STREAM:
            outcome.failed.append((row_id, f"key {stream_key} holds another type, not a stream"))
        else:
            outcome.failed.append(
                (row_id, f"unknown stream {stream_key}: it does not exist and create_streams is off")
            )


def _check(row: OutboxRow, config: RelayConfig) -> tuple[Stream, dict[str, bytes | str | int]] | str:
    """The row's stream and entry fields, or the reason it can never be published."""
    try:
        stream = Stream.from_key(row.stream)
    except ValueError as error:
        return f"invalid stream key: {error}"
    if config.streams is not None and row.stream not in config.streams:
        return f"unknown stream {row.stream}: not in RelayConfig.streams"
    try:
        fields = decode_envelope(row.envelope).to_fields()
    except MalformedEntry as error:
        return error.reason
    size = sum(len(name) + len(_as_bytes(value)) for name, value in fields.items())
    if size > config.max_entry_bytes:
        return f"oversized: the entry would be {size} bytes, over the {config.max_entry_bytes}-byte limit"
    return stream, fields


def _as_bytes(value: bytes | str | int) -> bytes:
    if isinstance(value, bytes):
        return value
    return str(value).encode()
