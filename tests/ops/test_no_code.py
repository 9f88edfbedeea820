"""Operations with a Redis URL and no application code, as an operator on call has them.

A worker registers an app (written to a temporary module for this test only), then the
``saga`` command runs as a subprocess with only ``REDSAGA_REDIS_URL``: no ``--app``, no
``REDSAGA_APP``, and the app's module is not importable there. Everything an operator reads,
and cancel, retry, force-complete and dead-letter requeue, works from what is in Redis.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import anyio
import msgspec
import pytest
from typer.testing import CliRunner

import bus
from bus import FakeClock
from redsaga.cli.main import app as cli
from saga import SagaAdmin, SagaClient, SagaWorker
from saga.store.keys import Partition, partition_of
from tests.helpers import eventually
from tests.ops.live import background_worker

pytestmark = [pytest.mark.redis, pytest.mark.slow]
SAGA = Path(sys.executable).parent / "saga"
runner = CliRunner()
MODULE = "vault_ops_app"
APP_SOURCE = """
from datetime import timedelta

import msgspec
from bus import TransientError
from saga import App, Command, CommandContext, Context, Participant, Retry, Saga, StepContext, command

VAULT = Context("vault", partitions=2)
FIXED: set[str] = set()


class Job(msgspec.Struct):
    id: str
    mode: str = "ok"  # "down": the archive fails until FIXED names the job; "hold": sleeps a day


class Open(msgspec.Struct, tag=True):
    id: str


class Opened(msgspec.Struct, tag=True):
    ticket: str


class Close(msgspec.Struct, tag=True):
    ticket: str


class Closed(msgspec.Struct, tag=True):
    pass


class File(msgspec.Struct, tag=True):
    id: str
    mode: str


class Filed(msgspec.Struct, tag=True):
    receipt: str
    pages: int = 1


job = Saga("vault_job", version=1, context=VAULT, data=Job)


@job.step(reply=Opened, compensate="close")
def open_ticket(data: Job) -> Command:
    return command("clerk", Open(id=data.id))


@job.compensation()
def close(_data: Job, ctx: StepContext) -> Command:
    return command("clerk", Close(ticket=ctx.output(open_ticket).ticket))


job.sleep("cool_off", lambda data: timedelta(days=1 if data.mode == "hold" else 0))


@job.step(reply=Filed, retry=Retry(attempts=2, initial=1.0, on_exhausted="dead_letter"))
def file(data: Job) -> Command:
    return command("clerk", File(id=data.id, mode=data.mode))


clerk = Participant("clerk", serves=[VAULT])


@clerk.handles(Open)
async def do_open(message: Open, ctx: CommandContext) -> Opened:
    return Opened(ticket="t-" + message.id)


@clerk.handles(Close)
async def do_close(message: Close, ctx: CommandContext) -> Closed:
    return Closed()


@clerk.handles(File)
async def do_file(message: File, ctx: CommandContext) -> Filed:
    if message.mode == "down" and message.id not in FIXED:
        raise TransientError("archive down")
    return Filed(receipt="r-" + message.id)


