"""Retry policies: how a step, a compensation or a confirmation is retried."""

from __future__ import annotations

import hashlib
import typing
from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True, slots=True)
class Retry:
    """How a step (or a compensation) is retried after transient failures and timeouts.

    Attributes:
        attempts: Total attempts, the first included (1 = no retry).
        initial: Delay before the second attempt, in seconds.
        backoff: Each further delay is the previous one times this.
        max_delay: Longest delay, in seconds.
        jitter: Fraction of each delay that is randomised (deterministically per saga,
            step and attempt, so replay decides the same).
        non_retryable: Error type names that fail the step at once (as the participant's
            exception class name, e.g. ``"CardDeclined"``).
        on_exhausted: What happens when attempts run out: ``"dead_letter"`` parks the saga
            for an operator (docs/operations.md), ``"compensate"`` treats it as a permanent failure.

    """

    attempts: int = 3
    initial: float = 1.0
    backoff: float = 2.0
    max_delay: float = 60.0
    jitter: float = 0.2
    non_retryable: tuple[str, ...] = ()
    on_exhausted: Literal["dead_letter", "compensate"] = "dead_letter"

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError("Retry.attempts must be at least 1")
        if self.initial < 0 or self.max_delay < 0 or self.backoff < 1:
            raise ValueError("Retry delays must be >= 0 and backoff >= 1")
        if not 0 <= self.jitter <= 1:
            raise ValueError("Retry.jitter is a fraction between 0 and 1")

    def delay_ms(self, failed_attempt: int, seed: str) -> int:
        """Delay before the attempt after ``failed_attempt`` (deterministic jitter from ``seed``)."""
        base = min(self.max_delay, self.initial * self.backoff ** max(0, failed_attempt - 1))
        digest = hashlib.blake2b(f"{seed}:{failed_attempt}".encode(), digest_size=8).digest()
        fraction = int.from_bytes(digest, "big") / 2**64
        return int(base * (1 - self.jitter * fraction) * 1000)


NO_RETRY: typing.Final = Retry(attempts=1)
