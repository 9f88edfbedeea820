"""Resume tokens: what a signal's sender holds to resume one wait of one saga, once.

A token is ``rs1.<payload>.<mac>`` (base64url, no padding). The payload names the wait --
context, partition, saga id, step, wait number -- so the token routes itself to the saga's
partition inbox without a lookup. The MAC is HMAC-SHA256 over the payload with the
context's signal key, so nobody without the key can make a token, and changing any byte
(another saga, another step, another wait) breaks it. A token for a wait that has ended is
still valid but changes nothing: the saga records the late delivery and ignores it.

The context's key is derived from a master secret: ``EngineConfig.signal_secret``, else the
``REDSAGA_SIGNAL_SECRET`` environment variable, else 32 random bytes generated once per
context and stored in Redis with ``SET NX`` (so every worker and client of the context
agrees without configuration). Tokens are deterministic -- the decider makes them while
building commands, and replay must make the same ones -- so keep the secret stable:
changing it invalidates every outstanding token.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets
from dataclasses import dataclass
from typing import Any, Final

import msgspec

from bus import tagged_key
from bus._errors import redis_errors
from saga._errors import SagaError

SECRET_ENV: Final = "REDSAGA_SIGNAL_SECRET"  # noqa: S105 - the variable's name, not a secret
"""The environment variable holding the master signal secret."""
_PREFIX: Final = "rs1"
_MAX_TOKEN: Final = 2048
_LABEL: Final = b"redsaga/resume-token/v1\x00"


class InvalidToken(SagaError):
    """A resume token is malformed, forged or tampered with; nothing was delivered."""


@dataclass(frozen=True, slots=True)
class WaitRef:
    """The wait a token resumes."""

    context: str
    partition: int
    saga_id: str
    step: str
    n: int


class Signer:
    """Makes and checks the resume tokens of one context (holds its key; never log it)."""

    __slots__ = ("_key", "context")

    def __init__(self, context: str, key: bytes) -> None:
        if len(key) < 16:
            raise ValueError("a signal key has at least 16 bytes")
        self.context = context
        self._key = key

    @classmethod
    def from_secret(cls, secret: str | bytes, context: str) -> Signer:
        """The context's signer, its key derived from a master ``secret``."""
        master = secret.encode() if isinstance(secret, str) else secret
        if len(master) < 16:
            raise ValueError("the signal secret must have at least 16 bytes")
        return cls(context, hmac.new(master, b"context\x00" + context.encode(), hashlib.sha256).digest())

    def __repr__(self) -> str:
        return f"Signer(context={self.context!r})"

    def token(self, partition: int, saga_id: str, step: str, n: int) -> str:
        """The token of wait ``n`` of ``step`` in saga ``saga_id``."""
        payload = msgspec.json.encode([self.context, partition, saga_id, step, n])
        return f"{_PREFIX}.{_b64(payload)}.{_b64(self._mac(payload))}"

    def verify(self, token: str) -> WaitRef:
        """The wait ``token`` resumes; :class:`InvalidToken` if it was not made by this signer."""
        ref, payload, mac = _parse(token)
        if ref.context != self.context or not hmac.compare_digest(mac, self._mac(payload)):
            raise InvalidToken("resume token is not valid (forged, tampered with, or for another context)")
        return ref

    def _mac(self, payload: bytes) -> bytes:
        return hmac.new(self._key, _LABEL + payload, hashlib.sha256).digest()


def peek(token: str) -> WaitRef:
    """Read a token's wait **without** checking it (to find the context whose key checks it)."""
    return _parse(token)[0]


def _parse(token: str) -> tuple[WaitRef, bytes, bytes]:
    if not isinstance(token, str) or len(token) > _MAX_TOKEN:
        raise InvalidToken("resume token is malformed (too long or not text)")
    parts = token.strip().split(".")
    if len(parts) != 3 or parts[0] != _PREFIX:
        raise InvalidToken("resume token is malformed (expected rs1.<payload>.<signature>)")
    try:
        payload, mac = _unb64(parts[1]), _unb64(parts[2])
        context, partition, saga_id, step, n = msgspec.json.decode(
            payload, type=tuple[str, int, str, str, int]
        )
    except (ValueError, msgspec.DecodeError) as error:
        raise InvalidToken("resume token is malformed (undecodable payload)") from error
    return WaitRef(context, partition, saga_id, step, n), payload, mac


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def secret_key(context: str) -> str:
    """The Redis key holding a context's generated master secret (when none is configured)."""
    return tagged_key(f"{context}:meta", "signal-secret")


async def load_signer(redis: Any, context: str, secret: str | bytes | None = None) -> Signer:
    """The signer of ``context``: from ``secret``, the environment, or the secret in Redis."""
    secret = secret or os.environ.get(SECRET_ENV) or None
    if secret is None:
        key = secret_key(context)
        with redis_errors():
            await redis.set(key, secrets.token_hex(32), nx=True)
            stored = await redis.get(key)
        if stored is None:
            raise SagaError(f"the signal secret of context {context!r} vanished from Redis")
        secret = stored
    return Signer.from_secret(secret, context)
