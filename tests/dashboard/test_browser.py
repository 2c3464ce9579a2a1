"""The dashboard in a real browser: Debian's Chromium, headless, driven by Selenium.

A live in-process fleet runs beside a real uvicorn server; the browser loads each page,
watches a run appear, move and settle on /runs without a reload, approves and cancels
runs from their pages, and saves a screenshot of every step under
``tests/artifacts/dashboard/`` (ignored by git), printed at the end.

Selenium calls block, so each goes through ``asyncio.to_thread``: the worker and the
server share the test's event loop and must keep running while the browser waits.
"""

from __future__ import annotations

import asyncio
import shutil
import socket
import time
from collections.abc import AsyncIterator, Callable
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import pytest
import uvicorn

import tests.dashboard.flows as d
import tests.flows.flows as f
from runfleet.ops.dashboard.app import create_app
from runfleet.producer import AsyncQueue
from runfleet.store import Store
from runfleet.store.config import Settings
from runfleet.store.types import RunStatus
from runfleet.worker.process import Worker
from tests.dashboard.conftest import approval_token
from tests.flows.conftest import parked
from tests.support.polling import until

INSTALL = "apt-get install -y chromium chromium-driver"
ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts" / "dashboard"
T = TypeVar("T")

webdriver = pytest.importorskip("selenium.webdriver", reason="pip install selenium (dev extra)")
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402


def _binaries() -> tuple[str, str]:
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if chromium is None or driver is None:
        pytest.skip(f"Chromium and its driver are not installed: run `{INSTALL}` (as root)")
    return chromium, driver


