"""The key patterns of the ACL users (``saga/ops/acl.py``): which keys, anchored how.

Every pattern is asked of the key builders (``saga/store/keys.py``, ``redsaga/streams.py``)
with a glob for the partition's tag, never written by hand, so a key and the pattern that
grants it cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Callable
from operator import attrgetter, methodcaller
from typing import Final

from bus import Stream
from saga.definition.saga import Context
from saga.store.keys import PartitionKeys


def partition_tags(context: Context) -> list[str]:
    """Glob tags matching exactly the partition tags of ``context``, by number of digits.

    ``[0-9]``, then ``[1-9][0-9]``, … up to the digits of its last partition: a ``*`` could
    match a ``}`` and so a key another principal's pattern was never meant to reach.
    """
    digits = len(str(context.partitions - 1))
    return [
        f"{context.name}:" + ("[0-9]" if n == 1 else "[1-9]" + "[0-9]" * (n - 1))
        for n in range(1, digits + 1)
    ]


Pattern = Callable[[PartitionKeys], str]
"""A key of a partition, asked of :mod:`saga.store.keys` with a glob for its tag."""

EVERYTHING: Final[Pattern] = attrgetter("everything")
INBOX: Final[Pattern] = attrgetter("inbox.key")
WINDOW: Final[Pattern] = attrgetter("inbox.published_key")
DEAD_LETTERS: Final[Pattern] = attrgetter("dead_letters")
SAGAS: Final[Pattern] = methodcaller("saga", "*")
BRANCHES: Final[Pattern] = methodcaller("branches", "*")
REFUSALS: Final[Pattern] = methodcaller("refused_start", "*")
TIMERS: Final[Pattern] = attrgetter("timers")
STATUS_INDEXES: Final[Pattern] = methodcaller("by_status", "*")
COUNTS: Final[Pattern] = attrgetter("counts")
ENDS: Final[Pattern] = attrgetter("ends")
TASK: Final[Pattern] = methodcaller("task", "*")
TASK_INDEXES: Final[Pattern] = methodcaller("tasks_for", "*")
TASK_TIMERS: Final[Pattern] = attrgetter("task_timers")
TASK_LOGS: Final[Pattern] = methodcaller("task_log", "*")
TASK_TOKENS: Final[Pattern] = attrgetter("task_tokens")
"""Open tasks' resume tokens: outside ``EVERYTHING``, so the operator's patterns miss them."""
TIMER_DATA: Final[Pattern] = attrgetter("timer_data")
"""Pending timers' signed firings: outside ``EVERYTHING`` too, for the orchestrator alone."""


def partition_keys(context: Context, key: Pattern, access: str = "") -> list[str]:
    """``access`` (``""`` read-write, ``%R``, ``%W``) to ``key`` in every partition of ``context``."""
    return [f"{access}~" + key(PartitionKeys(tag)) for tag in partition_tags(context)]


def consumer_keys(stream: Stream, group: str, legacy: str) -> list[str]:
    """What consuming ``stream`` as ``group`` touches: the stream and its companion keys.

    ``legacy``: the access to earlier releases' dedupe keys (``%R``, or ``""`` while upgrading).
    """
    return [
        "~" + stream.key,
        "%W~" + stream.dlq_key,
        "~" + stream.failures_key(group),
        "~" + stream.dedupe_key(group),
        "~" + stream.dedupe_expiry_key(group),
        f"{legacy}~" + stream.legacy_dedupe_key(group, "*"),
        "~" + stream.lost_key(group),
    ]
