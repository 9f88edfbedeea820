"""Where a context's resume-token keys live in Redis, and loading them.

With signing on, the orchestrator's keyring holds the token key and the orchestrator
publishes the public keys in ``rs:{<context>:meta}:token-keys``; with signing off the key
derives from a master secret: ``EngineConfig.signal_secret``, else ``REDSAGA_SIGNAL_SECRET``,
else 32 random bytes stored once per context in ``rs:{<context>:meta}:signal-secret``.
Making and checking tokens is pure (:mod:`saga.core.tokens`).
"""

from __future__ import annotations

import os
import secrets
from typing import Any, Final

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from bus import Authenticator
from bus.lowlevel import redis_errors
from saga.core.tokens import Signer, TokenVerifier, b64url, unb64url
from saga.errors import InvalidToken, SagaError
from saga.store.keys import ContextKeys

SECRET_ENV: Final = "REDSAGA_SIGNAL_SECRET"  # noqa: S105 - the variable's name, not a secret
"""The environment variable holding the master signal secret (signing off only)."""


def secret_key(context: str) -> str:
    """The Redis key of a context's generated master secret (signing off, none configured)."""
    return ContextKeys(context).signal_secret


def public_keys_key(context: str) -> str:
    """The Redis hash where a context's orchestrator publishes its token keys (key id -> raw)."""
    return ContextKeys(context).token_keys


async def load_signer(
    redis: Any, context: str, *, auth: Authenticator, secret: str | bytes | None = None, ttl_ms: int = 0
) -> Signer:
    """The signer of ``context``: from the keyring, else ``secret``, the environment or Redis.

    With signing on, only a process holding the context's orchestrator keyring has one:
    :class:`SagaError` otherwise.
    """
    if auth.enabled:
        signer = Signer.from_auth(auth, context, ttl_ms=ttl_ms)
        if signer is None:
            raise SagaError(
                f"this process cannot make resume tokens of context {context!r}: only its orchestrator can"
            )
        return signer
    secret = secret or os.environ.get(SECRET_ENV) or None
    if secret is None:
        key = secret_key(context)
        with redis_errors():
            await redis.set(key, secrets.token_hex(32), nx=True)
            stored = await redis.get(key)
        if stored is None:
            raise SagaError(f"the signal secret of context {context!r} vanished from Redis")
        secret = stored
    return Signer.from_secret(secret, context, ttl_ms=ttl_ms)


async def publish_verifier(redis: Any, signer: Signer) -> None:
    """Publish the context's public token keys (the orchestrator does, at start)."""
    keys = {kid: b64url(raw) for kid, raw in signer.public_keys().items()}
    with redis_errors():
        await redis.hset(public_keys_key(signer.context), mapping=keys)


async def load_verifier(redis: Any, context: str) -> TokenVerifier:
    """The context's published token keys (:class:`InvalidToken` when none are published)."""
    with redis_errors():
        raw = await redis.hgetall(public_keys_key(context))
    if not raw:
        raise InvalidToken(
            f"context {context!r} has published no token keys: no orchestrator of it has started "
            "with signing on"
        )
    return TokenVerifier(
        context,
        {k.decode(): Ed25519PublicKey.from_public_bytes(unb64url(v.decode())) for k, v in raw.items()},
    )
