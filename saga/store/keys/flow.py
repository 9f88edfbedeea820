"""The keys of flow control: rate limits' buckets and concurrency keys' slots, each under its own tag."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from bus.lowlevel import tagged_key

LIMIT_NAMES: Final = tagged_key("limits", "names")
"""The set of every rate limit declared or set (``saga limits list`` starts here)."""


@dataclass(frozen=True, slots=True)
class LimitKeys:
    """The keys of one rate limit, under its own hash tag ``{limit:<name>}``.

    Built with ``*`` for the name, they give the ACL pattern of every limit.
    """

    name: str

    @property
    def bucket(self) -> str:
        """The bucket: its tokens, last refill and the operator's rate and burst."""
        return tagged_key(f"limit:{self.name}", "bucket")

    @property
    def grants(self) -> str:
        """Command id -> when its token is due, for the last minute."""
        return tagged_key(f"limit:{self.name}", "grants")

    @property
    def log(self) -> str:
        """The operator's changes, newest first."""
        return tagged_key(f"limit:{self.name}", "log")

    @property
    def everything(self) -> str:
        """A glob of every key of the limit (for ACL patterns)."""
        return tagged_key(f"limit:{self.name}", "*")

    def all(self) -> list[str]:
        """The keys a take, a release or a change touches, in the scripts' order."""
        return [self.bucket, self.grants, self.log]


@dataclass(frozen=True, slots=True)
class SlotKeys:
    """The keys of one concurrency key's line, under its own hash tag ``{slot:<ctx>:<name>:<value>}``.

    ``value`` is already safe in a key (:func:`saga.definition.concurrency.key_value`). Built
    with ``*`` for all three, they give the ACL pattern of every line.
    """

    context: str
    name: str
    value: str

    @property
    def tag(self) -> str:
        """The line's hash tag."""
        return f"slot:{self.context}:{self.name}:{self.value}"

    def all(self) -> list[str]:
        """The keys ``slot.lua`` takes, in its order: holders, waiting, seq, prios, weights, pending."""
        parts = ("holders", "waiting", "seq", "prios", "weights", "pending")
        return [tagged_key(self.tag, part) for part in parts]

    @property
    def holders(self) -> str:
        """Sorted set: saga ref -> when it took its slot (ms)."""
        return tagged_key(self.tag, "holders")

    @property
    def waiting(self) -> str:
        """Hash: ref -> ``'<priority> <tenant> <arrival> <timers>'`` of each saga in line."""
        return tagged_key(self.tag, "waiting")

    @property
    def priorities(self) -> str:
        """Sorted set: the priorities with sagas in line."""
        return tagged_key(self.tag, "prios")

    def tenants(self, priority: int | str) -> str:
        """Sorted set: tenant -> pass, of the tenants with sagas in line at ``priority``."""
        return tagged_key(self.tag, f"tenants:{priority}")

    def line(self, priority: int | str, tenant: str) -> str:
        """Sorted set: ref -> arrival, one tenant's sagas in line at ``priority`` (``-``: no tenant)."""
        return tagged_key(self.tag, f"line:{priority}:{tenant}")

    @property
    def everything(self) -> str:
        """A glob of every key of the line (for ACL patterns)."""
        return tagged_key(self.tag, "*")


def slot_waiters(context: str) -> str:
    """Hash: saga ref -> ``<name>:<value>``, the line each waiting saga of ``context`` is in.

    What ``saga inspect`` reads to say where a waiting saga stands, without the definition's code.
    """
    return tagged_key(f"slots:{context}", "waiters")


def slot_lines(context: str) -> str:
    """Sorted set: ``<name>:<value>`` -> when the line was last used, of every line of ``context``.

    The index ``saga limits list`` and the metrics read (written beside each take of a slot).
    """
    return tagged_key(f"slots:{context}", "lines")
