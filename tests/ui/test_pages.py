"""The web UI's pages over the operations scenario on fakeredis, read without a browser.

What a person sees is checked in a real browser (tests/ui/test_browser.py); here each page
answers, filters filter, bad input is a page that says why, and everything is escaped.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone
from html.parser import HTMLParser

import httpx
import pytest

import bus
from bus import FakeClock
from redsaga.examples import stateless
from redsaga.examples.contracts import Line, Order
from redsaga.examples.orders import order_fulfilment
from saga import SagaClient, SagaWorker
from saga.definition.shape import shape_of
from saga.ops.inspect import build_inspection
from saga.ops.ui import allowed_hosts, create_app
from saga.ops.ui.formatting import saga_href
from saga.ops.ui.pages import compensations
from saga.store.keys import ContextKeys
from saga.testing import SagaRunner
from tests.cli import task_world
from tests.ops.scenario import PARTITION, app, drive
from tests.saga import task_sagas

pytestmark = pytest.mark.anyio
MARKUP = "<b>bold</b><svg/onload=window.pwned=1>"
"""A saga id with markup in it (ids may hold any printable ASCII but spaces and {}*?[]\\)."""


@dataclass
class Ui:
    """A client of the UI and the scenario's saga ids by state."""

    client: httpx.AsyncClient
    ids: dict[str, str]

    async def page(self, path: str, status: int = 200) -> str:
        response = await self.client.get(path)
        assert response.status_code == status, (path, response.status_code, response.text[-500:])
        assert response.headers["content-type"].startswith("text/html")
        return response.text

    async def listed(self, query: str = "") -> list[str]:
        """The saga ids the list shows for ``query``."""
        return _SagaLinks.of(await self.page("/" + query))


class _SagaLinks(HTMLParser):
    """The text of every ``a.saga-id`` link of a page."""

    def __init__(self) -> None:
        super().__init__()
        self.ids: list[str] = []
        self._open = False

    @classmethod
    def of(cls, html: str) -> list[str]:
        parser = cls()
        parser.feed(html)
        return parser.ids

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._open = tag == "a" and ("class", "saga-id") in attrs
        if self._open:
            self.ids.append("")

    def handle_endtag(self, tag: str) -> None:
        self._open = False

    def handle_data(self, data: str) -> None:
        if self._open:
            self.ids[-1] += data


def _client(redis: bus.Redis) -> httpx.AsyncClient:
    ui = create_app(redis, allowed_hosts=allowed_hosts("127.0.0.1"))
    return httpx.AsyncClient(transport=httpx.ASGITransport(ui), base_url="http://127.0.0.1:8080")


@pytest.fixture
async def ui(fake_redis: bus.Redis) -> AsyncIterator[Ui]:
    """The scenario's sagas as its worker left them, a saga with markup in its id (run to its
    end by the scenario's participants), and a dead letter with markup in its fields."""
    scenario = await drive(fake_redis)
    worker = SagaWorker(fake_redis, app, clock=scenario.clock, consumer="ui-test")  # fires no timer
    await worker.register()
    await SagaClient(fake_redis, app.registry).start(order_fulfilment, _order(MARKUP), saga_id=MARKUP)
    await fake_redis.xadd(PARTITION.inbox.key, {"<i>field</i>": "<script>window.pwned=2</script>"})
    await worker.run_until_idle()
    async with _client(fake_redis) as client:
        yield Ui(client, scenario.ids)


def _order(order_id: str, **fields: str) -> Order:
    return Order(id=order_id, customer="c", lines=[Line(sku="s", quantity=1)], total_cents=100, **fields)  # type: ignore[arg-type]


