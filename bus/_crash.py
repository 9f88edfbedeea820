"""Named crash points for fault tests: SIGKILL this process at a named place.

``REDSAGA_CRASH_AT=after_xadd_before_mark_sent`` kills the process the first time it gets
there; ``…:3`` the third time. Unarmed (the variable unset, as in production) a crash point
is one call to a function that returns at once: the check is made once, at import.

The points (each constant below) are listed with what they prove in ``docs/faults.md``.
"""

from __future__ import annotations

import os
import signal
from collections import Counter
from typing import Final

ENV: Final = "REDSAGA_CRASH_AT"
# relay
AFTER_CLAIM: Final = "after_claim"
"""The relay claimed a batch of outbox rows and has published none of them."""
AFTER_XADD_BEFORE_MARK_SENT: Final = "after_xadd_before_mark_sent"
"""The relay published a batch to Redis and has not marked the rows sent."""
# bus and saga runtimes
AFTER_SIDE_EFFECT: Final = "after_side_effect"
"""A handler returned its result (its side effect is done) and the worker has neither
recorded the result nor completed the entry: the redelivery runs the handler again."""
BEFORE_COMMIT: Final = "before_commit"
"""The orchestrator decided an inbox entry and has not run the transition script."""
AFTER_COMMIT_BEFORE_ACK: Final = "after_commit_before_ack"
"""The transition script committed (and, inside it, acknowledged the inbox entry); the
orchestrator has done nothing else yet."""


def _parse(spec: str) -> tuple[str, int]:
    name, _, nth = spec.partition(":")
    return name, int(nth) if nth else 1


_armed: Final = _parse(os.environ[ENV]) if os.environ.get(ENV) else None
_hits: Counter[str] = Counter()


def _unarmed(_name: str) -> None:
    """Call at a named crash point; nothing happens (``$REDSAGA_CRASH_AT`` is not set)."""


def _armed_point(name: str) -> None:
    """Call at a named crash point; kills the process when ``$REDSAGA_CRASH_AT`` names it."""
    assert _armed is not None  # noqa: S101 - only installed when armed
    if name != _armed[0]:
        return
    _hits[name] += 1
    if _hits[name] >= _armed[1]:
        os.kill(os.getpid(), signal.SIGKILL)


crash_point = _armed_point if _armed is not None else _unarmed
"""Call at a named crash point; kills the process when ``$REDSAGA_CRASH_AT`` names it."""
