"""The web UI in a real browser: Debian's headless Chromium, driven by Playwright.

The example system's sagas run on this session's real Redis (a database of their own), the
UI serves them from a background thread, and Chromium loads its pages with JavaScript on:
Mermaid draws each diagram, and the checks read the SVG it drew. No test sleeps; Playwright
waits for what it expects to appear.
"""

from __future__ import annotations

import re
import struct
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse, urlunparse

import anyio
import anyio.from_thread
import pytest
from playwright.sync_api import Browser, ConsoleMessage, Page, Response, expect, sync_playwright

import bus
import tests.conftest as session
from redsaga.examples import orders
from redsaga.examples.contracts import Line, Order
from redsaga.examples.demo import run_demo
from saga import SagaAdmin, SagaClient, SagaStatus, SagaWorker
from saga.ops.ui import allowed_hosts, create_app, listen, ui_server
from saga.ops.ui.formatting import saga_href
from saga.store.keys import Partition
from tests.conftest import CHROMIUM, require_browser, require_server

pytestmark = [pytest.mark.browser, pytest.mark.redis, pytest.mark.slow]
MARKUP = "<b>bold</b><svg/onload=window.pwned=1>"
REPO = Path(__file__).resolve().parents[2]
DATABASE = 15
"""The demo's own database on the session's Redis: the other suites flush database 0."""


@dataclass(frozen=True, slots=True)
class Demo:
    """The demo's saga ids, and the one compensated after its shipping failed."""

    url: str
    ids: list[str]
    compensated: list[str]
    undone_twice: str


async def _fill(url: str) -> Demo:
    redis = bus.connect(url)
    try:
        await redis.flushdb()
        report = await run_demo(redis, orders=20, seed=7)  # 2 declined cards, 4 unserved regions
        assert report.unfinished == 0
        admin = await SagaAdmin.from_redis(redis)
        rows = (await admin.list(limit=100)).rows
        compensated = [r.id for r in rows if r.status == SagaStatus.COMPENSATED]
        steps = {i: (await admin.get(i)).steps for i in compensated}
        shipped = [
            i for i in compensated if "arrange_shipping" in steps[i] and steps[i]["arrange_shipping"].attempts
        ]
        # a saga with markup in its id, waiting for inventory (no participant runs now)
        order = Order(id="markup", customer="c", lines=[Line(sku="s", quantity=1)], total_cents=1)
        await SagaClient(redis, orders.app.registry).start(orders.order_fulfilment, order, saga_id=MARKUP)
        # an entry that is no envelope: the orchestrator dead-letters it
        await redis.xadd(
            Partition("orders", 0).inbox.key, {"<i>field</i>": "<script>window.pwned=2</script>"}
        )
        await SagaWorker(redis, orders.app, consumer="browser-test").run_until_idle()
        return Demo(url=url, ids=[r.id for r in rows], compensated=compensated, undone_twice=shipped[0])
    finally:
        await redis.aclose()


def database_url(database: int) -> str:
    """The session's Redis, in ``database`` (each browser module fills and flushes its own)."""
    return urlunparse(urlparse(session.REDIS_URL)._replace(path=f"/{database}"))


async def flush(url: str) -> None:
    """Empty the database at ``url`` once a module's pages are checked."""
    redis = bus.connect(url)
    try:
        await redis.flushdb()
    finally:
        await redis.aclose()


@pytest.fixture(scope="module")
def demo() -> Iterator[Demo]:
    require_server("Redis", session.REDIS_URL)
    url = database_url(DATABASE)
    # in a thread of its own: Playwright's sync API runs an event loop in this one
    with anyio.from_thread.start_blocking_portal() as portal:
        yield portal.call(_fill, url)
        portal.call(flush, url)


@contextmanager
def serving(url: str) -> Iterator[str]:
    """Serve the UI over the Redis at ``url`` from a background thread; its base URL."""
    sock = listen("127.0.0.1", 0)  # listening now: a request made before the server runs waits
    with anyio.from_thread.start_blocking_portal() as portal:

        async def connect() -> bus.Redis:
            return bus.connect(url)

        redis = portal.call(connect)
        server = ui_server(create_app(redis, allowed_hosts=allowed_hosts("127.0.0.1")))
        served = portal.start_task_soon(server.serve, [sock])
        try:
            yield f"http://127.0.0.1:{sock.getsockname()[1]}"
        finally:
            server.should_exit = True
            served.result(timeout=30)
            portal.call(redis.aclose)
            sock.close()


