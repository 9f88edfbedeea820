"""A saga waiting for a concurrency key's slot, in a real browser (Debian's headless Chromium,
as tests/ui/test_browser.py drives it): its page says whose slot it waits for and its place
in line, read from Redis with no code (the UI's admin knows only the registered shapes)."""

from __future__ import annotations

from collections.abc import Iterator

import anyio
import anyio.from_thread
import pytest
from playwright.sync_api import Page, expect

import bus
import tests.conftest as session
from saga import EngineConfig, Key, SagaClient, SagaWorker
from saga.ops.ui.formatting import saga_href
from tests.conftest import require_server
from tests.flow.key_sagas import Withdrawal, bank, withdrawal_saga
from tests.ui.test_browser import browser, database_url, flush, page, serving

pytestmark = [pytest.mark.browser, pytest.mark.redis, pytest.mark.slow]
__all__ = ["browser", "page"]  # the browser module's fixtures, used here
DATABASE = 12
"""This module's own database on the session's Redis (15, 14 and 13 are the other browser modules')."""
CONFIG = EngineConfig(auth=bus.SIGNING_OFF)


async def _queue(url: str) -> None:
    """Four withdrawals from one account: one runs (its ledger never answers), three wait."""
    redis = bus.connect(url)
    try:
        await redis.flushdb()
        saga = withdrawal_saga(Key(lambda d: d.account))
        worker = SagaWorker(redis, bank(saga, with_ledger=False), config=CONFIG)
        await worker.register()  # the shapes the UI reads
        client = SagaClient(redis, worker.app.registry, config=CONFIG)
        for n in range(4):
            await client.start(saga, Withdrawal("acct-42"), saga_id=f"w{n}")
        await worker.run_until_idle()
    finally:
        await redis.aclose()


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    require_server("Redis", session.REDIS_URL)
    url = database_url(DATABASE)
    with anyio.from_thread.start_blocking_portal() as portal:
        portal.call(_queue, url)
        with serving(url) as served:
            yield served
        portal.call(flush, url)


def test_a_waiting_saga_shows_whose_slot_it_waits_for_and_its_place(page: Page) -> None:
    page.goto(saga_href("w2"))
    expect(page.locator(".waiting-for")).to_contain_text(
        "a slot of withdraw acct-42, 2nd in line (3 waiting)"
    )
    page.goto(saga_href("w0"))  # the holder waits for its participant, as any running saga
    expect(page.locator(".waiting-for")).to_contain_text("a reply from ledger to Debit")
