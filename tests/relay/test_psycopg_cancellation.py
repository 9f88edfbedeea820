"""A task cancelled while it opens a psycopg transaction leaves its connection outside it.

A worker cancels a handler whose lease was lost (and each one still running when it shuts
down), wherever the handler is: also while ``async with conn.transaction()`` sends its
``BEGIN``. psycopg before 3.3.7 then left the connection inside that transaction and
believed it still in the block, so every later statement on the connection, the next
handler's included, ran in a transaction nobody would commit: effects that the handlers
reported done were lost when the process ended. The soak of ``tests/faults`` showed it on
psycopg 3.2.3. This test holds the declared lower bound to a version that undoes the
interrupted ``BEGIN``; it fails on 3.3.6.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import anyio
import psycopg
import pytest

pytestmark = [pytest.mark.anyio, pytest.mark.postgres]

LOOP_TURNS = range(6)
"""How many turns of the event loop the transaction gets before it is cancelled: 0 cancels it
before it starts, 1 while its BEGIN is in flight, the others at each later await."""


@pytest.fixture
async def table(pg_dsn: str) -> AsyncIterator[str]:
    name = f"t{uuid.uuid4().hex[:12]}_effects"
    async with await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as admin:
        await admin.execute(f"CREATE TABLE {name} (k int PRIMARY KEY)")  # type: ignore[arg-type]
        try:
            yield name
        finally:
            await admin.execute(f"DROP TABLE {name}")  # type: ignore[arg-type]


async def test_a_transaction_cancelled_at_any_await_leaves_the_connection_usable(
    pg_dsn: str, table: str
) -> None:
    insert = f"INSERT INTO {table} VALUES (%s)"
    async with (
        await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as handler_conn,
        await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as observer,
    ):

        async def effect(k: int) -> None:
            async with handler_conn.transaction():
                await handler_conn.execute(insert, (k,))  # type: ignore[arg-type]

        for turns in LOOP_TURNS:
            cancelled = asyncio.create_task(effect(-turns - 1))
            for _ in range(turns):
                await anyio.lowlevel.checkpoint()
            cancelled.cancel()
            with pytest.raises(asyncio.CancelledError):
                await cancelled
            status = handler_conn.info.transaction_status
            idle = psycopg.pq.TransactionStatus.IDLE
            assert status == idle, f"cancelled after {turns} turns: {status.name}"

            await effect(turns)  # the next handler's effect on the same connection
            cursor = await observer.execute(f"SELECT count(*) FROM {table} WHERE k = %s", (turns,))  # type: ignore[arg-type]
            row = await cursor.fetchone()
            assert row == (1,), f"an effect after a cancel {turns} turns in was not committed"