@pytest.fixture(scope="module")
def base_url(demo: Demo) -> Iterator[str]:
    with serving(demo.url) as url:
        yield url


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    require_browser()
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=str(CHROMIUM))
        yield launched
        launched.close()


@pytest.fixture
def page(browser: Browser, base_url: str) -> Iterator[Page]:
    """A fresh page; the test fails on a script error, a refusal by the page's security
    policy, or a script or style that did not load (error pages are documents, not that)."""
    context = browser.new_context(base_url=base_url, viewport={"width": 1280, "height": 900})
    opened = context.new_page()
    problems: list[str] = []
    opened.on("pageerror", lambda error: problems.append(f"script error: {error}"))
    opened.on("console", lambda message: problems.extend(_console_problem(message)))
    opened.on("response", lambda response: problems.extend(_resource_problem(response)))
    yield opened
    context.close()
    assert problems == []


def _console_problem(message: ConsoleMessage) -> list[str]:
    if message.type != "error" or message.text.startswith("Failed to load resource"):
        return []  # a resource that failed is reported by its response
    return [f"console: {message.text}"]


def _resource_problem(response: Response) -> list[str]:
    if response.status < 400 or response.request.resource_type == "document":
        return []
    return [f"{response.request.resource_type} {response.url}: {response.status}"]


def _rows(page: Page) -> list[str]:
    return page.locator("table.sagas a.saga-id").all_inner_texts()


def test_the_list_shows_the_demos_sagas(page: Page, demo: Demo) -> None:
    page.goto("/")
    expect(page.locator("table.sagas tbody tr")).to_have_count(len(demo.ids) + 1)
    assert sorted(_rows(page)) == sorted([*demo.ids, MARKUP])
    expect(page.locator(".paging")).to_contain_text(f"1-{len(demo.ids) + 1} of {len(demo.ids) + 1}")


def test_the_filters_narrow_the_list(page: Page, demo: Demo) -> None:
    page.goto("/")
    page.get_by_label("compensated").check()
    page.get_by_role("button", name="Filter").click()
    expect(page).to_have_url(re.compile(r"\?status=compensated&"))
    expect(page.locator("table.sagas tbody tr")).to_have_count(len(demo.compensated))
    assert sorted(_rows(page)) == sorted(demo.compensated)
    expect(page.get_by_label("compensated")).to_be_checked()  # the form shows what it filters by

    page.get_by_label("compensated").uncheck()
    page.get_by_label("running").check()
    page.get_by_label("definition").select_option("order_fulfilment")
    page.get_by_label("version").fill("1")
    page.get_by_role("button", name="Filter").click()
    expect(page.locator("table.sagas tbody tr")).to_have_count(1)
    assert _rows(page) == [MARKUP]

    page.get_by_label("version").fill("2")
    page.get_by_role("button", name="Filter").click()
    expect(page.locator("td.empty")).to_have_text("No saga matches.")

    page.goto("/")
    page.get_by_label("stuck for").fill("1d")  # the demo's sagas ended; the markup saga just began
    page.get_by_role("button", name="Filter").click()
    expect(page.locator("td.empty")).to_have_text("No saga matches.")
    page.get_by_label("stuck for").fill("0s")
    page.get_by_role("button", name="Filter").click()
    expect(page.locator("table.sagas tbody tr")).to_have_count(1)
    assert _rows(page) == [MARKUP]

    page.get_by_label("stuck for").fill("soon")
    page.get_by_role("button", name="Filter").click()
    expect(page.locator(".error-message")).to_have_text(
        "stuck for: 'soon' is not a duration (like 90s, 10m, 1h30m, 2d)"
    )


def _node(page: Page, step: str) -> str:
    """The classes of the diagram's node for ``step`` (Mermaid ids it ``…-flowchart-<step>-<n>``)."""
    node = page.locator(f'#path svg g.node[id*="-flowchart-{step}-"]')
    expect(node).to_have_count(1)
    return node.get_attribute("class") or ""


def _edge_is_thick(page: Page, source: str, target: str) -> bool:
    edge = page.locator(f'#path svg path[id*="-L_{source}_{target}_"]')
    expect(edge).to_have_count(1)
    return "stroke-width:3px" in (edge.get_attribute("style") or "")


