"""Where human tasks live: one hash per task beside its saga, indexed by assignee and due time.

Two implementations keep :class:`TaskStore`: :class:`RedisTaskStore` (``task_write.lua``, one
atomic write per change) and :class:`MemoryTaskStore` (the in-process runner's). Both apply
a :class:`~saga.core.task_rules.TaskChange` only if the task's revision is still the one it
was decided on, and report ``False`` otherwise (nothing written): the caller reads again
and decides again. The runner's tests run the memory store, ``tests/saga/test_tasks_redis.py``
the Redis one.

The messages a change sends (the signal that resumes the saga, notifications) are written
in the same script as the change: a completed task and the saga's signal cannot part.

A task's resume token is not in its record: the stores keep it apart (in Redis under a key
no pattern of the read-only operator reaches, ``saga/store/keys/``) from the write that
opens the task until the one that closes it, and only :meth:`TaskStore.token` reads it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

import msgspec

from bus import Envelope, Stream
from bus.lowlevel import redis_errors
from saga.core.task_rules import Task, TaskChange, TaskLog
from saga.store.keys import Partition
from saga.store.scripts import TASK_WRITE

Message = tuple[Stream, Envelope]
_json = msgspec.json.Encoder()


_DUE_STAGES: Final = frozenset({"due", "final"})
"""The stages of a task timer that mark when an open task is due."""


class TaskStore(Protocol):
    """Where a context's tasks live (see the module docstring)."""

    async def load(self, partition: Partition, task_id: str) -> Task | None:
        """The task, or ``None``."""
        ...

    async def write(self, partition: Partition, change: TaskChange, messages: Sequence[Message]) -> bool:
        """Apply ``change`` and add ``messages``; ``False`` (nothing written) if the task moved."""
        ...

    async def token(self, partition: Partition, task_id: str) -> str:
        """The open task's resume token (``""``: closed, or never opened)."""
        ...

    async def open_for(self, partition: Partition, assignee: str, limit: int) -> list[Task]:
        """The open tasks of ``assignee`` in the partition, soonest due first."""
        ...

    async def due_timers(self, partition: Partition, now_ms: int, limit: int) -> list[tuple[str, int]]:
        """Task timers due at ``now_ms`` (member, when), soonest first."""
        ...

    async def open_tasks(self, partition: Partition, due_by_ms: int | None, limit: int) -> list[Task]:
        """Every open task of the partition (due by ``due_by_ms`` if given), soonest due first.

        Read from the task timers, not by a scan: an open task always has its due timer
        (``due``, or ``final`` once escalated).
        """
        ...

    async def next_timer(self, partition: Partition) -> int | None:
        """When the partition's next task timer is due (``None``: none pending)."""
        ...

    async def log(self, partition: Partition, saga_id: str) -> list[TaskLog]:
        """The saga's task log, oldest first."""
        ...

    async def server_ms(self) -> int:
        """The store's own clock (Redis ``TIME``): what claims and task timers are judged by."""
        ...


def kept_token(task: Task) -> str:
    """What a write does with the token: ``-`` forget it (closed), keep ``task.token``, ``""`` leave it."""
    return task.token if task.state == "open" else "-"


