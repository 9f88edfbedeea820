"""The in-process runner and Redis as two backends that run the same composed sagas alike.

Both take the definitions to run (by default those of ``compose_sagas``), serve them with the
:class:`~tests.saga.compose_sagas.Services` participant, and expose the same operations:
start a saga, let it settle (skipping from timer to timer), act as an operator, deliver a
signal or publish another context's event, and read back its summary and state. On Redis
(fakeredis or real) the workers run with a ``FakeClock`` through ``run_until_idle``; every
saga read back must replay exactly from its Redis history and keep the invariants.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import bus
from bus import FakeClock, Publisher
from saga import App, EngineConfig, Saga, SagaClient, SagaState, SagaStatus, SagaWorker
from saga.runtime.protocol import RETRY as RETRY_REQUEST
from saga.runtime.protocol import OperatorRequest
from saga.store.keys import Partition
from saga.testing import SagaRunner, Summary, decode_history, invariant_violations, replay, summarize
from tests.saga.compose_sagas import DEFINITIONS, Services

SETTLED = {SagaStatus.DEAD_LETTERED} | {s for s in SagaStatus if s.terminal}
CONTEXTS = ("compose", "billing")


class RunnerBackend:
    """The sagas on :class:`~saga.testing.SagaRunner`."""

    def __init__(self, definitions: Sequence[Saga[Any]] = DEFINITIONS) -> None:
        async def cancel(saga_id: str) -> None:
            self.runner.cancel(saga_id.split("/", maxsplit=1)[0])  # a child's piece cancels its parent

        self.services = Services(cancel)
        self.runner = SagaRunner(*definitions, participants=[self.services.build()])

    async def start(self, definition: Saga[Any], data: object, saga_id: str) -> str:
        return self.runner.start(data, definition=definition, saga_id=saga_id)

    async def settle(self, _saga_id: str) -> None:
        self.runner.run_until_settled()

    async def status(self, saga_id: str, *, context: str = "compose") -> SagaStatus:
        return self.runner.status(saga_id)

    async def retry(self, saga_id: str) -> None:
        self.runner.retry(saga_id)

    async def signal(self, saga_id: str, step: str, data: object, *, context: str) -> None:
        self.runner.signal(self.runner.resume_token(saga_id, step), data)

    async def publish(self, stream: str, message: object) -> None:
        self.runner.publish(stream, message)

    async def summary(self, _definition: Saga[Any], saga_id: str) -> tuple[Summary, SagaState]:
        self.runner.assert_invariants()
        return self.runner.summary(saga_id), self.runner.state(saga_id)


class RedisBackend:
    """The sagas on Redis: an orchestrator worker and a participant worker, a fake clock."""

    def __init__(self, redis: bus.Redis, definitions: Sequence[Saga[Any]] = DEFINITIONS) -> None:
        self.redis = redis
        self.clock = FakeClock()
        self.definitions = list(definitions)
        app = App("compose", sagas=self.definitions)
        self.client = SagaClient(redis, app.registry, clock=self.clock)
        self.services = Services(self.cancel)
        # The participant handles one command at a time, as the runner does: a handler that
        # asks to cancel then answers is then seen in the same order on both backends.
        one_at_a_time = EngineConfig(bus=bus.BusConfig(concurrency=1))
        participant = App("worker", participants=[self.services.build()])
        self.workers = [
            SagaWorker(redis, app, clock=self.clock, consumer="o"),
            SagaWorker(redis, participant, clock=self.clock, consumer="w", config=one_at_a_time),
        ]
        self.partitions = [Partition(context, 0) for context in CONTEXTS]

    async def cancel(self, saga_id: str) -> None:
        await self.client.cancel(
            saga_id.split("/", maxsplit=1)[0], context="compose"
        )  # a child's piece: the parent

    async def _entries(self) -> int:
        total = 0
        for partition in self.partitions:
            for key in [partition.inbox.key] + [partition.commands(n).key for n in ("worker", "_child")]:
                total += await self.redis.xlen(key)
        return total

    async def idle(self) -> None:
        for _ in range(200):
            before = await self._entries()
            for worker in self.workers:
                await worker.run_until_idle()
            if await self._entries() == before:
                return
        raise AssertionError("the workers never went idle")

    async def next_timer(self) -> int | None:
        due = []
        for partition in self.partitions:
            rows = await self.redis.zrange(partition.timers, 0, 0, withscores=True)
            due += [int(rows[0][1])] if rows else []
        return min(due, default=None)

    async def start(self, definition: Saga[Any], data: object, saga_id: str) -> str:
        return await self.client.start(definition, data, saga_id=saga_id)

    async def settle(self, saga_id: str) -> None:
        await self.idle()
        while await self.status(saga_id) not in SETTLED:
            due = await self.next_timer()
            if due is None:
                break
            self.clock.set(max(due, self.clock.now_ms()))
            await self.idle()

    async def status(self, saga_id: str, *, context: str = "compose") -> SagaStatus:
        return (await self.client.get(saga_id, context=context)).status

    async def retry(self, saga_id: str) -> None:
        await self.client.send(saga_id, RETRY_REQUEST, OperatorRequest(by="test"), context="compose")

    async def signal(self, saga_id: str, step: str, data: object, *, context: str) -> None:
        wait = (await self.client.query(saga_id, context=context)).wait
        assert wait is not None, f"{saga_id} does not wait"
        assert wait.step == step, f"{saga_id} waits at {wait.step}, not {step}"
        assert wait.token, f"{saga_id} does not wait for a signal"
        await self.client.signal(wait.token, data)

    async def publish(self, stream: str, message: object) -> None:
        await Publisher(self.redis, source="another-context").publish(stream, message)

    async def summary(self, definition: Saga[Any], saga_id: str) -> tuple[Summary, SagaState]:
        state = await self.client.get(saga_id, context=definition.context.name)
        partition = Partition(definition.context.name, 0)
        raw = await self.redis.lrange(partition.history(saga_id), 0, -1)
        assert replay(self.definitions, raw, saga_id=saga_id, state=state) == state
        history = decode_history(raw, state=state)
        assert invariant_violations(definition, state, history) == []
        return summarize(state, history), state
