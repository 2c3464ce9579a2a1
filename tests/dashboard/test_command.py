"""``runfleet dashboard`` as an operator starts it: a real process serving on 127.0.0.1."""

from __future__ import annotations

import asyncio
import signal
import sys

import httpx

import tests.dashboard.flows as d
from runfleet.ops.models import RunList
from runfleet.producer import AsyncQueue
from runfleet.store.config import Settings
from tests.fleet.procs import ROOT, settings_env
from tests.ops.metrics import free_port
from tests.support.polling import until


async def test_the_command_serves_the_pages_and_stops_on_sigterm(
    settings: Settings, queue: AsyncQueue
) -> None:
    run = await queue.enqueue(d.busy, 1)
    port = free_port()
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "runfleet.ops",
        "dashboard",
        "--port",
        str(port),
        env=settings_env(settings),
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:

            async def listed() -> httpx.Response | None:
                assert proc.returncode is None, "the dashboard exited while starting"
                try:
                    return await client.get("/api/runs")
                except httpx.ConnectError:
                    return None

            listing = await until(listed, 20, "the dashboard to listen", every=0.1)
            assert [r.id for r in RunList.model_validate_json(listing.text).runs] == [run.id]
            page = await client.get("/")
            assert page.status_code == 200 and "Overview" in page.text
            other_name = await client.get("/", headers={"host": f"attacker.example:{port}"})
            assert other_name.status_code == 400
        proc.send_signal(signal.SIGTERM)
        out, _ = await asyncio.wait_for(proc.communicate(), 15)
        # uvicorn shuts down gracefully, then re-raises the signal it caught (so a
        # supervisor sees a SIGTERM death): -15 here, no traceback in the output.
        assert proc.returncode in (0, -signal.SIGTERM), out.decode()
        assert "Traceback" not in out.decode()
        assert f"runfleet dashboard on http://127.0.0.1:{port}/" in out.decode()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
