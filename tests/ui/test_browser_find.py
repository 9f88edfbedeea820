"""Finding a saga in the web UI, in a real browser (Debian's headless Chromium, as
tests/ui/test_browser.py drives it): search by id or business key, the time-range filter,
newest first, start times and durations, local time beside UTC, auto-refresh, a saga's
attempts over time, and the live workers. The demo's sagas run on this session's real
Redis, in a database of their own."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import UTC, datetime

import anyio
import anyio.from_thread
import pytest
from playwright.sync_api import Page, expect

import bus
import tests.conftest as session
from redsaga.examples import orders
from redsaga.examples.contracts import Line, Order
from saga import SagaClient
from saga.versions.records import WorkerInfo
from saga.versions.registry import Versions
from tests.conftest import require_server
from tests.ui.test_browser import MARKUP, Demo, _fill, browser, database_url, flush, page, serving

pytestmark = [pytest.mark.browser, pytest.mark.redis, pytest.mark.slow]
__all__ = ["browser", "page"]  # the browser module's fixtures, used here
DATABASE = 13
"""This module's own database on the session's Redis (15 and 14 are the other browser modules')."""


@pytest.fixture(scope="module")
def portal() -> Iterator[anyio.from_thread.BlockingPortal]:
    with anyio.from_thread.start_blocking_portal() as running:
        yield running


@pytest.fixture(scope="module")
def demo(portal: anyio.from_thread.BlockingPortal) -> Iterator[Demo]:
    require_server("Redis", session.REDIS_URL)
    url = database_url(DATABASE)
    yield portal.call(_fill, url)
    portal.call(flush, url)


@pytest.fixture(scope="module")
def base_url(demo: Demo) -> Iterator[str]:
    with serving(demo.url) as url:
        yield url


def _ids(page: Page) -> list[str]:
    return page.locator("table.sagas a.saga-id").all_inner_texts()


def _column(page: Page, index: int) -> list[str]:
    return page.locator(f"table.sagas tbody tr td:nth-child({index})").all_inner_texts()


def test_a_search_for_a_whole_id_opens_the_saga_and_a_part_lists_the_matches(page: Page, demo: Demo) -> None:
    page.goto("/")
    one = demo.compensated[0]
    page.get_by_label("search").fill(one)
    page.get_by_role("button", name="Search").click()
    expect(page.locator("#saga-id")).to_have_text(one)  # straight to its page

    page.goto("/")
    page.get_by_label("search").fill("bold")  # a part of the markup saga's id
    page.get_by_role("button", name="Search").click()
    expect(page).to_have_url(re.compile(r"/\?q=bold$"))
    expect(page.locator("table.sagas tbody tr")).to_have_count(1)
    assert _ids(page) == [MARKUP]
    expect(page.get_by_label("search")).to_have_value("bold")

    page.get_by_label("search").fill("no-such-saga")
    page.get_by_role("button", name="Search").click()
    expect(page.locator("td.empty")).to_have_text("No saga matches.")


def test_newest_first_and_the_time_range_narrow_the_list(page: Page, demo: Demo) -> None:
    page.goto("/?status=completed&status=compensated")
    page.get_by_label("sort").select_option("newest")
    page.get_by_role("button", name="Filter").click()
    expect(page).to_have_url(re.compile(r"sort=newest"))
    moved = page.locator("table.sagas tbody tr td:nth-child(7) time").evaluate_all(
        "times => times.map(t => t.getAttribute('datetime'))"
    )
    assert len(moved) == len(demo.ids)
    assert moved == sorted(moved, reverse=True)

    page.get_by_label("moved within").fill("1d")
    page.get_by_role("button", name="Filter").click()
    expect(page.locator("table.sagas tbody tr")).to_have_count(len(demo.ids))
    began = datetime.now(UTC).isoformat(timespec="milliseconds")
    page.get_by_label("moved within").fill("1ms")
    page.get_by_role("button", name="Filter").click()
    expect(page).to_have_url(re.compile(r"within=1ms"))
    recent = page.locator("table.sagas tbody tr td:nth-child(7) time").evaluate_all(
        "times => times.map(t => t.getAttribute('datetime'))"
    )
    # the demo ran on a clock it moved hours ahead (its approvals wait 4 h): only the sagas
    # that ended ahead of Redis's clock moved within the last millisecond
    assert 0 < len(recent) < len(demo.ids)
    assert all(when > began for when in recent)
    page.get_by_label("moved within").fill("lately")
    page.get_by_role("button", name="Filter").click()
    expect(page.locator(".error-message")).to_have_text(
        "moved within: 'lately' is not a duration (like 90s, 10m, 1h30m, 2d)"
    )


def test_a_from_to_range_in_utc_keeps_the_sagas_that_moved_inside_it(page: Page, demo: Demo) -> None:
    page.goto("/?status=completed&status=compensated&sort=newest")
    column = page.locator("table.sagas tbody tr td:nth-child(7) time")
    moved = column.evaluate_all("times => times.map(t => t.getAttribute('datetime'))")
    middle = moved[len(moved) // 2]
    page.get_by_label("to", exact=True).fill(middle)
    page.get_by_role("button", name="Filter").click()
    expect(page).to_have_url(re.compile(r"to=\d{4}-"))
    kept = column.evaluate_all("times => times.map(t => t.getAttribute('datetime'))")
    assert kept == [when for when in moved if when <= middle]
    page.get_by_label("from", exact=True).fill(moved[0])
    page.get_by_role("button", name="Filter").click()
    expect(page.locator(".error-message")).to_contain_text("the time range ends before it begins")


def test_rows_show_start_duration_and_local_time_beside_utc(
    browser: object, base_url: str, demo: Demo
) -> None:
    context = browser.new_context(base_url=base_url, timezone_id="America/Sao_Paulo")  # type: ignore[attr-defined]
    page = context.new_page()
    page.goto("/?status=completed")
    started = page.locator("table.sagas tbody tr").first.locator("td:nth-child(5)")
    utc = started.locator("time").inner_text()
    local = started.locator("time + .local").inner_text()
    at = datetime.fromisoformat(utc.replace("Z", "+00:00"))
    shifted = at.timestamp() - 3 * 3600  # São Paulo is UTC-03:00, without summer time
    assert datetime.utcfromtimestamp(shifted).strftime("%H:%M:%S") in local  # noqa: DTZ004
    assert "America/Sao_Paulo" in started.locator(".local").get_attribute("title")  # type: ignore[operator]
    took = _column(page, 6)
    assert took
    assert all(re.fullmatch(r"\d+(ms|\.\d+s|s|h \d+m|m \d+s)", t) for t in took), took
    context.close()


def test_auto_refresh_shows_a_new_saga_without_reloading(
    page: Page, demo: Demo, portal: anyio.from_thread.BlockingPortal
) -> None:
    page.goto("/?q=fresh")
    expect(page.locator("td.empty")).to_have_text("No saga matches.")
    page.get_by_label("refresh every 5 s").check()

    async def start() -> None:
        redis = bus.connect(demo.url)
        order = Order(id="fresh", customer="c", lines=[Line(sku="s", quantity=1)], total_cents=1)
        await SagaClient(redis, orders.app.registry).start(orders.order_fulfilment, order, saga_id="fresh-1")
        await redis.aclose()

    portal.call(start)
    expect(page.locator("body[data-refreshed]")).to_be_attached(timeout=15_000)
    expect(page.locator("table.sagas tbody tr")).to_have_count(1)
    assert _ids(page) == ["fresh-1"]
    page.reload()  # the box stays ticked for this page
    expect(page.get_by_label("refresh every 5 s")).to_be_checked()
    page.get_by_label("refresh every 5 s").uncheck()


def test_a_sagas_attempts_over_time_in_the_order_they_ran(page: Page, demo: Demo) -> None:
    page.goto(f"/sagas/{demo.undone_twice}")
    bars = page.locator("#attempts-axis li.bar-row")
    expect(bars).to_have_count(page.locator("tr.attempt").count())
    labels = page.locator("#attempts-axis .bar-label").all_inner_texts()
    assert labels[:3] == ["reserve_stock #1", "charge_payment #1", "arrange_shipping #1"]
    assert labels[-2:] == ["charge_payment #1 (undo)", "reserve_stock #1 (undo)"]
    boxes = [b.bounding_box() for b in page.locator("#attempts-axis .bar").all()]
    assert all(box is not None and box["width"] > 0 for box in boxes)
    lefts = [box["x"] for box in boxes if box is not None]
    assert lefts == sorted(lefts)  # each begins no earlier than the one before
    expect(page.locator("#attempts-axis .bar-undo")).to_have_count(2)


def test_the_workers_page_lists_live_workers_and_who_runs_each_participant(
    page: Page, demo: Demo, portal: anyio.from_thread.BlockingPortal
) -> None:
    page.goto("/workers")
    expect(page.locator("table.workers td.empty")).to_contain_text("No live worker")
    expect(page.locator("table.participants tbody tr")).to_have_count(3)  # the demo's participants

    async def beat() -> None:
        redis = bus.connect(demo.url)
        worker = WorkerInfo(id="orders-1", app="orders", serves=["order_fulfilment@1"], host="h<b>", pid=7)
        await Versions(redis).heartbeat("orders", worker, ttl_ms=60_000)
        await redis.aclose()

    portal.call(beat)
    page.get_by_role("link", name="Workers", exact=True).click()
    row = page.locator("table.workers tbody tr")
    expect(row).to_have_count(1)
    expect(row.locator("td.worker-id")).to_have_text("orders-1")
    expect(row).to_contain_text("h<b>")  # shown as text
    expect(row).to_contain_text("order_fulfilment@1")
