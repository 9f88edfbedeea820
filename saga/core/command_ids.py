"""The id of an attempt's command, made once for the decider and the store.

A command's id is derived from its saga, step, kind and attempt number, so a decision
repeated after a crash sends the same command. The store derives it again to leave it out of
the step record when it is the derivable one, and again on reading the record, so the
derivation (a BLAKE2b digest) is cached: a dispatch then pays for one.
"""

from __future__ import annotations

import functools

from redsaga.ids import derived_id


@functools.lru_cache(maxsize=4096)
def command_id(saga_id: str, step: str, kind: str, attempt: int) -> str:
    """The id of attempt ``attempt`` of ``step``'s ``kind`` in saga ``saga_id``."""
    return derived_id(saga_id, f"{step}:{kind}:{attempt}")
