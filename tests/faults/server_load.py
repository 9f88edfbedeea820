"""Saga load on a private Redis for server-fault tests, and the checks run after each fault.

:class:`SagaLoad` starts crash sagas (``tests/saga/crash_app.py``) on a
:class:`~tests.faults.servers.PrivateRedis`, runs worker processes of
``tests.faults.server_app`` (effects in PostgreSQL) and, once every saga ended, checks the
invariants: G1 (each saga reached the end its job calls for), G2 (each idempotency key
took effect at most once, and exactly the keys its end calls for), G3 (undo in reverse
order; the keys are listed in order of effect) and G4 (history revisions 1, 2, 3… with no
gap or repeat).
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import msgspec
import psycopg
import pytest

import bus
from saga import HistoryEntry, SagaClient, SagaStatus
from tests.faults import server_app
from tests.faults.servers import PrivateRedis
from tests.saga.crash_app import Job, app, crash, expected_effects


@dataclass
class SagaLoad:
    """Crash sagas and their worker processes on one private Redis."""

    server: PrivateRedis
    dsn: str
    prefix: str
    log: Path
    sagas: int = 200
    seed: int = field(default_factory=lambda: random.randrange(1 << 30))
    workers: list[subprocess.Popen[bytes]] = field(default_factory=list)
    jobs: list[Job] = field(default_factory=list)

    def spawn(self, url: str | None = None) -> subprocess.Popen[bytes]:
        """Start one worker process on ``url`` (default: the private server)."""
        env = {
            **os.environ,
            server_app.URL_ENV: url or self.server.url,
            server_app.DSN_ENV: self.dsn,
            server_app.TABLE_ENV: self.prefix,
        }
        with self.log.open("ab") as sink:
            process = subprocess.Popen(
                [sys.executable, "-m", "tests.faults.server_app"], env=env, stdout=sink, stderr=sink
            )
        self.workers.append(process)
        return process

    def stop_workers(self) -> None:
        """SIGKILL every worker this load started."""
        for process in self.workers:
            if process.poll() is None:
                process.kill()
            process.wait()

    async def start(self, redis: bus.Redis) -> None:
        """Start the sagas: about one in four fails at a step and compensates."""
        rng = random.Random(self.seed)
        self.jobs = [
            Job(id=f"job-{n}", fail_at=rng.choice(["", "", "", "two", "three"])) for n in range(self.sagas)
        ]
        client = SagaClient(redis, app.registry)
        for job in self.jobs:
            await client.start(crash, job, saga_id=job.id)

    async def ended(self, redis: bus.Redis) -> int:
        """How many sagas reached an end."""
        counts = await SagaClient(redis, app.registry).counts()
        return sum(n for (_, status), n in counts.items() if SagaStatus(status).terminal)

    async def wait_ended(self, redis: bus.Redis, at_least: int, *, within_s: float) -> None:
        """Poll until ``at_least`` sagas ended (an observable count, not time passing)."""
        with anyio.fail_after(within_s):
            while await self.ended(redis) < at_least:
                await anyio.sleep(0.01)

    def runs(self) -> int:
        """Handler runs that recorded an effect or found it recorded already."""
        with psycopg.connect(self.dsn) as conn:
            row = conn.execute(f"SELECT count(*) FROM {self.prefix}_runs").fetchone()  # type: ignore[arg-type]
        assert row is not None
        return int(row[0])

    def effects(self) -> list[str]:
        """The idempotency keys that took effect, in order (a duplicate shows up twice)."""
        with psycopg.connect(self.dsn) as conn:
            rows = conn.execute(f"SELECT key FROM {self.prefix}_effects ORDER BY n").fetchall()  # type: ignore[arg-type]
        return [str(key) for (key,) in rows]

    async def check(self, redis: bus.Redis) -> None:
        """G1-G4 over every saga (see the module docstring)."""
        effects = self.effects()
        tag = f"seed {self.seed}"
        assert len(effects) == len(set(effects)), f"{tag}: an effect was applied twice"
        client = SagaClient(redis, app.registry)
        for job in self.jobs:
            state = await client.get(job.id)
            expected_end = SagaStatus.COMPENSATED if job.fail_at else SagaStatus.COMPLETED
            assert state.status == expected_end, f"{tag}: {job.id} ended {state.status}"
            mine = [e for e in effects if e.startswith(f"{job.id}:")]
            assert mine == expected_effects(job, state.status), f"{tag}: {job.id} effects {mine}"
            history = [
                msgspec.json.decode(raw, type=HistoryEntry)
                for raw in await redis.lrange(f"rs:{{crashctx:0}}:hist:{job.id}", 0, -1)
            ]
            revisions = [h.revision for h in history if not h.ignored]
            assert revisions == list(range(1, len(revisions) + 1)), f"{tag}: {job.id} revisions {revisions}"


async def rewrite_aof(redis: bus.Redis) -> None:
    """``BGREWRITEAOF`` and wait for it: what was written so far is in an fsynced base file."""
    await redis.bgrewriteaof()
    with anyio.fail_after(20):
        while True:
            info = await redis.info("persistence")
            if not int(info["aof_rewrite_in_progress"]) and not int(info["aof_rewrite_scheduled"]):
                return
            await anyio.sleep(0.02)


@pytest.fixture
def effects_tables(pg_dsn: str) -> Iterator[str]:
    """A unique table prefix in the shared test database; the tables are dropped after."""
    prefix = f"srvfault_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        server_app.create_tables(conn, prefix)
    try:
        yield prefix
    finally:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            server_app.drop_tables(conn, prefix)
