"""The compatibility rules as data: each rule's id, whether it breaks running instances, and why.

:mod:`saga.versions.compatibility` names every difference between two shapes by one of
these rules; ``saga versions check``, the worker's start-up check and
``docs/versioning.md`` (:func:`rules_table`) all read this one table.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final


@dataclass(frozen=True, slots=True)
class Rule:
    """One compatibility rule: an id, whether it breaks running instances, and why."""

    id: str
    why: str
    breaking: bool


RULES: Final[dict[str, Rule]] = {
    rule.id: rule
    for rule in (
        Rule("context-changed", "instances are stored under the context they started in", breaking=True),
        Rule(
            "partitions-changed",
            "a saga's partition is crc32(id) mod partitions: every stored saga would be looked up "
            "in the wrong partition",
            breaking=True,
        ),
        Rule(
            "step-removed",
            "instances that reached or completed it keep its record and position",
            breaking=True,
        ),
        Rule("step-renamed", "steps are stored, replied to and compensated by name", breaking=True),
        Rule("step-reordered", "an instance's position is an index into the step list", breaking=True),
        Rule(
            "step-inserted",
            "a step before existing ones shifts the position of every instance",
            breaking=True,
        ),
        Rule("step-kind-changed", "an attempt in flight was sent to the old kind's handler", breaking=True),
        Rule("step-appended", "instances started before it skip it; new instances run it", breaking=False),
        Rule(
            "compensation-removed", "completed steps of running instances must still be undone", breaking=True
        ),
        Rule(
            "compensation-kind-changed", "an undo attempt in flight was sent to the old kind", breaking=True
        ),
        Rule(
            "compensation-added",
            "a new failure path: instances that fail later undo this step too",
            breaking=False,
        ),
        Rule("wait-removed", "an instance may be waiting for it now", breaking=True),
        Rule("wait-added", "a new path out of the step", breaking=False),
        Rule("branch-removed", "an instance may be in that branch now", breaking=True),
        Rule("branch-added", "a new path", breaking=False),
        Rule(
            "reply-type-renamed",
            "replies in flight carry the old type name and would be refused",
            breaking=True,
        ),
        Rule(
            "field-removed",
            "stored data and outputs have it, and code written for them reads it",
            breaking=True,
        ),
        Rule(
            "field-retyped",
            "stored values of the old type no longer decode (or mean something else)",
            breaking=True,
        ),
        Rule("field-required", "stored data and outputs lack it, so they no longer decode", breaking=True),
        Rule("field-added", "an optional field with a default: stored values still decode", breaking=False),
        Rule(
            "version-dropped", "the code no longer defines a version that has sagas in flight", breaking=True
        ),
    )
}


@dataclass(frozen=True, slots=True)
class Finding:
    """One difference found, named by the rule of :data:`RULES` it falls under."""

    rule: str
    detail: str


def rules_table() -> str:
    """The rule set as a Markdown table (docs/versioning.md shows it; a test keeps them equal)."""
    lines = ["| rule | breaking | why |", "|---|---|---|"]
    lines += [f"| `{r.id}` | {'yes' if r.breaking else 'no (safe)'} | {r.why} |" for r in RULES.values()]
    return "\n".join(lines)
