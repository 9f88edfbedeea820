"""Authenticated entries: every entry says which principal wrote it, with a MAC to prove it.

A **principal** is a process role with a name: ``orchestrator:orders``, ``participant:payments``,
``client:web``, ``operator:oncall``, ``service:shipping`` (a plain bus service). An entry it
writes carries three items in its envelope (``bus/_envelope.py``) that an unsigned one leaves empty::

    p    the principal that signed it          k    the key id (rotation: several verify)
    mac  keyed BLAKE2b-128 over the envelope, 16 raw bytes

The MAC covers every field that identifies or carries the message, as decoded (the envelope's
id, type, schema version, payload, source, correlation, causation, idempotency key, reply
stream, attempt, headers, and ``p`` and ``k``; :meth:`bus.Envelope.canonical`), not ``at``: a
timer's entry is stamped with the time Redis fires it, after it was signed. BLAKE2b in keyed mode is
a MAC by design (RFC 7693); it costs half of HMAC-SHA256 here and a thirtieth of an Ed25519
signature, which matters at ten entries per saga (``bench/signing.py``, docs/security.md).

**Keys.** Every key descends from a master secret per key id, which only ``saga keys`` holds;
each process gets a *keyring* with just what it needs (``saga keys issue``)::

    receiving root of A      Q(A)      = HMAC(master, "redsaga/receive/v1" 0 A)
    key from S to A          K(S -> A) = HMAC(Q(A), "redsaga/from/v1" 0 S)

A principal holds its own receiving root (it derives the key of any sender *to itself*, so it
can check anyone, but a key it derives only ever proves a message addressed to itself) and,
for each audience it sends to, that one sending key. So a participant holding the key its
orchestrator's commands are checked with can forge only commands to itself, and a stolen
participant keyring cannot sign a timer, a signal or another participant's reply. A broadcast
stream (domain events) is its own audience, ``stream:<key>``: its subscribers share its
receiving root, and the Redis ACL keeps them from writing the stream.

**Modes.** ``require`` (the default with a keyring) dead-letters an unsigned entry, a bad MAC,
an unknown key id or an unexpected signer with the reason; ``log`` checks and reports the
same (a warning, and the ``unauthenticated`` incident count) but lets the entry through, for
rolling signing out; ``off`` (no keyring) signs and checks nothing.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import hmac
import os
import re
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

import msgspec

from bus._envelope import Envelope
from bus._errors import AuthError, Unauthenticated
from bus._log import get_logger

_log = get_logger("redsaga.bus")

Mode = Literal["require", "log", "off"]
MODES: Final = ("require", "log", "off")
ROLES: Final = ("orchestrator", "participant", "client", "operator", "service")
KEYRING_ENV: Final = "REDSAGA_KEYRING"
"""A keyring's file path, or the keyring itself as JSON (it starts with ``{``)."""
VERIFY_ENV: Final = "REDSAGA_VERIFY"
"""``require`` (default with a keyring), ``log`` or ``off``."""
MAC_BYTES: Final = 16
_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,64}")
_KID = re.compile(r"[A-Za-z0-9_.\-]{1,32}")
_RECEIVE: Final = b"redsaga/receive/v1\x00"
_FROM: Final = b"redsaga/from/v1\x00"
_PAIR_CACHE: Final = 4096


def principal(role: str, name: str) -> str:
    """The principal ``<role>:<name>``; :class:`AuthError` for an unknown role or unsafe name."""
    if role not in ROLES:
        raise AuthError(f"unknown principal role {role!r} (one of {', '.join(ROLES)})")
    if not _NAME.fullmatch(name):
        raise AuthError(f"principal name {name!r} must be 1-64 characters of A-Z a-z 0-9 _ . -")
    return f"{role}:{name}"


def role_of(name: str) -> str:
    """The role part of a principal (``participant`` of ``participant:payments``)."""
    return name.partition(":")[0]


def check_principal(name: str) -> str:
    """``name`` if it is a well-formed principal, else :class:`AuthError`."""
    role, _, rest = name.partition(":")
    return principal(role, rest)


