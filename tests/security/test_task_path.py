"""A human task is answered through the task path alone, on a real ``redis-server`` with the
generated ACL users: whoever holds ``redsaga.tasks`` (it reads the resume tokens) and a client
keyring writes the answer's signal itself, past the authorizer and ann's claim. The
orchestrator finds the task still open, dead-letters the signal with the reason, and the saga
waits on; ann's answer through ``TaskClient`` still resumes it.
"""

from __future__ import annotations

import anyio
import msgspec
import pytest

import bus
from bus import Envelope
from saga import SagaClient, SagaStatus
from saga.runtime.protocol import SIGNAL, SignalDelivery
from saga.store.trust import inbox_audience
from tests.helpers import dead_letters
from tests.saga.task_sagas import Approval
from tests.security.test_task_tokens import APP, REFUNDS, Opened, opened

pytestmark = [pytest.mark.anyio, pytest.mark.redis]
__all__ = ["opened"]


async def test_a_signal_written_past_the_task_client_is_dead_lettered(opened: Opened) -> None:
    users, task = opened.users, opened.task
    stolen = users.client("redsaga.tasks")
    token = (await stolen.hget(REFUNDS.task_tokens, task.id)).decode()  # it may read them
    answer = msgspec.json.encode({"answer": {"approved": True}, "by": "mallory"})
    delivery = SignalDelivery(
        step=f"{task.step}.answer", n=task.n, data=msgspec.Raw(answer), by="mallory", token=token
    )
    envelope = Envelope(
        id=bus.uuid7(), type=SIGNAL, correlation_id="r1", payload=msgspec.json.encode(delivery)
    )
    signed = users.auth("client:web").sign(envelope, inbox_audience("refunds"), "client:web")
    await stolen.xadd(REFUNDS.inbox.key, signed.to_fields())  # type: ignore[arg-type]
    with anyio.fail_after(30):
        await opened.worker.run_until_idle()
    client = SagaClient(users.client("redsaga.client"), APP.registry, config=users.config("client:web"))
    assert (await client.get("r1")).status == SagaStatus.SUSPENDED
    [letter] = await dead_letters(users.admin, REFUNDS.inbox)
    assert (
        f"signal refused: task {task.id} is still open: a task is answered through the task client"
        in letter["reason"]
    )
    assert (await opened.tasks.show(task.id)).holder_at(0) == "ann"

    await opened.tasks.complete(task.id, Approval(approved=True), by="ann")  # the task path
    with anyio.fail_after(30):
        await opened.worker.run_until_idle()
    assert (await client.get("r1")).status == SagaStatus.COMPLETED
    assert len(await dead_letters(users.admin, REFUNDS.inbox)) == 1
