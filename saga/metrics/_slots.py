"""The concurrency keys' metrics of one worker: what its slot gate did, and the lines in Redis.

Labelled by key name (``Key.name``), never by value or saga: the label sets are as many as
the keys an app declares, however many accounts they cover. Counted figures are this
worker's (sum them over workers). The lines are read from Redis at scrape time, from each
context's index of lines (``rs:{slots:<ctx>}:lines``, the most recently used first, at most
:data:`LINES_READ` a context), one pipelined read.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any, Final

from bus.metrics import REDIS, Figures, MetricSpec, ScrapeCollector
from saga.runtime.slot_gate import SlotTallies
from saga.store.slots import read_lines

LINES_READ: Final = 1000
"""Lines read a context at each scrape (the most recently used)."""
_KEY = ("key",)

SLOT_ASKS = MetricSpec(
    "redsaga_concurrency_asks_total",
    "counter",
    "Sagas' asks for a concurrency key's slot, by outcome: granted (a slot at once or at a "
    "later look), queued (held to wait in line), refused (a start that skips when busy, or a "
    "debounced start replaced by a later one).",
    (*_KEY, "outcome"),
)
SLOT_RELEASED = MetricSpec(
    "redsaga_concurrency_released_total",
    "counter",
    "Slots (or places in line) given back by sagas that ended, and the sagas woken for them.",
    (*_KEY, "what"),
)
SLOT_RECOVERED = MetricSpec(
    "redsaga_concurrency_recovered_total",
    "counter",
    "Slots taken back from holders that had ended without giving them back (a worker died "
    "between the end and the release) or never existed.",
    _KEY,
)
SLOT_IN_USE = MetricSpec(
    "redsaga_concurrency_slots_in_use",
    "gauge",
    "Slots held now, over every value of the key (of the lines read: see the help of lines).",
    _KEY,
    source=REDIS,
)
SLOT_WAITING = MetricSpec(
    "redsaga_concurrency_waiting",
    "gauge",
    "Sagas waiting in line now, over every value of the key.",
    _KEY,
    source=REDIS,
)
SLOT_LINES = MetricSpec(
    "redsaga_concurrency_lines",
    "gauge",
    f"Values of the key with a line in the index (at most {LINES_READ} a context are read).",
    _KEY,
    source=REDIS,
)
SLOT_METRICS = (SLOT_ASKS, SLOT_RELEASED, SLOT_RECOVERED, SLOT_IN_USE, SLOT_WAITING, SLOT_LINES)
"""Every metric of a worker whose sagas have concurrency keys."""


class SlotMetrics(ScrapeCollector):
    """The concurrency-key figures of one worker's orchestrators (see the module docstring)."""

    specs = SLOT_METRICS

    def __init__(
        self, redis: Any, tallies: Sequence[SlotTallies], keys: dict[str, set[str]], *, timeout_s: float = 5.0
    ) -> None:
        """``keys``: context -> the names of its definitions' keys."""
        super().__init__(timeout_s=timeout_s)
        self.redis = redis
        self.tallies = list(tallies)
        self.keys = keys

    def count(self, figures: Figures) -> None:
        """Sum what the orchestrators' gates counted."""
        for name in sorted({n for names in self.keys.values() for n in names}):
            for outcome, counted in (("granted", "granted"), ("queued", "queued"), ("refused", "refused")):
                total = sum(getattr(t, counted)[name] for t in self.tallies)
                figures.set(SLOT_ASKS, (name, outcome), total)
            figures.set(SLOT_RELEASED, (name, "released"), sum(t.released[name] for t in self.tallies))
            figures.set(SLOT_RELEASED, (name, "woken"), sum(t.woken[name] for t in self.tallies))
            figures.set(SLOT_RECOVERED, (name,), sum(t.recovered[name] for t in self.tallies))

    async def read(self, figures: Figures) -> None:
        """Slots held and sagas waiting, summed per key over the lines in the index."""
        in_use: Counter[str] = Counter()
        waiting: Counter[str] = Counter()
        lines: Counter[str] = Counter()
        for context, names in sorted(self.keys.items()):
            for line in await read_lines(self.redis, context, keys=names, most=LINES_READ):
                in_use[line.key] += len(line.holders)
                waiting[line.key] += line.waiting
                lines[line.key] += 1
        for name in sorted({n for names in self.keys.values() for n in names}):
            figures.set(SLOT_IN_USE, (name,), in_use[name])
            figures.set(SLOT_WAITING, (name,), waiting[name])
            figures.set(SLOT_LINES, (name,), lines[name])
