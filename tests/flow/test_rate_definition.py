"""Declaring rate limits: rates parsed, names checked, which limit a command counts against."""

from __future__ import annotations

import pytest

from saga import App, DefinitionError, RateLimit
from saga.definition.rate import Limits


@pytest.mark.parametrize(
    ("rate", "per_second"),
    [("50/s", 50.0), ("3000/min", 50.0), ("2/h", 2 / 3600), ("0.5 / s", 0.5), (20, 20.0)],
)
def test_a_rate_is_per_second_whatever_it_is_written_in(rate: str | float, per_second: float) -> None:
    assert RateLimit("payments", rate).per_second == pytest.approx(per_second)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"name": "payments", "rate": "fast"}, "write it as <number>/<s|min|h>"),
        ({"name": "payments", "rate": "0/s"}, "must be above 0"),
        ({"name": "payments", "rate": -1}, "must be above 0"),
        ({"name": "pay{ments}", "rate": "1/s"}, "invalid rate limit name"),
        ({"name": "a:b", "rate": "1/s"}, "invalid rate limit name"),
        ({"name": "payments", "rate": "1/s", "burst": 0}, "burst must be a whole number"),
    ],
)
def test_a_bad_limit_fails_when_it_is_declared(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(DefinitionError, match=message):
        RateLimit(**kwargs)  # type: ignore[arg-type]


def test_a_limit_declared_twice_is_refused() -> None:
    with pytest.raises(DefinitionError, match="declared twice"):
        App("a", sagas=[], buses=[object()], limits=[RateLimit("p", "1/s"), RateLimit("p", "2/s")])  # type: ignore[list-item]


def test_a_participants_limit_comes_before_a_steps_and_a_branch_counts_as_its_group() -> None:
    limits = Limits([RateLimit("shop.charge", "1/s"), RateLimit("payments", "5/s")])
    assert limits.applying("shop", "charge", "payments").name == "payments"  # type: ignore[union-attr]
    assert limits.applying("shop", "charge", "bank").name == "shop.charge"  # type: ignore[union-attr]
    assert limits.applying("shop", "charge#3", "bank").name == "shop.charge"  # type: ignore[union-attr]
    assert limits.applying("shop", "ship", "carrier") is None
    assert not Limits()
