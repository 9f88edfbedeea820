"""What a saga waits for that lives outside its hash: an open human task, a place in a line.

``saga inspect`` reads the saga's own keys first (``saga/ops/inspect.py``); when its wait is
a human task's answer, the task (``rs:{ctx:n}:task:<id>``) says who holds it and until when;
when it waits for a concurrency key's slot, the line says how many are ahead.
"""

from __future__ import annotations

from typing import Any

from saga.core.model import SagaState
from saga.core.task_rules import Task
from saga.definition.human_tasks import ANSWER_SUFFIX
from saga.ops.inspect import SLOT_WAIT, Inspection, slot_waiting
from saga.ops.task_view import task_view, task_waiting
from saga.runtime.tasks import task_id_of
from saga.store.keys import Partition
from saga.store.slots import place_in_line
from saga.store.tasks import RedisTaskStore


async def explain_outside_waits(
    redis: Any, partition: Partition, state: SagaState, found: Inspection, now_ms: int
) -> None:
    """Complete ``found`` with the task the saga waits for, or its place in its line."""
    task = await waited_task(redis, partition, state)
    if task is not None and task.state == "open":
        found.task = task_view(task, now_ms)
        found.waiting_for = task_waiting(found.task, now_ms)
    if found.waiting_for.startswith(SLOT_WAIT):
        place = await place_in_line(redis, partition.context, partition.index, state.id)
        found.waiting_for = slot_waiting(found.waiting_for, place)


async def waited_task(redis: Any, partition: Partition, state: SagaState) -> Task | None:
    """The human task whose answer the saga's wait is for (``None``: it waits for none)."""
    wait = state.wait
    if wait is None or wait.kind != "signal" or not wait.step.endswith(ANSWER_SUFFIX):
        return None
    name = wait.step.removesuffix(ANSWER_SUFFIX)
    task_id = task_id_of(state.context, state.partition, state.id, name, wait.n)
    return await RedisTaskStore(redis).load(partition, task_id)
