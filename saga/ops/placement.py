"""Where a context's partitions live on a Redis Cluster, and the slot moves that even them out.

Every key of partition ``i`` of context ``c`` carries the hash tag ``{c:i}``, so a partition
is one slot (CRC16 of the tag, mod 16384) and lives wholly on the master serving that slot.
The slots of a context's tags fall where CRC16 puts them: with P = 3 * masters and slots
split in equal ranges, some contexts get 3 partitions on every master and others 2, 3 and 4
(or worse; ``tests/ops/test_cluster.py`` shows both). Moving a partition is moving its one
slot (``CLUSTER SETSLOT … MIGRATING/IMPORTING``, ``MIGRATE``, or ``redis-cli --cluster
reshard``), which Redis does key by key with sagas in flight: commands for a key already
moved get ``ASK`` and redis-py follows it. :func:`balancing_moves` plans the fewest such
moves that leave every master within one partition of the others.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from bus.lowlevel import is_cluster, owner_of, primaries, slot_of
from saga.store.keys import Partition


@dataclass(frozen=True, slots=True)
class Placed:
    """One partition: its hash tag's slot and the master serving it now."""

    context: str
    partition: int
    slot: int
    node: str
    """``host:port`` of the master; ``""`` on a single Redis."""


@dataclass(frozen=True, slots=True)
class Move:
    """Move ``slot`` (one partition) from master ``source`` to master ``target``."""

    slot: int
    source: str
    target: str


async def placement(redis: Any, context: str, partitions: int) -> list[Placed]:
    """Every partition of ``context`` with its slot and (on a cluster) its master now."""
    if is_cluster(redis):
        await primaries(redis)  # the slot map, read on first use
    placed = []
    for index in range(partitions):
        slot = slot_of(Partition(context, index).inbox.key)
        placed.append(Placed(context, index, slot, owner_of(redis, slot) if is_cluster(redis) else ""))
    return placed


def spread(placed: Sequence[Placed], masters: Sequence[str]) -> dict[str, int]:
    """Partitions per master (every master listed, a master without any with 0)."""
    counts = Counter(p.node for p in placed)
    return {master: counts.get(master, 0) for master in masters}


def balancing_moves(placed: Sequence[Placed], masters: Sequence[str]) -> list[Move]:
    """The fewest slot moves after which no master has two partitions more than another.

    Greedy: a partition of the fullest master goes to the emptiest one until they differ by
    at most one; each move lowers the gap, and no partition moves twice.
    """
    if not masters:
        return []
    holding = {master: [p.slot for p in placed if p.node == master] for master in masters}
    moves: list[Move] = []
    while True:
        fullest = max(masters, key=lambda m: len(holding[m]))
        emptiest = min(masters, key=lambda m: len(holding[m]))
        if len(holding[fullest]) - len(holding[emptiest]) <= 1:
            return moves
        slot = holding[fullest].pop()
        holding[emptiest].append(slot)
        moves.append(Move(slot, fullest, emptiest))
