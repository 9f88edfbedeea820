"""Every Redis key the bus writes, in one place.

A stream and all of its companion keys share one hash tag, so every script that
touches them is single-slot and runs unchanged on Redis Cluster::

    rs:{<tag>}:<name>                    the stream itself
    rs:{<tag>}:dlq                       dead-letter stream of every stream in the tag
    rs:{<tag>}:published                 zset: envelope id -> publish time (publish dedupe window)
    rs:{<tag>}:dedupe:<group>            hash: idempotency key -> an idempotent handler's
                                         in-flight marker, then its first result
    rs:{<tag>}:dedupe-expiry:<group>     zset: idempotency key -> when its record expires (ms);
                                         the hash's fields live while their score is ahead
    rs:{<tag>}:dedupe:<group>:<key>      string: one record as earlier releases kept it (TTL);
                                         read as a fallback, never written (bus/lua/_shared.lua)
    rs:{<tag>}:failures:<name>:<group>   hash: entry id -> failure history, until acked or dead
    rs:{<tag>}:lost:<name>:<group>       zset: the dedupe window of that group's reports of
                                         entries deleted while pending (dead letters)

The saga engine adds its own keys under the same tags (see ``saga/store/keys/``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

PREFIX = "rs"
_FORBIDDEN = frozenset("{}")


def tagged_key(tag: str, *parts: str) -> str:
    """Return the key ``rs:{tag}:part1:part2…``; every key built here shares ``tag``'s slot."""
    return f"{PREFIX}:{{{tag}}}:" + ":".join(parts)


@dataclass(frozen=True, slots=True)
class Stream:
    """The address of one stream: the hash tag it shares with its companion keys and its name.

    ``Stream.named("payments")`` is the stream ``rs:{payments}:stream``; the saga engine
    builds partitioned addresses such as ``Stream("orders:0", "cmd:payments")``.
    """

    tag: str
    name: str = "stream"
    _key: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for label, value in (("tag", self.tag), ("name", self.name)):
            if not value or _FORBIDDEN.intersection(value):
                raise ValueError(f"stream {label} {value!r} must be non-empty and contain no braces")
        object.__setattr__(self, "_key", tagged_key(self.tag, self.name))  # read on every call

    @classmethod
    def named(cls, name: str) -> Stream:
        """Return the stream of a plain name (its own hash tag)."""
        return cls(tag=name)

    @classmethod
    def from_key(cls, key: str) -> Stream:
        """Parse a key built by :attr:`key` back into its address."""
        return _parsed(key) if cls is Stream else cls._parse(key)

    @classmethod
    def _parse(cls, key: str) -> Stream:
        head = f"{PREFIX}:{{"
        end = key.find("}:")
        if not key.startswith(head) or end < 0:
            raise ValueError(f"{key!r} is not a redsaga stream key (expected 'rs:{{tag}}:name')")
        return cls(tag=key[len(head) : end], name=key[end + 2 :])

    @property
    def key(self) -> str:
        """The stream's Redis key."""
        return self._key

    @property
    def dlq_key(self) -> str:
        """The dead-letter stream for entries of this stream (shared by the whole tag)."""
        return tagged_key(self.tag, "dlq")

    @property
    def published_key(self) -> str:
        """The sorted set that dedupes publishes into this tag within the dedupe window."""
        return tagged_key(self.tag, "published")

    def dedupe_key(self, group: str) -> str:
        """The hash of ``group``'s dedupe records: idempotency key -> marker or first result.

        One key per tag and group, so its size is one ``HLEN`` and an ACL pattern names it
        whole (no ``*``): a participant's user cannot make more keys of it.
        """
        return _dedupe_keys(self.tag, group)[0]

    def dedupe_expiry_key(self, group: str) -> str:
        """The sorted set of when each of ``group``'s dedupe records expires (ms)."""
        return _dedupe_keys(self.tag, group)[1]

    def dedupe_keys(self, group: str) -> tuple[str, str]:
        """:meth:`dedupe_key` and :meth:`dedupe_expiry_key`: what every dedupe script takes."""
        return _dedupe_keys(self.tag, group)

    def legacy_dedupe_key(self, group: str, idempotency_key: str) -> str:
        """Where releases before the dedupe hash kept one record (read as a fallback only)."""
        return tagged_key(self.tag, "dedupe", group, idempotency_key)

    def failures_key(self, group: str) -> str:
        """The hash holding the failure history of ``group``'s failing entries on this stream."""
        return tagged_key(self.tag, "failures", self.name, group)

    def lost_key(self, group: str) -> str:
        """The dedupe window of ``group``'s reports of entries deleted while pending."""
        return tagged_key(self.tag, "lost", self.name, group)

    def same_slot(self, other: Stream) -> bool:
        """Whether one script may touch both streams (they share a hash tag)."""
        return self.tag == other.tag

    def __str__(self) -> str:
        return self.key


@functools.lru_cache(maxsize=4096)
def _parsed(key: str) -> Stream:
    """Reply-to keys are parsed on every delivery; a process sees few distinct ones."""
    return Stream._parse(key)


@functools.lru_cache(maxsize=4096)
def _dedupe_keys(tag: str, group: str) -> tuple[str, str]:
    """A group's dedupe keys are named on every delivery; a process sees few distinct ones."""
    return tagged_key(tag, "dedupe", group), tagged_key(tag, "dedupe-expiry", group)
