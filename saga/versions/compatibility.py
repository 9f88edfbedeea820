"""Comparing shapes: may a registered definition version take the code's new shape.

A version's shape is registered when a worker first runs it; from then on, instances of
that version may be anywhere in it. :func:`compare_shapes` lists every difference between
the registered shape (``old``) and the code's (``new``) as a :class:`Change`, breaking or
safe, by the rules in :data:`~saga.versions.rules.RULES` -- the one table ``saga versions
check``, the worker's start-up check and ``docs/versioning.md`` all use.

The reasoning behind each rule: an instance stores its step states by step name, its
position as an index into the step list, its data and step outputs as JSON, and waits for
replies of a step's reply type. A change is safe when every stored instance still reads
the same under the new shape; otherwise it needs a new version (or a migration).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import msgspec

from saga.definition.shape import Shape, StepShape
from saga.versions.rules import RULES, Finding
from saga.versions.schemas import compare_types


class Change(msgspec.Struct, kw_only=True, frozen=True):
    """One difference between a registered shape and the code's, by one rule of :data:`RULES`.

    ``line()`` is what ``saga versions check`` prints: the definition, what changed, and
    the fix (``make this version N+1`` for a breaking change).
    """

    saga: str
    version: int
    rule: str
    breaking: bool
    detail: str
    fix: str = ""

    def line(self) -> str:
        """``name@version: detail[: fix]``."""
        return f"{self.saga}@{self.version}: {self.detail}" + (f": {self.fix}" if self.fix else "")


def compare_shapes(old: Shape, new: Shape, *, next_version: int | None = None) -> list[Change]:
    """Every change from the registered ``old`` shape to the code's ``new`` one, in order.

    ``next_version`` is the version a breaking change should become (default: this one + 1).
    """
    if (old.name, old.version) != (new.name, new.version):
        raise ValueError(f"comparing {old.key} with {new.key}: shapes of one version only")
    findings: list[Finding] = []
    if old.context != new.context:
        findings.append(
            Finding("context-changed", f"context changed from {old.context!r} to {new.context!r}")
        )
    elif old.partitions != new.partitions:
        findings.append(
            Finding(
                "partitions-changed",
                f"context {new.context!r} partitions changed from {old.partitions} to {new.partitions}",
            )
        )
    findings += compare_types(old.data, new.data, "data")
    findings += _compare_steps(old.steps, new.steps, "")
    target = next_version if next_version is not None else old.version + 1
    changes = []
    for finding in findings:
        rule = RULES[finding.rule]
        fix = ""
        if rule.breaking:
            fix = (
                f"keep {old.partitions} partitions (there is no per-version fix: every saga of the "
                "context moves)"
                if rule.id == "partitions-changed"
                else f"make this version {target}"
            )
        changes.append(
            Change(
                saga=old.name,
                version=old.version,
                rule=rule.id,
                breaking=rule.breaking,
                detail=finding.detail,
                fix=fix,
            )
        )
    return changes


def breaking(changes: Iterable[Change]) -> list[Change]:
    """The breaking changes among ``changes``."""
    return [c for c in changes if c.breaking]


# -- steps ---------------------------------------------------------------------------------


def _compare_steps(old: Sequence[StepShape], new: Sequence[StepShape], where: str) -> list[Finding]:
    """Order, names and per-step details of two step lists (``where``: the enclosing branch)."""
    findings: list[Finding] = []
    old_names = [s.name for s in old]
    new_names = [s.name for s in new]
    removed = [n for n in old_names if n not in new_names]
    added = [n for n in new_names if n not in old_names]
    renamed: dict[str, str] = {}
    for name in removed:  # a removed step replaced at the same position by a new one: a rename
        index = old_names.index(name)
        if index < len(new_names) and new_names[index] in added and new_names[index] not in renamed.values():
            renamed[name] = new_names[index]
    for name in removed:
        if name in renamed:
            findings.append(Finding("step-renamed", f"step {name!r}{where} was renamed to {renamed[name]!r}"))
        else:
            findings.append(Finding("step-removed", f"step {name!r}{where} was removed"))
    common_old = [n for n in old_names if n in new_names]
    common_new = [n for n in new_names if n in old_names]
    if common_old != common_new:
        moved = next(a for a, b in zip(common_old, common_new, strict=True) if a != b)
        findings.append(
            Finding(
                "step-reordered",
                f"steps{where} were reordered: {', '.join(common_old)} became {', '.join(common_new)} "
                f"({moved!r} moved)",
            )
        )
    kept = [*common_new, *renamed.values()]
    last_kept = max((new_names.index(n) for n in kept), default=-1)
    for name in added:
        if name in renamed.values():
            continue
        if new_names.index(name) > last_kept:
            findings.append(Finding("step-appended", f"step {name!r}{where} was appended"))
        else:
            findings.append(
                Finding("step-inserted", f"step {name!r}{where} was inserted before existing steps")
            )
    by_name = {s.name: s for s in new}
    for step in old:
        if step.name in by_name:
            findings += _compare_step(step, by_name[step.name], where)
    return findings


def _compare_step(old: StepShape, new: StepShape, where: str) -> list[Finding]:
    label = f"step {old.name!r}{where}"
    findings: list[Finding] = []
    if old.kind != new.kind:
        findings.append(Finding("step-kind-changed", f"{label} changed kind from {old.kind} to {new.kind}"))
    if old.compensation is not None and new.compensation is None:
        findings.append(
            Finding("compensation-removed", f"{label} lost its compensation {old.compensation.name!r}")
        )
    elif old.compensation is None and new.compensation is not None:
        findings.append(
            Finding("compensation-added", f"{label} gained the compensation {new.compensation.name!r}")
        )
    elif (
        old.compensation is not None
        and new.compensation is not None
        and old.compensation.kind != new.compensation.kind
    ):
        findings.append(
            Finding(
                "compensation-kind-changed",
                f"the compensation of {label} changed kind from {old.compensation.kind} "
                f"to {new.compensation.kind}",
            )
        )
    if old.output is not None and new.output is not None:
        output = compare_types(old.output, new.output, f"{old.name} output")
        if old.output.name != new.output.name:
            findings.append(
                Finding(
                    "reply-type-renamed",
                    f"the reply type of {label} changed from {old.output.name} to {new.output.name}",
                )
            )
            tag = f"{old.name} output field 'type'"  # the renamed tag itself: reported just above
            output = [f for f in output if not f.detail.startswith(tag)]
        findings += output
    elif old.output is not None:
        findings.append(Finding("field-retyped", f"the output of {label} ({old.output.name}) became None"))
    findings.extend(
        Finding("wait-removed", f"{label} no longer waits for {wait!r}")
        for wait in old.waits
        if wait not in new.waits
    )
    findings.extend(
        Finding("wait-added", f"{label} now also waits for {wait!r}")
        for wait in new.waits
        if wait not in old.waits
    )
    for branch, steps in old.branches.items():
        if branch not in new.branches:
            findings.append(Finding("branch-removed", f"{label} lost its branch {branch!r}"))
        else:
            findings += _compare_steps(
                steps, new.branches[branch], f" (in branch {branch!r} of {old.name!r})"
            )
    findings.extend(
        Finding("branch-added", f"{label} gained the branch {branch!r}")
        for branch in new.branches
        if branch not in old.branches
    )
    return findings