async def test_every_page_answers_with_headers_that_run_only_its_own_scripts(ui: Ui) -> None:
    for path in ("/", "/dead-letters", "/stats", "/tasks?name=managers", saga_href(ui.ids["dead_lettered"])):
        response = await ui.client.get(path)
        assert response.status_code == 200, path
        policy = response.headers["content-security-policy"]
        assert "script-src 'self'" in policy
        assert "default-src 'none'" in policy
        assert response.headers["x-content-type-options"] == "nosniff"
    script = await ui.client.get("/static/mermaid/mermaid.min.js")
    assert script.status_code == 200
    assert len(script.content) > 1_000_000  # the whole bundle: the page draws offline


async def test_the_list_filters_by_status_definition_version_and_time_stuck(ui: Ui) -> None:
    everything = await ui.listed()
    assert sorted(everything) == sorted([*ui.ids.values(), MARKUP])
    assert sorted(await ui.listed("?status=dead_lettered")) == ["ord-dead", "ord-refund-down"]
    assert sorted(await ui.listed("?status=compensated&status=cancelled")) == [
        "ord-cancelled",
        "ord-compensated",
    ]
    assert sorted(await ui.listed("?definition=order_fulfilment&version=1")) == sorted(everything)
    assert await ui.listed("?version=2") == []
    # the scenario ran two hours ago; the markup saga has just started
    stuck = await ui.listed("?stuck_for=10m")
    assert set(stuck) == {"ord-dead", "ord-refund-down", "ord-stuck"}
    assert stuck[-1] == "ord-stuck"  # stalest first: it stopped moving last of the three
    assert "No saga matches." in await ui.page("/?version=2")


async def test_the_list_is_paged_with_its_filters_kept(ui: Ui) -> None:
    ended = "status=completed&status=dead_lettered&status=failed"
    first = await ui.page(f"/?{ended}&limit=2")
    assert len(_SagaLinks.of(first)) == 2
    assert "1-2 of 5" in first  # the markup saga completed too
    assert f'href="?{ended.replace("&", "&amp;")}&amp;offset=2&amp;limit=2"' in first
    second = await ui.listed(f"?{ended}&offset=2&limit=2")
    assert len(second) == 2
    assert not set(second) & set(_SagaLinks.of(first))


async def test_the_list_filters_by_a_time_range_in_utc_or_with_an_offset(ui: Ui) -> None:
    # every saga of the scenario last moved about two hours ago, by its clock
    everything = sorted([*ui.ids.values(), MARKUP])
    now = datetime.now(UTC)
    hour_ago = (now - timedelta(hours=1)).replace(tzinfo=None).isoformat(timespec="minutes")
    east = (now - timedelta(hours=3)).astimezone(timezone(timedelta(hours=2))).isoformat(timespec="minutes")
    assert await ui.listed(f"?from={hour_ago}") == []
    assert sorted(await ui.listed(f"?to={hour_ago}")) == everything
    assert sorted(await ui.listed(f"?from={east.replace('+', '%2B')}&to={hour_ago}")) == everything
    assert await ui.listed(f"?to={east.replace('+', '%2B')}") == []
    assert f"to={hour_ago.replace(':', '%3A')}" in await ui.page(f"/?to={hour_ago}&limit=1")  # kept by paging


@pytest.mark.parametrize(
    ("query", "says"),
    [
        ("?from=yesterday", "from must be a time like 2026-12-04T18:30"),
        ("?from=2026-12-04T18:00&to=2026-12-04T17:00", "the time range ends before it begins"),
        ("?version=x", "version must be a whole number, not &#39;x&#39;"),
        ("?stuck_for=soon", "stuck for: &#39;soon&#39; is not a duration"),
        ("?status=asleep", "unknown status in [&#39;asleep&#39;]"),
        ("?definition=nope", "no definition named &#39;nope&#39;"),
        ("?limit=0", "limit must be from 1 to 500, not 0"),
    ],
)
async def test_a_bad_filter_is_a_page_saying_why(ui: Ui, query: str, says: str) -> None:
    assert says in await ui.page("/" + query, status=400)


async def test_an_unknown_saga_is_a_404_page(ui: Ui) -> None:
    assert "no saga with id &#39;nobody&#39;" in await ui.page("/sagas/nobody", status=404)
    assert "Not Found" in await ui.page("/no-such-page", status=404)


