"""Scraping a real worker's ``--metrics-port`` over HTTP."""

from __future__ import annotations

import asyncio
import socket
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def _get(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        body: bytes = reply.read()
    return body.decode()


async def scrape(port: int) -> Samples:
    text = await asyncio.to_thread(_get, port)
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[(s.name, frozenset(s.labels.items()))] = s.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    """A sample's value; 0 for a labelled series not yet created (nothing counted)."""
    return samples.get((name, frozenset(labels.items())), 0.0)


async def scrape_when_up(port: int, timeout: float = 20.0) -> Samples:
    """The first scrape that answers (the server starts with the worker process)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        try:
            return await scrape(port)
        except OSError:
            if asyncio.get_running_loop().time() > deadline:
                raise
            await asyncio.sleep(0.05)
