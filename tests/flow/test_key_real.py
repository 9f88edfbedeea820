"""One saga per account at a time, through three worker processes, one of them killed mid-run.

200 withdrawals over 10 accounts (limit 1), started in order per account. The checks read the
ledger participant's own records (each effect once, with the time it ran): for each account,
every saga's debit comes after the previous saga's notify (never two past their first step
at once) and in the order they were started; every saga ends.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import anyio
import pytest

import bus
from saga import SagaClient, SagaStatus
from tests.cluster import LocalCluster, flush
from tests.faults.procs import Procs, owned
from tests.flow.key_app import EFFECTS, URL_ENV, Withdrawal, app, withdraw
from tests.helpers import eventually

pytestmark = [pytest.mark.anyio, pytest.mark.faults, pytest.mark.slow]
ACCOUNTS = 10
PER_ACCOUNT = 20


async def ended(client: SagaClient) -> int:
    return sum(n for (_, status), n in (await client.counts()).items() if SagaStatus(status).terminal)


async def run_bank(redis: bus.Redis, url: str, logs: Path, *, sagas_per_account: int, kill: bool) -> None:
    """Start the sagas through three workers (killing one mid-run), and check the ledger's records."""
    total = ACCOUNTS * sagas_per_account
    with owned(Procs("tests.flow.key_app", logs, {URL_ENV: url})) as procs:
        workers = [await procs.start(f"worker-{n}") for n in range(3)]
        client = SagaClient(redis, app.registry)

        async def start(account: int) -> None:  # in order within an account
            for n in range(sagas_per_account):
                await client.start(withdraw, Withdrawal(f"acct-{account}"), saga_id=f"a{account}-{n:03d}")

        async with anyio.create_task_group() as group:
            for account in range(ACCOUNTS):
                group.start_soon(start, account)
        if kill:
            await eventually(lambda: _at_least(client, total // 3), 120, "a third ended", poll=0.2)
            workers[0].kill()
        await eventually(lambda: _at_least(client, total), 240, "every saga ended", poll=0.5)
        statuses = {(await client.get(f"a{a}-{n:03d}", context="bank")).status
                    for a in range(ACCOUNTS) for n in range(sagas_per_account)}  # fmt: skip
        assert statuses == {SagaStatus.COMPLETED}

    effects = [line.decode().split() for line in await redis.lrange(EFFECTS, 0, -1)]
    assert len(effects) == 2 * total  # each effect once
    when = {(saga_id, step): int(ns) for saga_id, step, ns in effects}
    for account in range(ACCOUNTS):
        ids = [f"a{account}-{n:03d}" for n in range(sagas_per_account)]
        by_start = sorted(ids, key=lambda i: when[(i, "debit")])
        assert by_start == ids, f"acct-{account} ran out of order"
        for earlier, later in itertools.pairwise(ids):
            assert when[(earlier, "notify")] < when[(later, "debit")], f"{earlier} and {later} overlapped"


async def _at_least(client: SagaClient, n: int) -> bool:
    return await ended(client) >= n


@pytest.mark.redis
@pytest.mark.timeout(300)
async def test_200_sagas_over_10_accounts_one_at_a_time_with_a_worker_killed(
    real_redis: bus.Redis, real_redis_url: str, tmp_path: Path
) -> None:
    await run_bank(real_redis, real_redis_url, tmp_path / "logs", sagas_per_account=PER_ACCOUNT, kill=True)


@pytest.mark.cluster
@pytest.mark.timeout(300)
async def test_accounts_spread_over_a_cluster_share_their_lines_across_partitions(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    """Each account's line is a slot of its own, apart from the sagas' partitions' slots."""
    redis = bus.connect(cluster.url)
    try:
        await flush(redis)
        await run_bank(redis, cluster.url, tmp_path / "logs", sagas_per_account=PER_ACCOUNT, kill=True)
    finally:
        await redis.aclose()