async def test_markup_in_a_saga_id_or_a_dead_letter_is_shown_as_text(ui: Ui) -> None:
    escaped = "&lt;b&gt;bold&lt;/b&gt;&lt;svg/onload=window.pwned=1&gt;"
    listing = await ui.page("/")
    assert MARKUP in await ui.listed()  # the text, as a person reads it
    assert escaped in listing
    assert "<b>" not in listing
    assert "<svg" not in listing
    assert 'href="/sagas/%3Cb%3Ebold%3C%2Fb%3E%3Csvg%2Fonload%3Dwindow.pwned%3D1%3E"' in listing
    page = await ui.page(saga_href(MARKUP))  # the id's '/' stays in its one path segment
    assert f'<code id="saga-id">{escaped}</code>' in page
    assert "<b>" not in page
    assert "<svg" not in page
    assert f"%% order_fulfilment@1 saga {escaped}: completed" in page  # the diagram's source too
    letters = await ui.page("/dead-letters")
    assert "&lt;i&gt;field&lt;/i&gt;" in letters
    assert "&lt;script&gt;window.pwned=2&lt;/script&gt;" in letters
    assert "<script>window" not in letters
    assert "malformed entry" in letters


async def test_a_sagas_page_has_its_path_attempts_timers_and_letters(ui: Ui) -> None:
    stuck = await ui.page(saga_href(ui.ids["running"]))
    assert '<pre class="mermaid" id="diagram">flowchart LR' in stuck
    assert "class reserve_stock active" in stuck
    assert "ord-stuck:reserve_stock:do:1:timeout" in stuck  # its timeout timer
    assert "expects a StockReserved reply, got CardRefunded" in stuck  # a dead letter naming it
    dead = await ui.page(saga_href(ui.ids["dead_lettered_undo"]))
    assert dead.count('<tr class="attempt attempt-undo">') == 10  # every attempt of the refund
    assert "TransientError: payment gateway timeout" in dead
    assert "&#34;type&#34;: &#34;RefundCard&#34;" in dead  # an attempt's input, indented JSON


async def test_a_saga_whose_version_is_not_registered_is_shown_without_a_diagram(
    ui: Ui, fake_redis: bus.Redis
) -> None:
    await fake_redis.hdel(ContextKeys("orders").shapes, "order_fulfilment@1")
    page = await ui.page(saga_href(ui.ids["completed"]))
    assert "No diagram: order_fulfilment@1 is not registered in Redis." in page
    assert "reserve_stock" in page  # the steps and attempts all the same


async def test_the_stats_page_counts_in_flight_stuck_queues_and_dead_letters(ui: Ui) -> None:
    page = await ui.page("/stats")
    assert '<dd id="in-flight">3</dd>' in page  # ord-dead, ord-refund-down and ord-stuck
    assert '<dd id="stuck"><a href="/?stuck_for=600000ms">3</a>' in page
    assert "rs:{orders:0}:cmd:payments" in page
    assert await ui.listed("?stuck_for=600000ms") == await ui.listed("?stuck_for=10m")
    assert "</a> not moved for 1h 0m" in await ui.page("/stats?stuck_for=1h")
    assert "stuck for: &#39;x&#39; is not a duration" in await ui.page("/stats?stuck_for=x", status=400)


async def test_a_ui_on_the_loopback_answers_only_to_loopback_names(ui: Ui) -> None:
    assert (await ui.client.get("/", headers={"host": "localhost:8080"})).status_code == 200
    rebound = await ui.client.get("/", headers={"host": "evil.example:8080"})
    assert rebound.status_code == 400  # a page of that site cannot read this one through DNS
    assert allowed_hosts("0.0.0.0") == ["*"]  # noqa: S104 - what --host 0.0.0.0 allows


