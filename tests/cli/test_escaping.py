"""Control characters in what the CLI prints are escaped: an escape sequence in a saga id,
a step's error, a payload or a dead letter cannot recolour or drive the terminal, and a
newline in an id cannot split a table row. Each kind of output is checked on sagas and dead
letters whose ids and fields hold ESC ``[31m``, a newline, a carriage return and a bell; and
no human output shows a Python ``True``, ``False`` or ``None``."""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import anyio
import msgspec
import pytest
from typer.testing import CliRunner

import bus
import relay
from bus import FakeClock
from redsaga.cli.main import app as cli
from redsaga.examples.orders import order_fulfilment
from saga import SagaClient, SagaStatus, SagaWorker
from saga.ops.text import printable
from saga.store.keys import Partition
from tests.ops.live import APP_REF, flush
from tests.ops.scenario import CONFIG, app, order
from tests.relay.helpers import Charged

pytestmark = pytest.mark.redis
runner = CliRunner()
EVIL = "A\x1b[31mB\nC\rD\x07E"
RAW = ("\x1b", "\r", "\x07", "B\nC")
COMPENSATED = f"ord-{EVIL}"
DEAD = f"dead-{EVIL}"
PARTITION = Partition("orders", 0)
SAFE = {COMPENSATED: "ord-evil", DEAD: "dead-evil"}
"""The ids the sagas are started under: the API refuses control characters in ids, so the
test moves them to the hostile ids afterwards, as a writer going around the API would."""


@dataclass(frozen=True, slots=True)
class Evil:
    url: str
    outbox: str

    @property
    def env(self) -> dict[str, str]:
        return {"REDSAGA_REDIS_URL": self.url, "REDSAGA_APP": APP_REF, "REDSAGA_OPERATOR": f"op{EVIL}"}


async def _drive(url: str) -> None:
    """A saga compensated with an error naming EVIL, one dead-lettered, and two dead letters."""
    redis = bus.connect(url)
    clock = FakeClock()
    try:
        await redis.flushdb()
        worker = SagaWorker(redis, app, config=CONFIG, clock=clock, consumer=f"w{EVIL}")
        client = SagaClient(redis, app.registry, clock=clock)
        await client.start(
            order_fulfilment, order(COMPENSATED, customer=EVIL, card="declined"), saga_id=SAFE[COMPENSATED]
        )
        await client.start(order_fulfilment, order(DEAD, region="down"), saga_id=SAFE[DEAD])
        for _ in range(40):
            await worker.run_until_idle()
            clock.advance(15)
        assert (await client.get(SAFE[COMPENSATED])).status == SagaStatus.COMPENSATED
        assert (await client.get(SAFE[DEAD])).status == SagaStatus.DEAD_LETTERED
        for hostile, safe in SAFE.items():
            await _move(redis, safe, hostile)
        await redis.xadd(PARTITION.inbox.key, {"garbage": EVIL})  # malformed: dead-lettered raw
        hostile = bus.Envelope(
            id=f"x{EVIL}", type=f"Card{EVIL}", payload=b"{}", created_at_ms=1, correlation_id=DEAD
        )
        await redis.xadd(PARTITION.inbox.key, hostile.to_fields())  # type: ignore[arg-type]
        await worker.run_until_idle()
        await redis.set("rs:epoch", EVIL)
    finally:
        await redis.aclose()


async def _move(redis: bus.Redis, safe: str, hostile: str) -> None:
    """Move a saga's keys and index entries from its id to ``hostile``."""
    for key in (PARTITION.saga, PARTITION.history, PARTITION.branches):
        if await redis.exists(key(safe)):
            await redis.rename(key(safe), key(hostile))
    for index in await redis.keys(f"rs:{{{PARTITION.tag}}}:*"):  # a private server: KEYS is fine here
        if await redis.type(index) == b"zset" and (score := await redis.zscore(index, safe)) is not None:
            await redis.zadd(index, {hostile: score})
            await redis.zrem(index, safe)


def _outbox(path: Path) -> str:
    dsn = f"sqlite:///{path}"
    anyio.run(relay.init_db, dsn)
    conn = sqlite3.connect(path)
    failed = relay.outbox.add(conn, "payments", Charged(order="o1"))
    conn.commit()
    conn.execute(
        "UPDATE redsaga_outbox SET status = 2, error = ?, type = ? WHERE id = ?", (EVIL, EVIL, failed)
    )
    conn.commit()
    conn.close()
    return dsn


