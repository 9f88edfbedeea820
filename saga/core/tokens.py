"""Resume tokens: what a signal's sender holds to resume one wait of one saga, once.

A token is ``rs2.<payload>.<signature>`` (base64url, no padding). The payload names the wait
-- context, partition, saga id, the saga's *incarnation* (when it was created), step, wait
number -- plus an expiry (0: none) and the key id that signed it, so the token routes
itself to the saga's partition inbox and an old token never resumes a new saga started
later under the same id. The signature is Ed25519 by the context's token key:

- only the context's orchestrator can make tokens (its keyring holds the key; see
  ``bus/_auth.py``), and it checks every signal's token when the entry arrives;
- anyone can check a token before sending it: the orchestrator publishes the public keys
  in ``rs:{<context>:meta}:token-keys``, so a client holds no secret that could mint one.

Keys rotate with the keyring: tokens carry the key id, and every key id of the keyring
verifies. Without a keyring (signing off) the key derives from a master secret, as before:
``EngineConfig.signal_secret``, else ``REDSAGA_SIGNAL_SECRET``, else 32 random bytes stored
once per context in Redis; then whoever reads that secret can make tokens.

Tokens are deterministic (Ed25519 signatures are), so replay makes the same ones; a token
for a wait that has ended is still valid but changes nothing: the saga records the late
delivery and ignores it.
"""

from __future__ import annotations

import base64
import binascii
import hmac
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

import msgspec
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from saga.errors import InvalidToken

if TYPE_CHECKING:
    from bus import Authenticator

SECRET_KEY_ID: Final = "s"  # noqa: S105 - a key id, not a secret
"""The key id of tokens made from a master signal secret."""
_PREFIX: Final = "rs2"
_MAX_TOKEN: Final = 2048
_LABEL: Final = b"redsaga/resume-token/v2\x00"


@dataclass(frozen=True, slots=True)
class WaitRef:
    """The wait a token resumes, as the token names it."""

    context: str
    partition: int
    saga_id: str
    incarnation: int
    """The saga's creation time (ms): a later saga under the same id has another."""
    step: str
    n: int
    expires_ms: int
    """When the token stops being accepted (0: never)."""
    key_id: str


class TokenVerifier:
    """Checks the resume tokens of one context (public keys only: it cannot make any)."""

    __slots__ = ("_public", "context")

    def __init__(self, context: str, public: Mapping[str, Ed25519PublicKey]) -> None:
        self.context = context
        self._public = dict(public)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(context={self.context!r}, key_ids={sorted(self._public)!r})"

    def public_keys(self) -> dict[str, bytes]:
        """The raw public keys, by key id (what the orchestrator publishes)."""
        return {kid: key.public_bytes(Encoding.Raw, PublicFormat.Raw) for kid, key in self._public.items()}

    def verify(self, token: str, *, now_ms: int | None = None) -> WaitRef:
        """The wait ``token`` resumes.

        :class:`InvalidToken` if this context did not make it, or (with ``now_ms``) it has
        expired.
        """
        ref, payload, signature = _parse(token)
        key = self._public.get(ref.key_id)
        if ref.context != self.context or key is None:
            raise InvalidToken(
                "resume token is not valid (for another context, or signed with a retired key)",
                saga=ref.saga_id,
                step=ref.step,
            )
        try:
            key.verify(signature, _LABEL + payload)
        except InvalidSignature as error:
            raise InvalidToken(
                "resume token is not valid (forged or tampered with)", saga=ref.saga_id, step=ref.step
            ) from error
        if now_ms is not None and ref.expires_ms and now_ms > ref.expires_ms:
            raise InvalidToken(
                f"resume token expired at {ref.expires_ms} ms: ask for a new one",
                saga=ref.saga_id,
                step=ref.step,
            )
        return ref