app = App("vault", sagas=[job], participants=[clerk])
"""


def load_app(directory: Path) -> ModuleType:
    (directory / f"{MODULE}.py").write_text(textwrap.dedent(APP_SOURCE))
    sys.path.insert(0, str(directory))
    try:
        return importlib.import_module(MODULE)
    finally:
        sys.path.remove(str(directory))


@pytest.fixture
def vault(real_redis_url: str, tmp_path: Path) -> Iterator[tuple[ModuleType, FakeClock]]:
    """The app's sagas driven into their states two hours ago, as the app's worker left them."""
    (tmp_path / "code").mkdir()
    module = load_app(tmp_path / "code")
    clock = FakeClock(start_ms=time.time_ns() // 1_000_000 - 2 * 3_600_000)

    async def drive() -> None:
        redis = bus.connect(real_redis_url)
        try:
            await redis.flushdb()
            worker = SagaWorker(redis, module.app, clock=clock, consumer="vault-1")
            await worker.register()
            client = SagaClient(redis, module.app.registry, clock=clock)
            for saga_id, mode in (("done", "ok"), ("down-1", "down"), ("down-2", "down"), ("hold", "hold")):
                await client.start("vault_job", module.Job(id=saga_id, mode=mode), saga_id=saga_id)
            for _ in range(5):
                await worker.run_until_idle()
                clock.advance(2)
            garbage = Partition("vault", partition_of("done", 2)).inbox.key
            await redis.xadd(garbage, {"garbage": "1"})
            await worker.run_until_idle()
            for saga_id, status in (
                ("done", "completed"),
                ("down-1", "dead_lettered"),
                ("hold", "suspended"),
            ):
                assert (await client.get(saga_id)).status == status
        finally:
            await redis.aclose()

    anyio.run(drive)
    sys.modules.pop(MODULE, None)
    yield module, clock
    anyio.run(_flush, real_redis_url)


async def _flush(url: str) -> None:
    redis = bus.connect(url)
    try:
        await redis.flushdb()
    finally:
        await redis.aclose()


SUBPROCESS = {"list", "stats", "cancel", "force-complete"}
"""Commands also run as their own process (the rest run in this one, where the app's module is
not importable either: its directory left ``sys.path`` and ``sys.modules`` after the drive)."""


def saga(url: str, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("REDSAGA_APP", "PYTHONPATH")}
    env |= {"REDSAGA_REDIS_URL": url, "REDSAGA_OPERATOR": "bob@oncall"}
    if args[0] in SUBPROCESS:
        done = subprocess.run(
            [str(SAGA), *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=60, check=False
        )
    else:
        result = runner.invoke(cli, list(args), env={**env, "REDSAGA_APP": ""})
        done = subprocess.CompletedProcess(args, result.exit_code, result.stdout, result.stderr)
    assert "Traceback" not in done.stderr, done.stderr
    assert MODULE not in sys.modules
    return done


def ok(url: str, cwd: Path, *args: str) -> str:
    done = saga(url, cwd, *args)
    assert done.returncode == 0, (args, done.stdout, done.stderr)
    return done.stdout


def as_json(url: str, cwd: Path, *args: str) -> object:
    return msgspec.json.decode(ok(url, cwd, *args, "--json"))


def test_an_operator_with_only_a_redis_url(
    vault: tuple[ModuleType, FakeClock], real_redis_url: str, tmp_path: Path
) -> None:
    module, clock = vault
    url, here = real_redis_url, tmp_path
    cannot = subprocess.run(
        [sys.executable, "-c", f"import {MODULE}"], cwd=here, capture_output=True, text=True, check=False
    )
    assert cannot.returncode == 1, "the app's module must not be importable where the CLI runs"
    assert f"No module named '{MODULE}'" in cannot.stderr

    # reading: list, inspect, stats, export, versions
    listed = as_json(url, here, "list")
    assert {r["id"]: r["status"] for r in listed["rows"]} == {  # type: ignore[index]
        "done": "completed",
        "down-1": "dead_lettered",
        "down-2": "dead_lettered",
        "hold": "suspended",
    }
    assert listed["total"] == 4  # type: ignore[index]
    stuck = as_json(url, here, "list", "--stuck-for", "10m")
    assert {r["id"] for r in stuck["rows"]} == {"down-1", "down-2"}  # type: ignore[index]
    assert stuck["waiting"] == 1  # type: ignore[index]  # hold sleeps within its wait
    shown = ok(url, here, "inspect", "down-1")
    assert "an operator: file ran out of attempts (TransientError: archive down)" in shown
    found = as_json(url, here, "inspect", "down-1")
    assert [s["name"] for s in found["steps"]] == ["open_ticket", "cool_off", "file"]  # type: ignore[index]
    assert [s["kind"] for s in found["steps"]] == ["command", "sleep", "command"]  # type: ignore[index]
    assert found["steps"][0]["compensation"] == "close"  # type: ignore[index]
    assert found["history_omitted"] is True  # type: ignore[index]
    held = as_json(url, here, "inspect", "hold")
    assert (held["wait"]["step"], held["wait"]["kind"]) == ("cool_off", "sleep")  # type: ignore[index]
    assert found["wait"] is None  # type: ignore[index]
    drawn = ok(url, here, "inspect", "down-1", "--graph")  # from the registered shape
    assert "open_ticket -.->|compensate| undo_open_ticket" in drawn
    assert "    class open_ticket,cool_off done" in drawn
    assert "    class file failed" in drawn
    stats = as_json(url, here, "stats")
    assert (stats["in_flight"], stats["stuck"], stats["waiting"]) == (3, 2, 1)  # type: ignore[index]
    streams = {s["stream"] for s in stats["streams"]}  # type: ignore[index]
    assert {"rs:{vault:0}:cmd:clerk", "rs:{vault:1}:cmd:clerk", "rs:{vault:1}:inbox"} <= streams
    trace = as_json(url, here, "export", "done")
    assert trace["steps"] == ["open_ticket", "cool_off", "file"]  # type: ignore[index]
    assert [v["saga"] for v in as_json(url, here, "versions", "list")] == ["vault_job"]  # type: ignore[union-attr]

    # dead letters: list, show, requeue (and an unknown id is an error)
    [letter] = as_json(url, here, "dlq", "list")  # type: ignore[misc]
    assert letter["reason"].startswith("malformed entry")
    assert "cannot be requeued" not in ok(url, here, "dlq", "show", letter["id"])
    assert as_json(url, here, "dlq", "requeue", letter["id"])[0]["outcome"] == "requeued"  # type: ignore[index]
    assert saga(url, here, "dlq", "requeue", letter["id"]).returncode == 1

    # what needs the code says so
    no_code = saga(url, here, "replay", "done")
    assert (no_code.returncode, no_code.stderr) == (
        1,
        (
            "error: replay needs the code of vault_job@1: give the App that defines it "
            "(--app module:attribute, or REDSAGA_APP)\n"
        ),
    )
    assert saga(url, here, "start", "vault_job", "--data", '{"id": "x"}').returncode == 1

    # acting, with the app's worker deciding (it has the code; the CLI has not)
    with background_worker(url, module.app, clock):
        refused = saga(url, here, "retry", "hold")
        assert refused.returncode == 1
        assert "retry applies to dead-lettered sagas, this one is suspended" in refused.stderr
        bad = saga(
            url,
            here,
            "force-complete",
            "down-2",
            "--step",
            "file",
            "--output",
            '{"receipt": 7}',
            "--reason",
            "r",
        )
        assert bad.returncode == 1
        assert "the output is not a valid Filed for vault_job@1.file: 7 is not of type 'string'" in bad.stderr
        # what the state alone cannot tell, the orchestrator (which has the code) judges and refuses
        early = ["--step", "open_ticket", "--output", '{"ticket": "t"}', "--reason", "r"]
        not_stuck = saga(url, here, "force-complete", "down-2", *early)
        assert not_stuck.returncode == 1
        assert not_stuck.stderr.startswith(
            "error: force-complete of saga down-2 was ignored: step 'open_ticket'"
        )
        forced = ok(
            url,
            here,
            "force-complete",
            "down-2",
            "--step",
            "file",
            "--output",
            '{"receipt": "m-1"}',
            "--reason",
            "filed by hand (INC-9)",
        )
        assert "force-complete of down-2 applied" in forced
        assert "now completed" in forced
        output = as_json(url, here, "inspect", "down-2")["steps"][2]["output"]  # type: ignore[index]
        assert output == {"type": "Filed", "receipt": "m-1"}
        module.FIXED.add("down-1")
        assert "retry of down-1 applied" in ok(url, here, "retry", "down-1", "--reason", "archive is back")
        cancelled = ok(url, here, "cancel", "hold", "--reason", "customer left")
        assert "cancel of hold applied" in cancelled
        assert "sends       open_ticket/undo #1 -> clerk Close" in cancelled

        async def ended() -> bool:
            redis = bus.connect(url)
            try:
                client = SagaClient(redis, module.app.registry)
                found = {i: (await client.get(i)).status for i in ("down-1", "down-2", "hold")}
            finally:
                await redis.aclose()
            return found == {"down-1": "completed", "down-2": "completed", "hold": "cancelled"}

        anyio.run(eventually, ended, 30, "the worker ended the sagas the operator moved on")
    history = as_json(url, here, "inspect", "down-1", "--history")
    assert history["history_omitted"] is False  # type: ignore[index]
    assert any(r["summary"] == "retry requested by bob@oncall: archive is back" for r in history["timeline"])  # type: ignore[index]


def test_a_wait_past_its_deadline_is_stuck(vault: tuple[ModuleType, FakeClock], real_redis_url: str) -> None:
    async def main() -> None:
        redis = bus.connect(real_redis_url)
        try:
            admin = await SagaAdmin.from_redis(redis)
            stats = await admin.stats(stuck_for_ms=600_000)
            assert (stats.stuck, stats.waiting) == (2, 1)
            # the hold saga's sleep timer is past due and nothing fired it: stuck, not waiting
            partition = Partition("vault", partition_of("hold", 2))
            timer = (await admin.get("hold")).steps["cool_off"].timer
            await redis.zadd(partition.timers, {timer: 1})
            stats = await admin.stats(stuck_for_ms=600_000)
            assert (stats.stuck, stats.waiting) == (3, 0)
            page = await admin.list(stuck_for_ms=600_000)
            assert ({r.id for r in page.rows}, page.total, page.waiting) == (
                {"down-1", "down-2", "hold"},
                3,
                0,
            )
            tally = await admin.tally(stuck_for_ms=600_000, status="suspended")
            assert (tally.total, tally.waiting) == (1, 0)
        finally:
            await redis.aclose()

    anyio.run(main)
