"""Resume tokens: what a signer refuses to be made from, and what it refuses to accept."""

from __future__ import annotations

import pytest

from saga import InvalidToken
from saga._tokens import Signer, peek

SECRET = "a-master-secret-of-32-characters"


def test_keys_and_secrets_shorter_than_16_bytes_are_refused() -> None:
    with pytest.raises(ValueError, match="at least 16 bytes"):
        Signer("orders", b"short")
    with pytest.raises(ValueError, match="the signal secret must have at least 16 bytes"):
        Signer.from_secret("short", "orders")


def test_the_signers_repr_shows_its_context_and_never_its_key() -> None:
    signer = Signer.from_secret(SECRET, "orders")
    assert repr(signer) == "Signer(context='orders')"


def test_a_token_is_accepted_only_by_its_own_contexts_signer() -> None:
    orders, billing = Signer.from_secret(SECRET, "orders"), Signer.from_secret(SECRET, "billing")
    token = orders.token(3, "saga-1", "approve", 1)
    ref = orders.verify(token)
    assert (ref.context, ref.partition, ref.saga_id, ref.step, ref.n) == ("orders", 3, "saga-1", "approve", 1)
    assert peek(token) == ref
    with pytest.raises(InvalidToken, match="for another context"):
        billing.verify(token)


@pytest.mark.parametrize(
    "token",
    ["rs1." + "A" * 5000 + ".sig", "rs1.only-two", "rs2.e30.AAAA", "rs1.!!!.AAAA"],
    ids=["too-long", "two-parts", "other-prefix", "undecodable"],
)
def test_malformed_tokens_are_refused_before_any_check(token: str) -> None:
    with pytest.raises(InvalidToken, match="resume token is malformed"):
        Signer.from_secret(SECRET, "orders").verify(token)