@pytest.fixture
async def server(settings: Settings) -> AsyncIterator[str]:
    """A real uvicorn server for the dashboard on a free port of 127.0.0.1."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    app = create_app(settings)
    srv = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    task = asyncio.create_task(srv.serve(sockets=[sock]))

    async def started() -> bool:
        assert not task.done(), "the dashboard server stopped while starting"
        return srv.started

    await until(started, 10, "the dashboard server to start")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        srv.should_exit = True
        await asyncio.wait_for(task, 10)
        sock.close()


class Browser:
    """Headless Chromium; every call runs in a thread so the event loop keeps going."""

    def __init__(self, driver: Any, base: str, shots: Path) -> None:
        self.driver, self.base, self.shots = driver, base, shots
        self.taken: list[Path] = []

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.to_thread(fn, *args)

    async def open(self, path: str) -> None:
        await self.call(self.driver.get, self.base + path)

    async def js(self, script: str) -> Any:
        return await self.call(self.driver.execute_script, script)

    async def attr(self, css: str, name: str) -> str | None:
        """An attribute of the first element matching ``css`` (None if there is none)."""
        value = await self.js(
            f"var e = document.querySelector({css!r}); return e ? e.getAttribute({name!r}) : null;"
        )
        return None if value is None else str(value)

    async def text(self, css: str) -> str:
        return str(
            await self.js(
                f"var e = document.querySelector({css!r}); return e ? e.textContent : '';"
            )
        )

    async def until(self, what: str, check: Callable[[], Any], timeout: float = 15) -> Any:
        try:
            return await until(check, timeout, f"the browser to show {what}", every=0.1)
        except TimeoutError:
            await self.shot(f"timeout-{what.replace(' ', '-')}")
            raise

    async def click(self, css: str) -> None:
        element = await self.call(self.driver.find_element, By.CSS_SELECTOR, css)
        await self.call(element.click)

    async def shot(self, name: str) -> None:
        path = self.shots / f"{len(self.taken) + 1:02d}-{name}.png"
        await self.call(self.driver.save_screenshot, str(path))
        self.taken.append(path)


@pytest.fixture
async def browser(server: str, request: pytest.FixtureRequest) -> AsyncIterator[Browser]:
    chromium, chromedriver = _binaries()
    shots = ARTIFACTS / request.node.name
    shutil.rmtree(shots, ignore_errors=True)
    shots.mkdir(parents=True)
    (ARTIFACTS.parent / ".gitignore").write_text("*\n")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        options.add_argument(flag)
    options.add_argument("--window-size=1280,1100")
    driver = await asyncio.to_thread(
        webdriver.Chrome, options=options, service=Service(executable_path=chromedriver)
    )
    b = Browser(driver, server, shots)
    try:
        yield b
    finally:
        await asyncio.to_thread(driver.quit)
        print(f"\nscreenshots ({len(b.taken)}) in {shots}")


async def test_a_live_fleet_seen_through_chromium(
    worker: Worker, queue: AsyncQueue, store: Store, browser: Browser
) -> None:
    b = browser
    started = time.monotonic()

    # overview: the live worker, the queue, the plots
    await b.open("/")
    assert await b.until("the worker", lambda: b.text("#workers"))
    assert str(worker.owner.pid) in await b.text("#workers")
    assert await b.js("return document.querySelectorAll('svg.chart').length") == 2
    await b.shot("overview")

    # /runs: a run appears, moves and settles while the page stays loaded
    await b.open("/runs")
    await b.js("window.__loaded_once = true;")
    ticking = await queue.enqueue(d.ticker, 6, 0.5)
    row = f'tr.run[data-id="{ticking.id}"]'
    seen: list[str] = []

    async def settled() -> bool:
        status = await b.attr(row, "data-status")
        if status and (not seen or seen[-1] != status):
            seen.append(status)
            if status == "running":
                await b.shot("runs-running")
        return status == "completed"

    await b.until("the run settle on /runs", settled)
    assert "running" in seen and seen[-1] == "completed", seen
    assert await b.js("return window.__loaded_once === true;"), "the page was reloaded"
    await b.shot("runs-settled")

    # its page: explain, timeline, steps
    await b.open(f"/runs/{ticking.id}")
    assert "is completed" in await b.text("#explain")
    marks = await b.js("return document.querySelectorAll('svg.timeline .mark').length")
    assert marks >= 4  # created, claimed, steps, settled
    assert "tick5" in await b.text("#steps")
    await b.shot("run-completed")

    # approve from the page: the operator types the token the flow sent, the run completes
    asking = await queue.enqueue(f.approver, 9)
    token = approval_token(await parked(store, asking.id, "approval"))
    await b.open(f"/runs/{asking.id}")
    field = await b.call(b.driver.find_element, By.CSS_SELECTOR, 'input[name="token"]')
    await b.call(field.send_keys, token)
    await b.shot("run-awaiting-approval")
    await b.click("#approve")
    await b.until("the approval", lambda: b.text("#done"))
    await b.until(
        "the approved run complete",
        lambda: _is(b, "completed"),
    )
    await b.shot("run-approved")

    # cancel from the page: the page follows the run to cancelled by itself
    busy = await queue.enqueue(d.busy, 30)
    await b.open(f"/runs/{busy.id}")
    await b.until("the run running", lambda: _is(b, "running"))
    await b.click("#cancel")
    assert "cancellation requested" in await b.until("the flash", lambda: b.text("#done"))
    await b.until("the run cancelled", lambda: _is(b, "cancelled"))
    row_now = await store.runs.get(busy.id)
    assert row_now is not None and row_now.status is RunStatus.CANCELLED
    await b.shot("run-cancelled")

    # fleet
    await b.open("/fleet")
    assert await b.until(
        "the worker row", lambda: b.attr(f'tr.worker[data-pid="{worker.owner.pid}"]', "data-pid")
    )
    await b.shot("fleet")
    assert time.monotonic() - started < 60


async def _is(b: Browser, status: str) -> bool:
    return await b.attr("#run-status", "data-status") == status


HOSTILE_IDS = ["x\\..\\victim", "victim/cancel?", "victim#top", "..", "a b&c=%41 é"]
"""Ids a raw link misreads: ``\\`` is ``/`` to a browser, ``?`` and ``#`` end the path,
``..`` climbs a level (``tests/security/test_dashboard_ids.py`` has the reasons)."""


async def test_hostile_ids_open_and_cancel_their_own_runs_in_chromium(
    worker: Worker, queue: AsyncQueue, store: Store, browser: Browser
) -> None:
    """Chromium itself resolves each link and form: the page of each id is that run's,
    and its cancel button cancels that run, never ``victim``."""
    b = browser
    victim = await queue.enqueue(d.busy, 30, run_id="victim")
    runs = [await queue.enqueue(d.busy, 30, run_id=run_id) for run_id in HOSTILE_IDS]
    family = await queue.enqueue(f.parent, 1)
    await until(lambda: _children(store, family.id), 10, "the parent's children")
    (edge, *_) = await store.dag.children(family.id)
    for run_id in [*(r.id for r in runs), edge.child_id]:  # a child's id holds '/' and '#'
        await b.open("/runs")
        await b.until(f"the row of {run_id!r}", partial(_row_link, b, run_id))
        await b.call(b.driver.execute_script, "arguments[0].click();", await _row_link(b, run_id))
        await b.until(f"the page of {run_id!r}", lambda: b.text("#run-status"))
        assert await b.text("h1 .mono") == run_id
        await b.click("#cancel")
        await b.until(f"the flash on {run_id!r}", lambda: b.text("#done"))
        assert await b.text("h1 .mono") == run_id
        row = await store.runs.get(run_id)
        assert row is not None and row.cancel_requested_at_ms is not None, run_id
        untouched = await store.runs.get(victim.id)
        assert untouched is not None and untouched.cancel_requested_at_ms is None, run_id
    await b.shot("hostile-id-cancelled")
    await queue.cancel(victim.id)
    await queue.cancel(family.id)


async def _row_link(b: Browser, run_id: str) -> Any:
    """The link in the /runs row of ``run_id`` (compared in the page's own script)."""
    return await b.call(
        b.driver.execute_script,
        "var id = arguments[0], row = [...document.querySelectorAll('tr.run')]"
        ".find(function (r) { return r.dataset.id === id; });"
        "return row ? row.querySelector('a') : null;",
        run_id,
    )


async def _children(store: Store, run_id: str) -> bool:
    return len(await store.dag.children(run_id)) == 2