class RedisTaskStore:
    """Tasks in Redis (the layout is in ``saga/store/keys/``)."""

    def __init__(self, redis: Any) -> None:
        self.redis = redis

    async def load(self, partition: Partition, task_id: str) -> Task | None:  # noqa: D102 - the protocol's
        with redis_errors():
            raw = await self.redis.hget(partition.task(task_id), "task")
        return None if raw is None else msgspec.json.decode(raw, type=Task)

    async def write(self, partition: Partition, change: TaskChange, messages: Sequence[Message]) -> bool:  # noqa: D102
        task = change.task
        keys = [partition.task(task.id), partition.task_timers, partition.task_log(task.saga_id)]
        keys += [partition.task_tokens]
        keys += [partition.tasks_for(a) for a in change.unindex]
        keys += [partition.tasks_for(a) for a in change.index]
        record = _json.encode(msgspec.structs.replace(task, token=""))
        args: list[Any] = [change.before_rev, task.rev, record, task.id, task.due_ms]
        args += [len(change.unindex), len(change.index), len(messages), kept_token(task)]
        args += [len(change.timers)]
        for member, at in change.timers.items():
            args += [member, at]
        args += [
            len(change.untimers),
            *change.untimers,
            len(change.log),
            *(_json.encode(e) for e in change.log),
        ]
        for stream, envelope in messages:
            fields = envelope.field_args()
            args += [stream.key, len(fields) // 2, *fields]
        with redis_errors():
            reply = await TASK_WRITE.call(keys, args).run(self.redis)
        return bool(reply[0] in (b"ok", "ok"))

    async def token(self, partition: Partition, task_id: str) -> str:  # noqa: D102
        with redis_errors():
            kept = await self.redis.hget(partition.task_tokens, task_id)
        return "" if kept is None else kept.decode()

    async def open_for(self, partition: Partition, assignee: str, limit: int) -> list[Task]:  # noqa: D102
        with redis_errors():
            ids = await self.redis.zrange(partition.tasks_for(assignee), 0, limit - 1)
        return await self._load_many(partition, [i.decode() for i in ids])

    async def _load_many(self, partition: Partition, ids: list[str]) -> list[Task]:
        """The tasks ``ids`` in that order (one pipelined round trip; gone ones left out)."""
        if not ids:
            return []
        with redis_errors():
            pipe = self.redis.pipeline(transaction=False)
            for task_id in ids:
                pipe.hget(partition.task(task_id), "task")
            raws = await pipe.execute()
        return [msgspec.json.decode(raw, type=Task) for raw in raws if raw is not None]

    async def due_timers(self, partition: Partition, now_ms: int, limit: int) -> list[tuple[str, int]]:  # noqa: D102
        with redis_errors():
            found = await self.redis.zrangebyscore(
                partition.task_timers, "-inf", now_ms, start=0, num=limit, withscores=True
            )
        return [(member.decode(), int(score)) for member, score in found]

    async def open_tasks(self, partition: Partition, due_by_ms: int | None, limit: int) -> list[Task]:  # noqa: D102
        # a task has at most a reminder beside its due timer: twice the limit holds every due one
        top = "+inf" if due_by_ms is None else due_by_ms
        with redis_errors():
            members = await self.redis.zrangebyscore(
                partition.task_timers, "-inf", top, start=0, num=2 * limit
            )
        stages = [m.decode().rpartition("|") for m in members]
        return await self._load_many(partition, [i for i, _, stage in stages if stage in _DUE_STAGES][:limit])

    async def next_timer(self, partition: Partition) -> int | None:  # noqa: D102
        with redis_errors():
            found = await self.redis.zrange(partition.task_timers, 0, 0, withscores=True)
        return int(found[0][1]) if found else None

    async def log(self, partition: Partition, saga_id: str) -> list[TaskLog]:  # noqa: D102
        with redis_errors():
            raws = await self.redis.lrange(partition.task_log(saga_id), 0, -1)
        return [msgspec.json.decode(raw, type=TaskLog) for raw in raws]

    async def server_ms(self) -> int:  # noqa: D102
        with redis_errors():
            seconds, micros = await self.redis.time()
        return int(seconds) * 1000 + int(micros) // 1000


@dataclass
class MemoryTaskStore:
    """Tasks in a dict (the in-process runner's); ``sent`` collects the messages written."""

    tasks: dict[tuple[str, str], Task] = field(default_factory=dict)
    indexes: dict[tuple[str, str], dict[str, int]] = field(default_factory=dict)
    timers: dict[str, dict[str, int]] = field(default_factory=dict)
    logs: dict[tuple[str, str], list[TaskLog]] = field(default_factory=dict)
    sent: list[Message] = field(default_factory=list)
    tokens: dict[tuple[str, str], str] = field(default_factory=dict)

    async def load(self, partition: Partition, task_id: str) -> Task | None:  # noqa: D102
        task = self.tasks.get((partition.tag, task_id))
        return None if task is None else msgspec.structs.replace(task)

    async def token(self, partition: Partition, task_id: str) -> str:  # noqa: D102
        return self.tokens.get((partition.tag, task_id), "")

    async def write(self, partition: Partition, change: TaskChange, messages: Sequence[Message]) -> bool:  # noqa: D102
        task, tag = change.task, partition.tag
        current = self.tasks.get((tag, task.id))
        if (current.rev if current else 0) != change.before_rev:
            return False
        self.tasks[tag, task.id] = msgspec.structs.replace(task, token="")
        kept = kept_token(task)
        if kept == "-":
            self.tokens.pop((tag, task.id), None)
        elif kept:
            self.tokens[tag, task.id] = kept
        for assignee in change.unindex:
            self.indexes.get((tag, assignee), {}).pop(task.id, None)
        for assignee in change.index:
            self.indexes.setdefault((tag, assignee), {})[task.id] = task.due_ms
        timers = self.timers.setdefault(tag, {})
        timers.update(change.timers)
        for member in change.untimers:
            timers.pop(member, None)
        self.logs.setdefault((tag, task.saga_id), []).extend(change.log)
        self.sent.extend(messages)
        return True

    async def open_for(self, partition: Partition, assignee: str, limit: int) -> list[Task]:  # noqa: D102
        index = self.indexes.get((partition.tag, assignee), {})
        ids = sorted(index, key=lambda i: (index[i], i))[:limit]
        return [msgspec.structs.replace(self.tasks[partition.tag, i]) for i in ids]

    async def due_timers(self, partition: Partition, now_ms: int, limit: int) -> list[tuple[str, int]]:  # noqa: D102
        timers = self.timers.get(partition.tag, {})
        due = sorted((at, member) for member, at in timers.items() if at <= now_ms)
        return [(member, at) for at, member in due[:limit]]

    async def open_tasks(self, partition: Partition, due_by_ms: int | None, limit: int) -> list[Task]:  # noqa: D102
        timers = self.timers.get(partition.tag, {})
        due = sorted(
            (at, member.rpartition("|")[0])
            for member, at in timers.items()
            if member.rpartition("|")[2] in _DUE_STAGES and (due_by_ms is None or at <= due_by_ms)
        )
        return [msgspec.structs.replace(self.tasks[partition.tag, i]) for _, i in due[:limit]]

    async def next_timer(self, partition: Partition) -> int | None:  # noqa: D102
        return min(self.timers.get(partition.tag, {}).values(), default=None)

    async def log(self, partition: Partition, saga_id: str) -> list[TaskLog]:  # noqa: D102
        return list(self.logs.get((partition.tag, saga_id), []))

    async def server_ms(self) -> int:
        """This process's clock (the runner passes a fake clock, which is used instead)."""
        return time.time_ns() // 1_000_000
