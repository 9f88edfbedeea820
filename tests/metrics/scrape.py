"""Scraping a metrics port over real HTTP, and reading the samples back."""

from __future__ import annotations

import urllib.error
import urllib.request

import anyio
from prometheus_client.parser import text_string_to_metric_families

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:  # noqa: S310 - a loopback URL
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


async def get(port: int, path: str) -> tuple[int, str]:
    """GET ``path`` on the loopback ``port`` (in a thread: the server runs on this loop)."""
    return await anyio.to_thread.run_sync(_get, f"http://127.0.0.1:{port}{path}")


def parse(text: str) -> Samples:
    """Every sample of an exposition: (name, labels) -> value."""
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


async def scrape(port: int) -> Samples:
    """``/metrics`` of ``port``, parsed."""
    status, text = await get(port, "/metrics")
    assert status == 200, text
    return parse(text)


def value(samples: Samples, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels`` (0 when there are none)."""
    wanted = set(labels.items())
    return sum(v for (n, have), v in samples.items() if n == name and wanted <= have)
