"""What signing an entry costs, by construction, next to what the entry costs unsigned.

    python bench/signing.py [--entries 20000] [--payload 200]

Prints one JSON object per line. Each line signs (or verifies) the same command envelope --
a 3-step saga's charge command with its headers and a ``--payload``-byte payload -- and says
what one entry costs: ``rate_per_s`` entries per second, ``p50_ms``/``p99_ms`` per entry
(timed in batches of 100, divided), ``cpu_us_per_unit`` process CPU per entry.

The floors are the work each side does anyway: ``signing.floor`` encodes the entry's stream
fields (a publish), ``signing.verify.floor`` decodes them (a consume). Beside them:

- ``signing.blake2b.sign``/``verify``: what redsaga does (``bus/_auth.py``), through
  :class:`bus.Authenticator`: sign and encode, or check a decoded entry (the canonical bytes,
  then keyed BLAKE2b-128 over them);
- ``signing.blake2b.mac``, ``signing.hmac_sha256.mac``: the bare MAC over the same canonical
  bytes, for the choice of construction;
- ``signing.ed25519.sign``/``verify``: an Ed25519 signature over the same bytes
  (``cryptography``), the asymmetric option (a verifier could not forge);
- ``signing.blake2b.sign.unstamped``/``verify.unstamped``: the command without the saga's
  incarnation header (``inc``, what commands carried before it), and
  ``signing.timer.sign``/``signing.timer.sign.unstamped``: a timer's entry with and without
  the incarnation and due time in its payload: what binding entries to their time costs.

Compare ratios to the floor, not absolute numbers: the machine is shared and noisy.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import msgspec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import bus
from bus._auth import Authenticator, issue, keyed, mac_of

BATCH = 100
ORDERS, PAYMENTS = "orchestrator:orders", "participant:payments"


class Charge(msgspec.Struct, tag=True):
    order_id: str
    note: str


def envelope(payload_bytes: int, *, stamped: bool = True) -> bus.Envelope:
    headers = {"saga": "order_fulfilment@1", "step": "charge", "kind": "do"}
    if stamped:
        headers["inc"] = "1796397032315"  # the saga's incarnation (saga/store/trust.py)
    return bus.new_envelope(
        Charge(order_id="o-12345", note="x" * payload_bytes),
        max_bytes=1 << 20,
        source="orders",
        correlation_id="0193a0b1-aaaa-7bbb-8ccc-000000000000",
        causation_id="0193a0b1-aaaa-7bbb-8ccc-000000000001",
        idempotency_key="0193a0b1-aaaa-7bbb-8ccc-000000000000:charge:do:0",
        reply_to="rs:{orders:0}:inbox",
        headers=headers,
    )


def timer(*, stamped: bool) -> bus.Envelope:
    """A timer's entry as the orchestrator signs it (``saga/store/commit.py``, ``TimerTemplate``)."""
    payload = (
        b'["timeout","charge","do",1,1796397032315,1796397062315]'
        if stamped
        else b'["timeout","charge","do",1]'
    )
    saga_id = "0193a0b1-aaaa-7bbb-8ccc-000000000000"
    return bus.Envelope(
        id=f"{saga_id}:charge:do:1:timeout", type="TimerFired", payload=payload, correlation_id=saga_id
    )


def measure(name: str, entries: int, one: Callable[[], object]) -> dict[str, object]:
    per_entry_ms: list[float] = []
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(entries // BATCH):
        started = time.perf_counter()
        for _ in range(BATCH):
            one()
        per_entry_ms.append((time.perf_counter() - started) * 1000 / BATCH)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    per_entry_ms.sort()
    return {
        "name": name,
        "rate_per_s": round(entries / wall, 1),
        "p50_ms": round(statistics.median(per_entry_ms), 5),
        "p99_ms": round(per_entry_ms[min(len(per_entry_ms) - 1, int(len(per_entry_ms) * 0.99))], 5),
        "cpu_us_per_unit": round(cpu / entries * 1e6, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--entries", type=int, default=20_000)
    parser.add_argument("--payload", type=int, default=200, help="payload bytes of the entry")
    args = parser.parse_args()
    master = {"k1": os.urandom(32)}
    orchestrator = Authenticator([issue(master, ORDERS, sends_to=[PAYMENTS])])
    participant = Authenticator([issue(master, PAYMENTS, sends_to=[ORDERS])])
    plain = envelope(args.payload)
    flat = orchestrator.sign(plain, PAYMENTS, ORDERS).field_args()
    fields = {
        (k if isinstance(k, bytes) else str(k).encode()): v if isinstance(v, bytes) else str(v).encode()
        for k, v in zip(flat[::2], flat[1::2], strict=True)
    }
    limits = {"max_bytes": 1 << 20, "max_fields": 32}
    signed = bus.decode_fields(fields, **limits)
    unstamped = envelope(args.payload, stamped=False)
    unstamped_signed = orchestrator.sign(unstamped, PAYMENTS, ORDERS)
    timers = {stamped: timer(stamped=stamped) for stamped in (True, False)}
    message = plain.canonical(ORDERS, "k1")
    blake2b_key, hmac_key = keyed(os.urandom(32)), os.urandom(32)
    ed_key = Ed25519PrivateKey.generate()
    ed_signature, ed_public = ed_key.sign(message), ed_key.public_key()
    assert participant.verify(signed, PAYMENTS, PAYMENTS) == ORDERS
    runs: list[tuple[str, Callable[[], object]]] = [
        ("signing.floor", plain.field_args),
        ("signing.blake2b.sign", lambda: orchestrator.sign(plain, PAYMENTS, ORDERS).field_args()),
        ("signing.verify.floor", lambda: bus.decode_fields(fields, **limits)),
        ("signing.blake2b.verify", lambda: participant.verify(signed, PAYMENTS, PAYMENTS)),
        ("signing.blake2b.mac", lambda: mac_of(blake2b_key, message)),
        ("signing.hmac_sha256.mac", lambda: hmac.digest(hmac_key, message, hashlib.sha256)),
        ("signing.ed25519.sign", lambda: ed_key.sign(message)),
        ("signing.ed25519.verify", lambda: ed_public.verify(ed_signature, message)),
        (
            "signing.blake2b.sign.unstamped",
            lambda: orchestrator.sign(unstamped, PAYMENTS, ORDERS).field_args(),
        ),
        (
            "signing.blake2b.verify.unstamped",
            lambda: participant.verify(unstamped_signed, PAYMENTS, PAYMENTS),
        ),
        ("signing.timer.sign", lambda: orchestrator.sign(timers[True], ORDERS, ORDERS)),
        ("signing.timer.sign.unstamped", lambda: orchestrator.sign(timers[False], ORDERS, ORDERS)),
    ]
    for name, one in runs:
        print(json.dumps(measure(name, args.entries, one)), flush=True)


if __name__ == "__main__":
    main()