def test_a_compensated_sagas_page_shows_its_compensations_in_order_and_its_path(
    page: Page, demo: Demo
) -> None:
    page.goto("/?status=compensated")
    page.get_by_role("link", name=demo.undone_twice, exact=True).click()
    expect(page.locator("#saga-id")).to_have_text(demo.undone_twice)
    expect(page.locator("h1 .status")).to_have_text("compensated")
    undone = page.locator("ol.compensations li")
    expect(undone).to_have_count(2)
    assert page.locator("ol.compensations .undo-name").all_inner_texts() == [
        "refund_payment",
        "release_stock",
    ]
    assert page.locator("ol.compensations .undo-step").all_inner_texts() == [
        "charge_payment",
        "reserve_stock",
    ]

    expect(page.locator("#path svg")).to_be_visible()  # drawn by Mermaid in the page
    assert "failed" in _node(page, "arrange_shipping").split()
    for step in ("reserve_stock", "charge_payment"):
        assert "undone" in _node(page, step).split()
    for node in ("undo_charge_payment", "undo_reserve_stock", "compensated"):
        assert "done" in _node(page, node).split()
    assert "done" not in _node(page, "completed").split()
    path = [
        ("start", "reserve_stock"),
        ("reserve_stock", "charge_payment"),
        ("charge_payment", "arrange_shipping"),
        ("charge_payment", "undo_charge_payment"),
        ("undo_charge_payment", "undo_reserve_stock"),
        ("undo_reserve_stock", "compensated"),
    ]
    assert all(_edge_is_thick(page, *edge) for edge in path)
    assert not _edge_is_thick(page, "arrange_shipping", "completed")
    # every attempt with its input and output
    expect(page.locator("tr.attempt")).to_have_count(page.locator("tr.attempt-do").count() + 2)
    expect(page.locator("tr.attempt-do").first.locator("td").last).to_contain_text('"type": "StockReserved"')
    undo = page.locator("tr.attempt-undo").first  # reserve_stock's: steps are in their order
    undo.locator("summary").click()
    expect(undo.locator("details pre.json")).to_contain_text('"type": "ReleaseStock"')


def test_a_saga_id_with_markup_is_shown_as_text(page: Page) -> None:
    page.goto("/")
    link = page.get_by_role("link", name=MARKUP, exact=True)
    expect(link).to_have_attribute("href", saga_href(MARKUP))
    expect(page.locator("main b, main svg")).to_have_count(0)
    link.click()
    expect(page.locator("#saga-id")).to_have_text(MARKUP)
    expect(page).to_have_title(f"saga {MARKUP} · redsaga")
    expect(page.locator("#path svg")).to_be_visible()  # the diagram drew; its title holds the id
    expect(page.locator("h1 b, h1 svg, [onload]")).to_have_count(0)
    assert page.evaluate("typeof window.pwned") == "undefined"
    expect(page.locator(".waiting-for")).to_contain_text("a reply from inventory to ReserveStock")


def test_dead_letters_show_their_reason_and_raw_fields_as_text(page: Page) -> None:
    page.goto("/dead-letters")
    letter = page.locator("table.letters tbody tr")
    expect(letter).to_have_count(1)
    expect(letter.locator("td.reason")).to_contain_text("malformed entry: missing envelope fields")
    letter.locator("summary").click()
    expect(letter.locator("dl.raw dt")).to_have_text("<i>field</i>")
    expect(letter.locator("dl.raw dd")).to_have_text("<script>window.pwned=2</script>")
    assert page.evaluate("typeof window.pwned") == "undefined"


def test_the_stats_page_shows_queues_in_flight_and_stuck(page: Page) -> None:
    page.goto("/stats")
    expect(page.locator("#in-flight")).to_have_text("1")  # the markup saga
    expect(page.locator("#stuck")).to_contain_text("0 not moved for 10m 0s")
    queues = page.locator("table.queues tbody")
    for stream in ("rs:{orders:0}:inbox", "rs:{orders:0}:cmd:inventory", "rs:{orders:0}:cmd:payments"):
        expect(queues).to_contain_text(stream)
    page.get_by_role("link", name="Dead letters", exact=True).click()
    expect(page).to_have_url(re.compile(r"/dead-letters$"))


def test_the_readme_screenshot_script_photographs_a_sagas_page(tmp_path: Path) -> None:
    require_browser()
    shot = tmp_path / "ui-saga.png"
    done = subprocess.run(
        [sys.executable, str(REPO / "docs" / "screenshots.py"), str(shot)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    header = shot.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n"
    assert struct.unpack(">II", header[16:24]) == (1280, 1000)  # the viewport, as docs/ui-saga.png
    for beside in ("ui-attempts.png", "ui-search.png", "ui-workers.png"):
        assert (tmp_path / beside).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", beside
        assert (REPO / "docs" / beside).exists(), beside  # shown in docs/operations.md
    assert struct.unpack(">II", (REPO / "docs" / "ui-saga.png").read_bytes()[16:24]) == (1280, 1000)