async def test_redis_not_answering_is_a_503_page() -> None:
    down = bus.connect("redis://127.0.0.1:1/0")
    try:
        async with _client(down) as client:
            response = await client.get("/")
        assert response.status_code == 503
        assert "Redis is not answering" in response.text
    finally:
        await down.aclose()


def test_compensations_are_listed_in_the_order_they_ran() -> None:
    """The runner's clock stands still: every undo is sent at one millisecond."""
    runner = SagaRunner(
        order_fulfilment, participants=[stateless.inventory, stateless.payments, stateless.shipping]
    )
    state = runner.run(_order("o-nowhere", region="nowhere"), saga_id="o-nowhere")
    assert state.status == "compensated"
    found = build_inspection(
        state,
        runner.history("o-nowhere"),
        [],
        [],
        now_ms=runner.now_ms,
        shape=shape_of(order_fulfilment),
        full_history=False,
    )
    assert [(c.step, c.name, c.status) for c in compensations(found)] == [
        ("charge_payment", "refund_payment", "compensated"),
        ("reserve_stock", "release_stock", "compensated"),
    ]


async def _with_tasks(redis: bus.Redis) -> None:
    """Two refunds waiting for a manager, one with markup in its id (and so in its task's title)."""
    client = SagaClient(redis, task_world.app.registry, clock=FakeClock(task_world.CLOCK_MS))
    await client.start(task_sagas.refund, task_sagas.Refund(id=MARKUP, amount=900), saga_id="big")
    await task_world.open_tasks(redis, 300)  # due at the same time, so listed by task id


async def test_the_tasks_page_lists_a_roles_open_tasks_escaped(fake_redis: bus.Redis) -> None:
    await _with_tasks(fake_redis)
    async with _client(fake_redis) as client:
        asking = (await client.get("/tasks")).text
        assert "Name a role or a person" in asking
        assert 'href="/tasks" aria-current="page"' in asking  # in the nav, on every page
        assert 'href="/tasks"' in (await client.get("/stats")).text
        shown = await client.get("/tasks", params={"kind": "role", "name": "managers"})
        assert shown.status_code == 200
        html = shown.text
        assert "Approve refund &lt;b&gt;bold&lt;/b&gt;&lt;svg/onload=window.pwned=1&gt; of 900" in html
        assert "<b>bold</b>" not in html
        assert sorted(_SagaLinks.of(html)) == ["big", "r300"]
        assert html.count('<td class="holder">-</td>') == 2
        assert "No open tasks." in (await client.get("/tasks?kind=user&name=ann")).text
        in_context = await client.get("/tasks?kind=role&name=managers&context=refunds")
        assert len(_SagaLinks.of(in_context.text)) == 2


@pytest.mark.parametrize(
    ("query", "status", "says"),
    [
        ("?kind=team&name=x", 400, "assignee kind &#39;team&#39; is not role or user"),
        ("?kind=role&name=no%20spaces", 400, "role &#39;no spaces&#39; is not valid"),
        ("?kind=role&name=x&context=nowhere", 400, "no context &#39;nowhere&#39;"),
    ],
)
async def test_a_bad_tasks_filter_is_a_page_saying_why(
    fake_redis: bus.Redis, query: str, status: int, says: str
) -> None:
    await _with_tasks(fake_redis)
    async with _client(fake_redis) as client:
        response = await client.get("/tasks" + query)
    assert response.status_code == status
    assert says in response.text


async def test_a_saga_waiting_on_a_task_shows_the_task_box(fake_redis: bus.Redis) -> None:
    await _with_tasks(fake_redis)
    async with _client(fake_redis) as client:
        html = (await client.get("/sagas/big")).text
    assert '<section id="task">' in html
    assert '<dd class="assignee">role:managers</dd>' in html
    assert '<dd class="claim">unclaimed</dd>' in html
    assert "Approve refund &lt;b&gt;bold&lt;/b&gt;" in html  # escaped
    assert "it goes to user:boss" in html
    assert "a person: task &#39;approve&#39; for role:managers" in html