@pytest.fixture
def evil(real_redis_url: str, tmp_path: Path) -> Iterator[Evil]:
    anyio.run(_drive, real_redis_url)
    try:
        yield Evil(real_redis_url, _outbox(tmp_path / "outbox.db"))
    finally:
        flush(real_redis_url)


def saga(evil: Evil, *args: str, code: int = 0) -> str:
    """Run a command; its stdout and stderr, checked to hold no raw control character."""
    result = runner.invoke(cli, list(args), env=evil.env)
    assert result.exit_code == code, (args, result.stdout, result.stderr)
    output = result.stdout + result.stderr
    for raw in RAW:
        assert raw not in output, (args, raw, output)
    if "--json" not in args:  # human output reads as words, not Python values
        assert not re.search(r"\b(True|False|None)\b", output), (args, output)
    return output


def _letters(evil: Evil) -> list[dict[str, object]]:
    return msgspec.json.decode(runner.invoke(cli, ["dlq", "list", "--json"], env=evil.env).stdout)


def test_tables_of_sagas(evil: Evil) -> None:
    shown = saga(evil, "list")
    assert printable(COMPENSATED) in shown
    assert printable(DEAD) in shown
    assert len(shown.strip().splitlines()) == 1 + 2 + 2  # header, two rows, blank line and the range
    assert printable(COMPENSATED) in saga(evil, "list", "--status", "compensated")


def test_inspect_lines_tables_history_and_graph(evil: Evil) -> None:
    shown = saga(evil, "inspect", COMPENSATED)
    assert f"saga {printable(COMPENSATED)}" in shown
    assert printable(f"card of {EVIL} declined") in shown  # the error chain
    history = saga(evil, "inspect", COMPENSATED, "--history")
    assert printable(EVIL) in history  # the attempt inputs carry the customer
    saga(evil, "inspect", COMPENSATED, "--graph")


def test_dead_letter_list_and_show(evil: Evil) -> None:
    listed = saga(evil, "dlq", "list")
    assert printable(DEAD) in listed
    shown = [saga(evil, "dlq", "show", str(letter["id"])) for letter in _letters(evil)]
    # the raw copy's packed envelope, decoded item by item, is escaped like the rest
    assert any(f"e.type: {printable(f'Card{EVIL}')}" in show for show in shown), shown


def test_actions_replay_start_stats_and_errors(evil: Evil) -> None:
    assert printable(DEAD) in saga(evil, "cancel", DEAD, "--reason", EVIL, "--wait", "0", code=3)
    # moved to its hostile id after it ran, the saga replays as if it had run under it: its
    # state and history derive the command and timer ids from the id on reading
    assert printable(COMPENSATED) in saga(evil, "replay", COMPENSATED)
    refused = saga(
        evil,
        "start",
        "order_fulfilment",
        "--data",
        msgspec.json.encode(order("n")).decode(),
        "--id",
        EVIL,
        code=1,
    )
    assert refused.startswith(f"error: invalid saga id {printable(repr(EVIL))}")  # ids may not hold them
    saga(evil, "stats")
    error = saga(evil, "inspect", f"nope{EVIL}", code=1)
    assert printable(f"nope{EVIL}") in error


def test_epoch_schedules_and_the_outbox(evil: Evil) -> None:
    assert saga(evil, "epoch", "show") == printable(EVIL) + "\n"
    data = msgspec.json.encode(order("s")).decode()
    created = saga(
        evil, "schedule", "create", EVIL, "--context", "orders", "--saga", "order_fulfilment",
        "--cron", "@daily", "--data", data,
    )  # fmt: skip
    assert printable(EVIL) in created
    assert printable(EVIL) in saga(evil, "schedule", "list", "--context", "orders")
    assert printable(EVIL) in saga(evil, "relay", "failed", "--dsn", evil.outbox)


def _strings(value: object) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def test_json_output_is_escaped_by_the_encoder(evil: Evil) -> None:
    for args in (
        ["list"],
        ["inspect", COMPENSATED],
        ["dlq", "list"],
        ["relay", "failed", "--dsn", evil.outbox],
    ):
        document = msgspec.json.decode(saga(evil, *args, "--json"))  # no raw control character, yet
        assert any(EVIL in text for text in _strings(document)), args  # the values are intact
