"""The web UI's task inbox in a real browser (Debian's headless Chromium, as
tests/ui/test_browser.py drives it): the open tasks of a role, soonest due first, with a
title holding markup shown as text. The sagas run on this session's real Redis, in a
database of their own."""

from __future__ import annotations

import re
from collections.abc import Iterator

import anyio
import anyio.from_thread
import pytest
from playwright.sync_api import Page, expect

import bus
import tests.conftest as session
from bus import FakeClock
from saga import App, SagaClient, SagaWorker
from tests.conftest import require_server
from tests.saga.task_sagas import Refund, lenient, refund
from tests.ui.test_browser import MARKUP, browser, database_url, flush, page, serving

pytestmark = [pytest.mark.browser, pytest.mark.redis, pytest.mark.slow]
__all__ = ["browser", "page"]  # the browser module's fixtures, used here
DATABASE = 14
"""This module's own database on the session's Redis (the demo's is 15, the others flush 0)."""
REFUNDS = App("refunds", sagas=[refund, lenient])


async def _fill(url: str) -> None:
    redis = bus.connect(url)
    try:
        await redis.flushdb()
        clock = FakeClock(1_800_000_000_000)
        client = SagaClient(redis, REFUNDS.registry, clock=clock)
        await client.start(refund, Refund(id=MARKUP, amount=900), saga_id="big-refund")  # due in 4 h
        await client.start(lenient, Refund(id="soon", amount=500), saga_id="soon-refund")  # due in 1 h
        worker = SagaWorker(redis, REFUNDS, clock=clock, consumer="browser-test")
        await worker.register()  # the UI finds the context and its partitions in the registry
        await worker.run_until_idle()
    finally:
        await redis.aclose()


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    require_server("Redis", session.REDIS_URL)
    url = database_url(DATABASE)
    with anyio.from_thread.start_blocking_portal() as portal:
        portal.call(_fill, url)
        with serving(url) as served:
            yield served
        portal.call(flush, url)


def test_a_roles_open_tasks_soonest_due_first_with_markup_shown_as_text(page: Page) -> None:
    page.goto("/")
    page.get_by_role("link", name="Tasks", exact=True).click()
    expect(page).to_have_url(re.compile(r"/tasks$"))
    expect(page.locator("p.empty")).to_contain_text("Name a role or a person")
    page.get_by_label("assigned to").select_option("role")
    page.get_by_label("name").fill("managers")
    page.get_by_role("button", name="Show").click()
    expect(page).to_have_url(re.compile(r"/tasks\?kind=role&name=managers"))
    expect(page.locator("#assignee")).to_have_text("managers")
    rows = page.locator("table.tasks tbody tr")
    expect(rows).to_have_count(2)
    assert page.locator("table.tasks td.title").all_inner_texts() == [
        "Approve",  # the lenient refund: due in an hour
        f"Approve refund {MARKUP} of 900",  # due in four
    ]
    assert page.locator("table.tasks a.saga-id").all_inner_texts() == ["soon-refund", "big-refund"]
    expect(page.locator("main b, main svg, [onload]")).to_have_count(0)
    assert page.evaluate("typeof window.pwned") == "undefined"
    expect(page.get_by_label("name")).to_have_value("managers")  # the form shows what it lists

    page.get_by_role("link", name="big-refund", exact=True).click()
    expect(page.locator("#saga-id")).to_have_text("big-refund")
    expect(page.locator("h1 .status")).to_have_text("suspended")

    page.goto("/tasks?kind=user&name=ann")
    expect(page.locator("td.empty")).to_have_text("No open tasks.")
