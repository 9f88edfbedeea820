"""One child saga per step kind, that kind as its last step, and a parent that runs each.

A child step's output is its child's last step's output (docs/composition.md), whatever
that step is: a command, a local action, a parallel group (its branches' outputs by name), a
first-of-N group (the winner's), a map and a map of children (the list), a nested child (its
own last step's), a TCC step (the try's), a signal wait (the signal), an event wait (the
event), a sleep (none). :data:`KINDS` lists what the parent's ``kid`` step must read back.
The children live in the ``billing`` context, the parents in ``compose``; the ``worker``
participant of ``compose_sagas`` does every piece of work.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import msgspec

from saga import Command, Saga, command
from tests.saga.compose_sagas import CONTEXT, Confirm, Plan, Worked, work

CHILDREN = "billing"
EVENTS = "ledger.events"


class Posted(msgspec.Struct, tag=True, frozen=True):
    """Another context's event that the event-wait child waits for."""

    ref: str
    amount: int


def _items(plan: Plan) -> list[str]:
    return plan.items


def single(kind: str) -> Saga[Plan]:
    """A child with one step of ``kind`` (a command, an action, a TCC step, a wait)."""
    child: Saga[Plan] = Saga(f"last_{kind}", context=CHILDREN, data=Plan)
    if kind == "step":

        @child.step(reply=Worked)
        def last(data: Plan) -> Command:
            return work("last", data)

    elif kind == "action":

        @child.action()
        async def last(data: Plan) -> Worked:
            return Worked(piece=f"action for {data.id}")

    elif kind == "tcc":

        @child.tcc(reply=Worked, confirm="confirm_hold", cancel="cancel_hold", expires=timedelta(minutes=5))
        def last(data: Plan) -> Command:
            return work("hold", data)

        @child.compensation()
        def confirm_hold(data: Plan) -> Command:
            return command("worker", Confirm(piece="hold", plan=data))

        @child.compensation()
        def cancel_hold(data: Plan) -> Command:
            return work("cancel-hold", data)

    elif kind == "sleep":
        child.sleep("last", timedelta(minutes=5))
    elif kind == "signal":
        child.wait_signal("last", output=Worked)
    elif kind == "event":
        child.wait_event(
            "last", stream=EVENTS, message=Posted, key=lambda event: event.ref, match=lambda plan: plan.id
        )
    return child


def grouped(kind: str) -> Saga[Plan]:
    """A child whose last step is a group: parallel, first-of-N (one branch at a time), map."""
    child: Saga[Plan] = Saga(f"last_{kind}", context=CHILDREN, data=Plan)
    if kind == "map":

        @child.map(items=_items, reply=Worked)
        def last(data: Plan, item: str) -> Command:
            return work(f"item-{item}", data)

        return child
    group = child.parallel("last") if kind == "parallel" else child.first_of("last", concurrency=1)
    for name in ("left", "right"):

        def branch(data: Plan, name: str = name) -> Command:
            return work(name, data)

        group.step(reply=Worked, name=name)(branch)
    return child


grandchild: Saga[Plan] = Saga("last_of_nested", context=CHILDREN, data=Plan)


@grandchild.map(items=_items, reply=Worked)
def deep(data: Plan, item: str) -> Command:
    return work(f"deep-{item}", data)


def nesting(kind: str) -> Saga[Plan]:
    """A child whose last step runs ``grandchild`` (a map as its last step): once, or per item."""
    child: Saga[Plan] = Saga(f"last_{kind}", context=CHILDREN, data=Plan)
    if kind == "child":
        child.child("last", saga=grandchild, data=lambda plan: plan)
    else:
        child.map_child(
            "last", saga=grandchild, items=_items, data=lambda _plan, item: Plan(id=item, items=[item])
        )
    return child


def _worked(*pieces: str) -> list[Worked]:
    return [Worked(piece=piece) for piece in pieces]


@dataclass(frozen=True)
class Kind:
    """A step kind as a child's last step, the parent running that child, and its output."""

    name: str
    child: Saga[Plan]
    output: Any
    """What the parent's ``kid`` step's output decodes as."""

    @property
    def parent(self) -> Saga[Plan]:
        return PARENTS[self.name]


PLAN = Plan(id="p1", items=["a", "b"])
KINDS = [
    Kind("step", single("step"), Worked(piece="last")),
    Kind("action", single("action"), Worked(piece="action for p1")),
    Kind(
        "parallel",
        grouped("parallel"),
        {"left": {"type": "Worked", "piece": "left"}, "right": {"type": "Worked", "piece": "right"}},
    ),
    Kind("first_of", grouped("first_of"), Worked(piece="left")),
    Kind("map", grouped("map"), _worked("item-a", "item-b")),
    Kind("child", nesting("child"), _worked("deep-a", "deep-b")),
    Kind("map_child", nesting("map_child"), [_worked("deep-a"), _worked("deep-b")]),
    Kind("tcc", single("tcc"), Worked(piece="hold")),
    Kind("signal", single("signal"), Worked(piece="signalled")),
    Kind("event", single("event"), Posted(ref="p1", amount=7)),
    Kind("sleep", single("sleep"), None),
]


def _parent(kind: Kind) -> Saga[Plan]:
    parent: Saga[Plan] = Saga(f"parent_of_{kind.name}", context=CONTEXT, data=Plan)
    parent.child("kid", saga=kind.child, data=lambda plan: plan)
    return parent


PARENTS = {kind.name: _parent(kind) for kind in KINDS}
DEFINITIONS = [grandchild, *(k.child for k in KINDS), *PARENTS.values()]
