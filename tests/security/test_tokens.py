"""Resume tokens: who can make them, who can check them, and what they refuse."""

from __future__ import annotations

import os

import pytest

from bus import Authenticator
from bus._auth import issue
from saga import InvalidToken
from saga.core.tokens import Signer, TokenVerifier, check_wait, peek, unsigned

SECRET = "a-master-secret-of-32-characters"


def _signer(context: str = "orders", *, ttl_ms: int = 0) -> Signer:
    return Signer.from_secret(SECRET, context, ttl_ms=ttl_ms)


def test_secrets_shorter_than_16_bytes_are_refused() -> None:
    with pytest.raises(ValueError, match="the signal secret must have at least 16 bytes"):
        Signer.from_secret("short", "orders")


def test_the_signers_repr_shows_its_context_and_key_ids_never_its_key() -> None:
    assert repr(_signer()) == "Signer(context='orders', key_ids=['s'])"


def test_a_token_names_its_wait_and_is_accepted_only_by_its_own_context() -> None:
    orders, billing = _signer(), _signer("billing")
    token = orders.token(3, "saga-1", "approve", 1, incarnation=1234, now_ms=99)
    ref = orders.verify(token)
    assert (ref.context, ref.partition, ref.saga_id, ref.incarnation, ref.step, ref.n, ref.expires_ms) == (
        "orders", 3, "saga-1", 1234, "approve", 1, 0,
    )  # fmt: skip
    assert peek(token) == ref
    with pytest.raises(InvalidToken, match="for another context"):
        billing.verify(token)


def test_a_verifier_checks_tokens_with_the_public_keys_alone_and_cannot_make_any() -> None:
    signer = _signer()
    verifier = signer.verifier()
    assert type(verifier) is TokenVerifier
    assert not hasattr(verifier, "token")
    token = signer.token(0, "s1", "approve", 1, incarnation=5, now_ms=0)
    assert verifier.verify(token).saga_id == "s1"
    with pytest.raises(InvalidToken, match="forged or tampered"):
        verifier.verify(token[:-3] + ("AAA" if not token.endswith("AAA") else "BBB"))


def test_a_token_may_expire() -> None:
    signer = _signer(ttl_ms=60_000)
    token = signer.token(0, "s1", "approve", 1, incarnation=5, now_ms=1_000)
    assert signer.verify(token, now_ms=61_000).expires_ms == 61_000
    with pytest.raises(InvalidToken, match="expired"):
        signer.verify(token, now_ms=61_001)


def test_an_old_incarnations_token_and_a_token_for_another_wait_are_refused() -> None:
    ref = peek(_signer().token(0, "s1", "approve", 2, incarnation=5, now_ms=0))
    check_wait(ref, context="orders", partition=0, saga_id="s1", incarnation=5, wait=("approve", 2))
    with pytest.raises(InvalidToken, match="earlier saga under the same id"):
        check_wait(ref, context="orders", partition=0, saga_id="s1", incarnation=6)
    with pytest.raises(InvalidToken, match="another saga or partition"):
        check_wait(ref, context="orders", partition=1, saga_id="s1", incarnation=5)
    with pytest.raises(InvalidToken, match="another wait"):
        check_wait(ref, context="orders", partition=0, saga_id="s1", incarnation=5, wait=("approve", 1))


def test_keyring_tokens_rotate_every_key_id_verifies_the_newest_signs() -> None:
    old, new = os.urandom(32), os.urandom(32)
    before = Authenticator([issue({"k1": old}, "orchestrator:orders", sends_to=[])])
    during = Authenticator([issue({"k1": old, "k2": new}, "orchestrator:orders", sends_to=[])])
    after = Authenticator([issue({"k2": new}, "orchestrator:orders", sends_to=[])])
    signers = [Signer.from_auth(a, "orders") for a in (before, during, after)]
    assert all(signers)
    first, second, third = (s for s in signers if s is not None)
    issued_before = first.token(0, "s1", "approve", 1, incarnation=5, now_ms=0)
    issued_during = second.token(0, "s1", "approve", 1, incarnation=5, now_ms=0)
    assert peek(issued_during).key_id == "k2"
    assert second.verify(issued_before).key_id == "k1"  # in flight across the rotation
    assert third.verify(issued_during).key_id == "k2"
    with pytest.raises(InvalidToken, match="retired key"):
        third.verify(issued_before)


def test_only_the_orchestrators_keyring_makes_tokens() -> None:
    master = {"k1": os.urandom(32)}
    client = Authenticator([issue(master, "client:web", sends_to=["orchestrator:orders"])])
    assert Signer.from_auth(client, "orders") is None


@pytest.mark.parametrize(
    "token",
    ["rs2." + "A" * 5000 + ".sig", "rs2.only-two", "rs1.e30.AAAA", "rs2.!!!.AAAA", "rs2.e30.AAAA"],
    ids=["too-long", "two-parts", "older-format", "undecodable", "wrong-shape"],
)
def test_malformed_tokens_are_refused_before_any_check(token: str) -> None:
    with pytest.raises(InvalidToken, match="resume token is malformed"):
        _signer().verify(token)


def test_an_unsigned_reference_names_the_wait_and_only_its_context_signs_it_again() -> None:
    """A human task's command carries the reference; the task inbox makes the token from it."""
    signer = Signer.from_secret(SECRET, "orders")
    token = signer.token(0, "o-1", "approve.answer", 1, incarnation=5, now_ms=1000)
    reference = unsigned(token)
    assert peek(reference) == peek(token)
    with pytest.raises(InvalidToken, match="forged or tampered"):
        signer.verify(reference + ".")
    assert signer.complete(reference) == token
    with pytest.raises(InvalidToken, match="not this context's"):
        Signer.from_secret(SECRET, "billing").complete(reference)
    with pytest.raises(InvalidToken, match="malformed"):
        signer.complete(token)  # a token already: not a reference