class Signer(TokenVerifier):
    """Makes (and checks) the resume tokens of one context: holds its private keys; never log it.

    ``ttl_ms`` > 0 makes tokens that expire that long after they were made.
    """

    __slots__ = ("_private", "_signing", "ttl_ms")

    def __init__(
        self, context: str, private: Mapping[str, Ed25519PrivateKey], *, signing: str, ttl_ms: int = 0
    ) -> None:
        if signing not in private:
            raise ValueError(f"no token key with id {signing!r}")
        super().__init__(context, {kid: key.public_key() for kid, key in private.items()})
        self._private = dict(private)
        self._signing = signing
        self.ttl_ms = ttl_ms

    @classmethod
    def from_secret(cls, secret: str | bytes, context: str, *, ttl_ms: int = 0) -> Signer:
        """The context's signer, its key derived from a master ``secret`` (signing off)."""
        master = secret.encode() if isinstance(secret, str) else secret
        if len(master) < 16:
            raise ValueError("the signal secret must have at least 16 bytes")
        seed = hmac.digest(master, _LABEL + context.encode(), "sha256")
        return cls(
            context,
            {SECRET_KEY_ID: Ed25519PrivateKey.from_private_bytes(seed)},
            signing=SECRET_KEY_ID,
            ttl_ms=ttl_ms,
        )

    @classmethod
    def from_auth(cls, auth: Authenticator, context: str, *, ttl_ms: int = 0) -> Signer | None:
        """The signer of ``context`` from the orchestrator keyring ``auth`` holds (``None``: none)."""
        keyring = auth.keyrings.get(f"orchestrator:{context}")
        if keyring is None:
            return None
        private = {
            s.kid: Ed25519PrivateKey.from_private_bytes(
                hmac.digest(s.receive, _LABEL + context.encode(), "sha256")
            )
            for s in keyring.sets
        }
        return cls(context, private, signing=keyring.sign_with, ttl_ms=ttl_ms)

    def token(self, partition: int, saga_id: str, step: str, n: int, *, incarnation: int, now_ms: int) -> str:
        """The token of wait ``n`` of ``step`` in saga ``saga_id`` (created at ``incarnation``)."""
        expires = now_ms + self.ttl_ms if self.ttl_ms else 0
        payload = msgspec.json.encode(
            [self.context, partition, saga_id, incarnation, step, n, expires, self._signing]
        )
        signature = self._private[self._signing].sign(_LABEL + payload)
        return f"{_PREFIX}.{b64url(payload)}.{b64url(signature)}"

    def complete(self, reference: str) -> str:
        """The token whose :func:`unsigned` reference is ``reference``: signed again, the same token.

        What the task inbox does with a human task's wait: the command that opens the task,
        which the operator may read, carries the reference only, and the inbox (in the
        orchestrator's worker) makes the token from it. :class:`InvalidToken` for a
        reference of another context or of a key id this signer does not hold.
        """
        ref, payload, _ = _parse(f"{reference.strip()}.")  # a signed token has a part too many
        key = self._private.get(ref.key_id)
        if ref.context != self.context or key is None:
            raise InvalidToken(
                "resume token reference is not this context's (or its key was retired)",
                saga=ref.saga_id,
                step=ref.step,
            )
        return f"{_PREFIX}.{b64url(payload)}.{b64url(key.sign(_LABEL + payload))}"

    def verifier(self) -> TokenVerifier:
        """A verifier of this signer's tokens that cannot make any."""
        return TokenVerifier(self.context, {kid: key.public_key() for kid, key in self._private.items()})


def check_wait(
    ref: WaitRef,
    *,
    context: str,
    partition: int,
    saga_id: str,
    incarnation: int,
    wait: tuple[str, int] | None = None,
) -> None:
    """Refuse (:class:`InvalidToken`) a token delivered to another saga than the one it names.

    ``incarnation`` is the saga's creation time: a token of an earlier saga under the same id
    names another. ``wait`` (step, number), when given, is the wait the delivery claims.
    """
    if wait is not None and wait != (ref.step, ref.n):
        raise InvalidToken("the signal names another wait than its resume token", saga=saga_id, step=ref.step)
    if (ref.context, ref.partition, ref.saga_id) != (context, partition, saga_id):
        raise InvalidToken(
            "resume token names another saga or partition than it was delivered to",
            saga=saga_id,
            step=ref.step,
        )
    if ref.incarnation != incarnation:
        raise InvalidToken(
            "resume token is for an earlier saga under the same id (it ended; this one started later)",
            saga=saga_id,
            step=ref.step,
        )


def unsigned(token: str) -> str:
    """``token`` without its signature: it names the wait but resumes nothing (:meth:`Signer.complete`)."""
    return token.rpartition(".")[0]


def peek(token: str) -> WaitRef:
    """Read a token's wait **without** checking it (to find the context whose keys check it).

    An :func:`unsigned` reference is read too.
    """
    return _parse(token if token.count(".") == 2 else f"{token}.")[0]


def _parse(token: str) -> tuple[WaitRef, bytes, bytes]:
    if not isinstance(token, str) or len(token) > _MAX_TOKEN:
        raise InvalidToken("resume token is malformed (too long or not text)")
    parts = token.strip().split(".")
    if len(parts) != 3 or parts[0] != _PREFIX:
        raise InvalidToken(f"resume token is malformed (expected {_PREFIX}.<payload>.<signature>)")
    try:
        payload, signature = unb64url(parts[1]), unb64url(parts[2])
        fields = msgspec.json.decode(payload, type=tuple[str, int, str, int, str, int, int, str])
    except (ValueError, binascii.Error, msgspec.DecodeError) as error:
        raise InvalidToken("resume token is malformed (undecodable payload)") from error
    return WaitRef(*fields), payload, signature


def b64url(raw: bytes) -> str:
    """``raw`` as unpadded base64url (how tokens and published keys are written)."""
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def unb64url(text: str) -> bytes:
    """The bytes of unpadded base64url ``text``."""
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