def stream_audience(stream_key: str) -> str:
    """The audience of a broadcast stream (its subscribers share its receiving root)."""
    return f"stream:{stream_key}"


def receiving_root(master: bytes, audience: str) -> bytes:
    """``Q(audience)``: what ``audience`` derives every sender's key to it from."""
    return hmac.digest(master, _RECEIVE + audience.encode(), "sha256")


def pair_key(root: bytes, sender: str) -> bytes:
    """``K(sender -> audience)`` from the audience's receiving root."""
    return hmac.digest(root, _FROM + sender.encode(), "sha256")


def keyed(key: bytes) -> Any:
    """A BLAKE2b-128 hasher keyed with ``key``, to copy per message (the key block is hashed once)."""
    return hashlib.blake2b(key=key, digest_size=MAC_BYTES)


def mac_of(hasher: Any, message: bytes) -> bytes:
    """The MAC of ``message`` under a :func:`keyed` hasher (:data:`MAC_BYTES` raw bytes)."""
    h = hasher.copy()
    h.update(message)
    digest: bytes = h.digest()
    return digest


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _unb64(text: str, what: str) -> bytes:
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError) as error:
        raise AuthError(f"{what} is not base64url") from error


class _KeySetFile(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    receive: str
    send: dict[str, str] = msgspec.field(default_factory=dict)
    streams: dict[str, str] = msgspec.field(default_factory=dict)


class _KeyringEntry(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    keys: dict[str, _KeySetFile]
    sign_with: str = ""


class _KeyringFile(msgspec.Struct, forbid_unknown_fields=True):
    redsaga_keyring: int
    principals: dict[str, _KeyringEntry]


@dataclass(frozen=True, slots=True)
class KeySet:
    """One key id's keys of one principal (secret: never printed, logged or compared)."""

    kid: str
    receive: bytes = field(repr=False)
    send: Mapping[str, bytes] = field(repr=False, default_factory=dict)
    """Audience -> ``K(principal -> audience)``."""
    streams: Mapping[str, bytes] = field(repr=False, default_factory=dict)
    """Broadcast stream key -> that stream's receiving root (for its subscribers)."""


@dataclass(frozen=True, slots=True)
class Keyring:
    """One principal's keys, by key id (oldest first); ``sign_with`` names the one that signs."""

    principal: str
    sets: tuple[KeySet, ...]
    sign_with: str

    def __post_init__(self) -> None:
        check_principal(self.principal)
        if not self.sets:
            raise AuthError(f"the keyring of {self.principal} holds no key")
        if self.sign_with not in {s.kid for s in self.sets}:
            raise AuthError(
                f"the keyring of {self.principal} cannot sign with unknown key id {self.sign_with!r}"
            )

    def key_set(self, kid: str) -> KeySet | None:
        """The keys of key id ``kid``, if this keyring has them."""
        for key_set in self.sets:
            if key_set.kid == kid:
                return key_set
        return None

    @property
    def key_ids(self) -> list[str]:
        """Every key id this keyring verifies, oldest first."""
        return [s.kid for s in self.sets]


def load_keyrings(source: str | Path) -> list[Keyring]:
    """Read a keyring file (one process's principals), or the same JSON given as text."""
    if isinstance(source, str) and source.lstrip().startswith("{"):
        return decode_keyrings(source.encode())
    path = Path(source)
    try:
        raw = path.read_bytes()
    except OSError as error:
        raise AuthError(f"cannot read the keyring {path}: {error.strerror}") from error
    return decode_keyrings(raw)


def decode_keyrings(raw: bytes) -> list[Keyring]:
    """Decode the keyring file format that ``saga keys issue`` writes."""
    try:
        parsed = msgspec.json.decode(raw, type=_KeyringFile)
    except msgspec.DecodeError as error:
        raise AuthError(f"the keyring is not valid: {error}") from error
    if parsed.redsaga_keyring != 1:
        raise AuthError(f"unsupported keyring format {parsed.redsaga_keyring} (this redsaga reads 1)")
    keyrings = []
    for who, entry in parsed.principals.items():
        sets = []
        for kid, keys in entry.keys.items():
            check_key_id(kid)
            sets.append(
                KeySet(
                    kid,
                    _unb64(keys.receive, f"key {kid} receive"),
                    {a: _unb64(k, f"key {kid} send") for a, k in keys.send.items()},
                    {s: _unb64(k, f"key {kid} stream") for s, k in keys.streams.items()},
                )
            )
        keyrings.append(Keyring(who, tuple(sets), entry.sign_with or (sets[-1].kid if sets else "")))
    return keyrings


def encode_keyrings(keyrings: Iterable[Keyring]) -> bytes:
    """Encode keyrings in the file format (it holds secrets: write it with care)."""
    principals = {
        k.principal: _KeyringEntry(
            {
                s.kid: _KeySetFile(
                    _b64(s.receive),
                    {a: _b64(key) for a, key in s.send.items()},
                    {name: _b64(root) for name, root in s.streams.items()},
                )
                for s in k.sets
            },
            k.sign_with,
        )
        for k in keyrings
    }
    return msgspec.json.format(msgspec.json.encode(_KeyringFile(1, principals)), indent=2) + b"\n"


def check_key_id(kid: str) -> str:
    """``kid`` if it is a well-formed key id, else :class:`AuthError`."""
    if not _KID.fullmatch(kid):
        raise AuthError(f"key id {kid!r} must be 1-32 characters of A-Z a-z 0-9 _ . -")
    return kid


class Authenticator:
    """Signs what a process's principals write and checks what they read (module docstring).

    A process may act as several principals (the demo runs an orchestrator and three
    participants); it holds one :class:`Keyring` for each. ``Authenticator()`` is signing
    turned off: nothing is signed, everything is accepted, :meth:`verify` names no one.
    """

    __slots__ = ("_chosen", "_pairs", "_sending", "keyrings", "mode")

    def __init__(self, keyrings: Iterable[Keyring] = (), mode: Mode | None = None) -> None:
        self.keyrings = {k.principal: k for k in keyrings}
        resolved: Mode = mode or ("require" if self.keyrings else "off")
        if resolved not in MODES:
            raise AuthError(f"unknown verification mode {resolved!r} (one of {', '.join(MODES)})")
        if not self.keyrings and resolved != "off":
            raise AuthError(f"verification mode {resolved!r} needs a keyring (set {KEYRING_ENV})")
        self.mode: Mode = resolved
        self._chosen = mode == "off"  # signing off because someone said so, not for want of a keyring
        self._pairs: OrderedDict[tuple[str, str, str], Any] = OrderedDict()  # keyed hashers
        self._sending: dict[tuple[str, str], Any] = {}  # (signer, audience): bounded by the keyrings

    def __repr__(self) -> str:
        return f"Authenticator(principals={sorted(self.keyrings)!r}, mode={self.mode!r})"

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Authenticator:
        """The authenticator ``REDSAGA_KEYRING`` and ``REDSAGA_VERIFY`` describe (off if unset).

        The same values give the same (shared) authenticator: it is read once per value.
        """
        env = os.environ if environ is None else environ
        return _from_values(env.get(KEYRING_ENV, ""), env.get(VERIFY_ENV, ""))

    @property
    def enabled(self) -> bool:
        """Whether this process signs (and checks) entries."""
        return bool(self.keyrings)

    @property
    def off_on_purpose(self) -> bool:
        """Whether signing is off because it was turned off explicitly.

        That is ``Authenticator(mode="off")`` (:data:`bus.SIGNING_OFF`) or ``REDSAGA_VERIFY=off``
        in the environment, not merely no keyring configured.
        """
        return not self.keyrings and (self._chosen or os.environ.get(VERIFY_ENV) == "off")

    def refuse_unsigned(self, who: str) -> None:
        """Raise :class:`AuthError` if ``who`` would run with signing off when nobody chose that.

        The one rule for every process that writes or acts on entries (``saga worker``, an
        embedded worker or client): no keyring is an error, unless signing was turned off on
        purpose (:attr:`off_on_purpose`).
        """
        if not self.keyrings and not self.off_on_purpose:
            raise AuthError(
                f"signing is off: {who} would act on entries nobody checked. Give it its keyring "
                f"({KEYRING_ENV}, written by `saga keys issue`), or set {VERIFY_ENV}=off to run "
                "without (development only)"
            )

    def check_running(self, who: str, *, embedded: bool, warn: bool = True) -> None:
        """The one rule for a process about to write or act on entries.

        :meth:`refuse_unsigned` unless its Redis is the embedded in-process one (``embedded``:
        nobody else can write it); a process that runs unauthenticated then says so once at
        start-up (``warn``: a worker does; a client used by one-shot commands does not).
        """
        if not embedded:
            self.refuse_unsigned(who)
        if warn and not self.keyrings:
            _log.warning("running unauthenticated: nothing is signed, every entry is accepted", process=who)

    def require(self, who: str) -> None:
        """Raise :class:`AuthError` unless signing is off or this process holds ``who``'s keyring."""
        if self.keyrings and who not in self.keyrings:
            raise AuthError(
                f"this process acts as {who} but its keyring holds only {', '.join(sorted(self.keyrings))}; "
                f"issue one for {who} with `saga keys issue`"
            )

    def signer_for(self, *roles: str) -> str:
        """The principal a client of these roles signs as (``""`` with signing off).

        That is this process's first keyring of the first role that has one;
        :class:`AuthError` if none has.
        """
        if not self.keyrings:
            return ""
        for role in roles:
            found = sorted(p for p in self.keyrings if role_of(p) == role)
            if found:
                return found[0]
        raise AuthError(
            f"this process holds no keyring of a {' or '.join(roles)} principal "
            f"(it holds {', '.join(sorted(self.keyrings))}); issue one with `saga keys issue`"
        )

    def require_reader(self, holder: str, audience: str) -> None:
        """Raise :class:`AuthError` unless signing is off or ``holder`` can check entries for ``audience``."""
        self.require(holder)
        keyring = self.keyrings.get(holder)
        if keyring is not None and _root(keyring.sets[-1], holder, audience) is None:
            raise AuthError(
                f"the keyring of {holder} cannot check entries for {audience}; issue it again with "
                "`saga keys issue` for an app that subscribes there"
            )

    def sign(self, envelope: Envelope, audience: str, signer: str) -> Envelope:
        """``envelope`` signed by ``signer`` for ``audience`` (unchanged when signing is off).

        Raises :class:`AuthError` when this process holds no keyring for ``signer``, or its
        keyring no key for ``audience``.
        """
        if not self.keyrings:
            return envelope
        keyring = self.keyrings.get(signer)
        if keyring is None:
            self.require(signer)
            raise AssertionError  # pragma: no cover - require raised
        kid = keyring.sign_with
        hasher = self._sending.get((signer, audience))
        if hasher is None:
            hasher = self._sending[signer, audience] = self._sending_key(keyring, kid, audience)
        mac = mac_of(hasher, envelope.canonical(signer, kid))
        return msgspec.structs.replace(envelope, signer=signer, key_id=kid, mac=mac)

    def verify(
        self, envelope: Envelope, audience: str, holder: str, *, senders: frozenset[str] | None = None
    ) -> str:
        """The principal that signed ``envelope`` for ``audience``; :class:`Unauthenticated` if none did.

        ``envelope`` is the entry as decoded (:func:`bus.decode_fields`). ``holder`` is the
        principal of this process whose keyring checks it (the audience itself, or a
        subscriber of the ``stream:`` audience); ``senders``, when given, the only principals
        that may have signed it. With signing off it returns ``""`` and checks nothing.
        """
        if not self.keyrings:
            return ""
        signer, kid, mac = envelope.signer, envelope.key_id, envelope.mac
        if not (signer and kid and mac):
            raise Unauthenticated("entry is not signed (no signer, key id or MAC)", signer)
        hasher = self._pairs.get((kid, audience, signer))  # a signer seen before: checked already
        if hasher is None:
            hasher = self._pair_for(holder, kid, audience, signer)
        if not hmac.compare_digest(mac_of(hasher, envelope.canonical(signer, kid)), mac):
            raise Unauthenticated(f"entry's MAC does not verify (signed as {signer}, key id {kid})", signer)
        if senders is not None and signer not in senders:
            allowed = ", ".join(sorted(senders))
            raise Unauthenticated(f"signed by {signer}, which may not write here (only {allowed})", signer)
        return signer

    def _pair_for(self, holder: str, kid: str, audience: str, signer: str) -> Any:
        """The key ``signer`` signs with for ``audience``, as ``holder``'s keyring derives it."""
        try:
            check_principal(signer)
        except AuthError as error:
            raise Unauthenticated(f"entry names an invalid signer: {error}") from error
        keyring = self.keyrings.get(holder)
        key_set = None if keyring is None else keyring.key_set(kid)
        root = None if key_set is None else _root(key_set, holder, audience)
        if root is None:
            raise Unauthenticated(
                f"entry is signed with key id {kid!r}, which this keyring does not hold", signer
            )
        return self._pair(root, kid, audience, signer)

    def _sending_key(self, keyring: Keyring, kid: str, audience: str) -> Any:
        """The keyed hasher ``keyring``'s principal signs with for ``audience``."""
        key_set = keyring.key_set(kid)
        assert key_set is not None  # noqa: S101 - Keyring checks sign_with
        given = key_set.send.get(audience)
        if given is not None:
            return keyed(given)
        root = _root(key_set, keyring.principal, audience)  # to itself, or a stream it reads
        key = None if root is None else self._pair(root, kid, audience, keyring.principal)
        if key is None:
            raise AuthError(
                f"the keyring of {keyring.principal} (key id {kid}) has no key for sending to {audience}; "
                "issue it again with `saga keys issue` for an app that sends there"
            )
        return key

    def _pair(self, root: bytes, kid: str, audience: str, sender: str) -> Any:
        """The keyed hasher of ``K(sender -> audience)``, derived once from ``root``."""
        cache_key = (kid, audience, sender)  # the root is a function of these (and the master)
        key = self._pairs.get(cache_key)
        if key is None:
            key = keyed(pair_key(root, sender))
            self._pairs[cache_key] = key
            if len(self._pairs) > _PAIR_CACHE:  # bounded: a flood of forged signer names
                self._pairs.popitem(last=False)
        return key


@functools.lru_cache(maxsize=8)
def _from_values(source: str, mode: str) -> Authenticator:
    if mode and mode not in MODES:
        raise AuthError(f"{VERIFY_ENV}={mode!r} is not one of {', '.join(MODES)}")
    return Authenticator(load_keyrings(source) if source else (), mode or None)  # type: ignore[arg-type]


def _root(key_set: KeySet, holder: str, audience: str) -> bytes | None:
    """The receiving root ``holder``'s keys give for ``audience`` (itself, or a stream it reads)."""
    if audience == holder:
        return key_set.receive
    if audience.startswith("stream:"):
        return key_set.streams.get(audience.removeprefix("stream:"))
    return None


OFF: Final = Authenticator(mode="off")
"""Signing turned off on purpose (development and tests; :attr:`Authenticator.off_on_purpose`)."""


def issue(
    masters: Mapping[str, bytes],
    who: str,
    *,
    sends_to: Iterable[str],
    streams: Iterable[str] = (),
    sign_with: str | None = None,
) -> Keyring:
    """The keyring of principal ``who`` from the master secrets (key id -> secret).

    ``sends_to`` are the principals (and ``stream:<key>`` audiences) it writes to;
    ``streams`` the broadcast streams it subscribes to (it gets their receiving roots).
    """
    check_principal(who)
    if not masters:
        raise AuthError("no master key to issue a keyring from (saga keys generate)")
    audiences = sorted(set(sends_to) - {who})
    subscribed = sorted(set(streams))
    sets = tuple(
        KeySet(
            kid,
            receiving_root(master, who),
            {a: pair_key(receiving_root(master, a), who) for a in audiences},
            {s: receiving_root(master, stream_audience(s)) for s in subscribed},
        )
        for kid, master in masters.items()
    )
    return Keyring(who, sets, sign_with or sets[-1].kid)
