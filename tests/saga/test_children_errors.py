"""A child-saga command or end report that cannot be handled fails with the right kind of error.

Permanent errors dead-letter the entry (it can never succeed); transient ones leave it for a
retry (a worker that knows the definition, or a child start still on its way).
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

import bus
from bus import Envelope, FakeClock, PermanentError, TransientError
from saga import EngineConfig
from saga.core.model import ParentLink
from saga.definition.registry import Registry
from saga.runtime.children import Children
from saga.store.commit import ParentReport
from tests.saga.compose_sagas import parent

pytestmark = pytest.mark.anyio


def command(type_name: str, payload: bytes, **headers: str) -> Envelope:
    return Envelope(id="c1", type=type_name, payload=payload, headers=headers)


@pytest.fixture
async def children() -> Any:
    redis = bus.connect(bus.MEMORY_URL)
    try:
        yield Children(redis, Registry([parent]), clock=FakeClock(), config=EngineConfig(), source="orders")
    finally:
        await redis.aclose()


CHILD_STEP = {"saga": parent.key, "step": "bill"}
LINK = ParentLink(
    context="orders", partition=0, saga_id="p", saga=parent.key, step="bill", attempt=1, command_id="x"
)


@pytest.mark.parametrize(
    ("envelope", "error", "message"),
    [
        (command("StartChild", b"{}", saga="nope@1", step="bill"), TransientError, "cannot handle a child"),
        (command("StartChild", b"{}", saga=parent.key, step="nope"), TransientError, "cannot handle a child"),
        (command("StartChild", b"{}", saga="parent@x", step="bill"), TransientError, "cannot handle a child"),
        (
            command("StartChild", b"{}", saga=parent.key, step="reserve"),
            PermanentError,
            "does not run a child",
        ),
        (command("StartChild", b"{}", **CHILD_STEP), PermanentError, "invalid StartChild"),
        (command("CancelChild", b"[]", **CHILD_STEP), PermanentError, "invalid CancelChild"),
        (
            command("CancelChild", b'{"saga":"invoicing@1","saga_id":"p/bill","reason":"x"}', **CHILD_STEP),
            TransientError,
            "child saga p/bill does not exist \\(yet\\)",
        ),
        (
            command("AdoptChild", b"{}", **CHILD_STEP),
            PermanentError,
            "unknown child-saga command 'AdoptChild'",
        ),
    ],
)
async def test_a_child_command_that_cannot_be_handled(
    children: Children, envelope: Envelope, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        await children.on_command(envelope, None)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("payload", "error", "message"),
    [
        (b"not json", PermanentError, "invalid child end report"),
        (
            msgspec.json.encode(
                ParentReport(child="c", saga="gone@9", parent=LINK, status="completed", ok=True)
            ),
            TransientError,
            "a worker serving it must forward this report",
        ),
    ],
)
async def test_an_end_report_that_cannot_be_forwarded(
    children: Children, payload: bytes, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        await children.forward(Envelope(id="r1", type="ParentReport", payload=payload))
