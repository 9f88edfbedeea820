"""Take the docs' screenshots of the web UI: ``python docs/screenshots.py [PATH]``.

Runs the example system (``saga demo``'s 20 orders, seed 7) on the embedded in-memory Redis,
serves ``saga ui``'s app over it in the same process, and has Debian's headless Chromium
photograph:

- the page of a saga that was compensated after its shipping failed: its path over the
  diagram, then its compensations in order (``docs/ui-saga.png``, or PATH);
- its attempts over time, compensations in their own colour (``ui-attempts.png``);
- a search of the sagas list, newest first, with start times, durations and local times
  (``ui-search.png``);
- the workers page while the orders worker runs (``ui-workers.png``).

The last three go beside the first. tests/ui/test_browser.py runs it, so it keeps working.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from playwright.async_api import ViewportSize, async_playwright

import bus
from redsaga.examples import orders
from redsaga.examples.demo import run_demo
from saga import SagaAdmin, SagaStatus, SagaWorker
from saga.ops.ui import allowed_hosts, create_app, listen, ui_server
from saga.ops.ui.formatting import saga_href

CHROMIUM = "/usr/bin/chromium"
SHOT = Path(__file__).with_name("ui-saga.png")
VIEWPORT: ViewportSize = {"width": 1280, "height": 1000}


async def compensated_after_shipping(redis: bus.Redis) -> str:
    """A saga of the demo that undid two steps: its shipping failed, so refund, then release."""
    admin = await SagaAdmin.from_redis(redis)
    for row in (await admin.list(status=SagaStatus.COMPENSATED, limit=100)).rows:
        if (await admin.get(row.id)).steps["arrange_shipping"].attempts:
            return row.id
    raise SystemExit("the demo compensated no saga after its shipping step")


async def main(path: Path) -> None:
    """Run the demo, serve the UI, photograph one saga's page into ``path``."""
    redis = bus.connect(bus.MEMORY_URL)
    await run_demo(redis, orders=20, seed=7)
    saga_id = await compensated_after_shipping(redis)
    sock = listen("127.0.0.1", 0)
    server = ui_server(create_app(redis, allowed_hosts=allowed_hosts("127.0.0.1")))
    serving = asyncio.create_task(server.serve([sock]))
    worker = SagaWorker(redis, orders.app, consumer="orders-7f3c")  # live, for the workers page
    working = asyncio.create_task(worker.run())
    base = f"http://127.0.0.1:{sock.getsockname()[1]}"
    try:
        await worker.started.wait()
        async with async_playwright() as playwright:
            browser = await playwright.chromium.launch(executable_path=CHROMIUM)
            page = await browser.new_page(viewport=VIEWPORT, timezone_id="Europe/Berlin")
            await page.goto(base + saga_href(saga_id))
            await page.locator("#path svg").wait_for()  # drawn by Mermaid
            await page.screenshot(path=path)
            await page.locator("#attempts-axis").screenshot(path=path.with_name("ui-attempts.png"))
            await page.goto(f"{base}/?q={saga_id[:6]}&sort=newest")
            await page.locator("time + .local").first.wait_for()  # local times drawn
            await page.screenshot(path=path.with_name("ui-search.png"))
            await page.goto(base + "/workers")
            await page.locator("td.worker-id").first.wait_for()
            await page.screenshot(path=path.with_name("ui-workers.png"))
            await browser.close()
    finally:
        worker.stop()
        await working
        server.should_exit = True
        await serving
        await redis.aclose()


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1]) if len(sys.argv) > 1 else SHOT))
