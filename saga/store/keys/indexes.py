"""The keys of a context's schedules and of its indexes of event waits."""

from __future__ import annotations

from dataclasses import dataclass

from bus.lowlevel import tagged_key


@dataclass(frozen=True, slots=True)
class ScheduleKeys:
    """The keys of a context's schedules, in one slot (``{<context>:sched}``)."""

    tag: str

    @property
    def specs(self) -> str:
        """Hash: schedule id -> Schedule."""
        return tagged_key(self.tag, "specs")

    @property
    def states(self) -> str:
        """Hash: schedule id -> ScheduleState."""
        return tagged_key(self.tag, "states")

    @property
    def revisions(self) -> str:
        """Hash: schedule id -> revision (compare-and-set)."""
        return tagged_key(self.tag, "revs")

    @property
    def due(self) -> str:
        """Sorted set: schedule id -> when to look at it next (Unix ms)."""
        return tagged_key(self.tag, "due")

    @property
    def everything(self) -> str:
        """A pattern matching every key of the schedules."""
        return tagged_key(self.tag, "*")

    def all(self) -> list[str]:
        """The four keys, as ``schedule_write.lua`` takes them."""
        return [self.specs, self.states, self.revisions, self.due]


@dataclass(frozen=True, slots=True)
class WaitIndexKeys:
    """The keys of a context's index of waits on one stream (``{<context>:w:<stream>}``)."""

    tag: str

    def waits(self, key: str) -> str:
        """Hash: ``'<type> <saga>|<step>|<n>'`` -> waiter, the waits for correlation ``key``."""
        return tagged_key(self.tag, "wait", key)

    def early(self, key: str) -> str:
        """List: events with correlation ``key`` that came before their wait."""
        return tagged_key(self.tag, "early", key)
