"""The compatibility rules: may a registered definition version take the code's new shape.

A version's shape is registered when a worker first runs it; from then on, instances of
that version may be anywhere in it. :func:`compare_shapes` lists every difference between
the registered shape (``old``) and the code's (``new``) as a :class:`Change`, breaking or
safe, by the rules in :data:`RULES` -- the one table ``saga versions check``, the worker's
start-up check and ``docs/versioning.md`` all use.

The reasoning behind each rule: an instance stores its step states by step name, its
position as an index into the step list, its data and step outputs as JSON, and waits for
replies of a step's reply type. A change is safe when every stored instance still reads
the same under the new shape; otherwise it needs a new version (or a migration).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final

import msgspec

from saga.definition.shape import Shape, StepShape, TypeShape


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


@dataclass(frozen=True, slots=True)
class _Finding:
    rule: str
    detail: str


def compare_shapes(old: Shape, new: Shape, *, next_version: int | None = None) -> list[Change]:
    """Every change from the registered ``old`` shape to the code's ``new`` one, in order.

    ``next_version`` is the version a breaking change should become (default: this one + 1).
    """
    if (old.name, old.version) != (new.name, new.version):
        raise ValueError(f"comparing {old.key} with {new.key}: shapes of one version only")
    findings: list[_Finding] = []
    if old.context != new.context:
        findings.append(
            _Finding("context-changed", f"context changed from {old.context!r} to {new.context!r}")
        )
    elif old.partitions != new.partitions:
        findings.append(
            _Finding(
                "partitions-changed",
                f"context {new.context!r} partitions changed from {old.partitions} to {new.partitions}",
            )
        )
    findings += _compare_types(old.data, new.data, "data")
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


def _compare_steps(old: Sequence[StepShape], new: Sequence[StepShape], where: str) -> list[_Finding]:
    """Order, names and per-step details of two step lists (``where``: the enclosing branch)."""
    findings: list[_Finding] = []
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
            findings.append(
                _Finding("step-renamed", f"step {name!r}{where} was renamed to {renamed[name]!r}")
            )
        else:
            findings.append(_Finding("step-removed", f"step {name!r}{where} was removed"))
    common_old = [n for n in old_names if n in new_names]
    common_new = [n for n in new_names if n in old_names]
    if common_old != common_new:
        moved = next(a for a, b in zip(common_old, common_new, strict=True) if a != b)
        findings.append(
            _Finding(
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
            findings.append(_Finding("step-appended", f"step {name!r}{where} was appended"))
        else:
            findings.append(
                _Finding("step-inserted", f"step {name!r}{where} was inserted before existing steps")
            )
    by_name = {s.name: s for s in new}
    for step in old:
        if step.name in by_name:
            findings += _compare_step(step, by_name[step.name], where)
    return findings


def _compare_step(old: StepShape, new: StepShape, where: str) -> list[_Finding]:
    label = f"step {old.name!r}{where}"
    findings: list[_Finding] = []
    if old.kind != new.kind:
        findings.append(_Finding("step-kind-changed", f"{label} changed kind from {old.kind} to {new.kind}"))
    if old.compensation is not None and new.compensation is None:
        findings.append(
            _Finding("compensation-removed", f"{label} lost its compensation {old.compensation.name!r}")
        )
    elif old.compensation is None and new.compensation is not None:
        findings.append(
            _Finding("compensation-added", f"{label} gained the compensation {new.compensation.name!r}")
        )
    elif (
        old.compensation is not None
        and new.compensation is not None
        and old.compensation.kind != new.compensation.kind
    ):
        findings.append(
            _Finding(
                "compensation-kind-changed",
                f"the compensation of {label} changed kind from {old.compensation.kind} "
                f"to {new.compensation.kind}",
            )
        )
    if old.output is not None and new.output is not None:
        output = _compare_types(old.output, new.output, f"{old.name} output")
        if old.output.name != new.output.name:
            findings.append(
                _Finding(
                    "reply-type-renamed",
                    f"the reply type of {label} changed from {old.output.name} to {new.output.name}",
                )
            )
            tag = f"{old.name} output field 'type'"  # the renamed tag itself: reported just above
            output = [f for f in output if not f.detail.startswith(tag)]
        findings += output
    elif old.output is not None:
        findings.append(_Finding("field-retyped", f"the output of {label} ({old.output.name}) became None"))
    findings.extend(
        _Finding("wait-removed", f"{label} no longer waits for {wait!r}")
        for wait in old.waits
        if wait not in new.waits
    )
    findings.extend(
        _Finding("wait-added", f"{label} now also waits for {wait!r}")
        for wait in new.waits
        if wait not in old.waits
    )
    for branch, steps in old.branches.items():
        if branch not in new.branches:
            findings.append(_Finding("branch-removed", f"{label} lost its branch {branch!r}"))
        else:
            findings += _compare_steps(
                steps, new.branches[branch], f" (in branch {branch!r} of {old.name!r})"
            )
    findings.extend(
        _Finding("branch-added", f"{label} gained the branch {branch!r}")
        for branch in new.branches
        if branch not in old.branches
    )
    return findings


# -- schemas -------------------------------------------------------------------------------

_CONSTRAINTS: Final = (
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "multipleOf",
    "minLength",
    "maxLength",
    "pattern",
    "format",
    "minItems",
    "maxItems",
    "uniqueItems",
    "minProperties",
    "maxProperties",
)


def _compare_types(old: TypeShape, new: TypeShape, label: str) -> list[_Finding]:
    return _Schemas(old.schema, new.schema, label).compare(old.schema, new.schema, "")


class _Schemas:
    """Compares two JSON schemas (as msgspec writes them) in the direction old -> new.

    The question asked everywhere: does every value valid under ``old`` still decode under
    ``new`` and mean the same field? ``$ref``s are resolved against each side's ``$defs``;
    recursive types are compared once per pair of definitions.
    """

    def __init__(self, old_root: dict[str, Any], new_root: dict[str, Any], label: str) -> None:
        self.label = label
        self.old_defs: dict[str, Any] = old_root.get("$defs", {})
        self.new_defs: dict[str, Any] = new_root.get("$defs", {})
        self.seen: set[tuple[str, str]] = set()

    def compare(self, old: dict[str, Any], new: dict[str, Any], path: str) -> list[_Finding]:
        old_ref, old = _resolve(old, self.old_defs)
        new_ref, new = _resolve(new, self.new_defs)
        if old_ref and new_ref:
            if (old_ref, new_ref) in self.seen:
                return []
            self.seen.add((old_ref, new_ref))
        old_alts, new_alts = _alternatives(old), _alternatives(new)
        if len(old_alts) > 1 or len(new_alts) > 1:
            return self._compare_unions(old_alts, new_alts, path)
        return self._compare_one(old, new, path)

    def _compare_unions(
        self, old_alts: list[dict[str, Any]], new_alts: list[dict[str, Any]], path: str
    ) -> list[_Finding]:
        findings: list[_Finding] = []
        for alt in old_alts:
            attempts = [self._quietly(alt, candidate, path) for candidate in new_alts]
            accepted = [a for a in attempts if not _breaking_findings(a)]
            if accepted:
                findings += _fewest(accepted)
                continue
            same_type = [a for a, c in zip(attempts, new_alts, strict=True) if _types(c) & _types(alt)]
            if same_type:
                findings += _fewest(same_type)
            else:
                findings.append(
                    _Finding(
                        "field-retyped", f"{self.at(path)} retyped: {_describe(alt)} is no longer accepted"
                    )
                )
        return findings

    def at(self, path: str) -> str:
        """How a finding names where it is: ``data``, or ``data field 'lines[].sku'``."""
        return f"{self.label} field {path!r}" if path else self.label

    def _quietly(self, old: dict[str, Any], new: dict[str, Any], path: str) -> list[_Finding]:
        seen = set(self.seen)
        try:
            return self.compare(old, new, path)
        finally:
            self.seen = seen

    def _compare_one(self, old: dict[str, Any], new: dict[str, Any], path: str) -> list[_Finding]:
        old_types, new_types = _types(old), _types(new)
        if old_types and new_types and not old_types <= new_types | _widen_number(new_types):
            return [
                _Finding("field-retyped", f"{self.at(path)} retyped ({_describe(old)} -> {_describe(new)})")
            ]
        findings = self._values(old, new, path)
        if "properties" in old or "properties" in new:
            findings += self._objects(old, new, path)
        if isinstance(old.get("additionalProperties"), dict) and isinstance(
            new.get("additionalProperties"), dict
        ):
            findings += self.compare(old["additionalProperties"], new["additionalProperties"], f"{path}[*]")
        if isinstance(old.get("items"), dict) and isinstance(new.get("items"), dict):
            findings += self.compare(old["items"], new["items"], f"{path}[]")
        old_prefix, new_prefix = old.get("prefixItems", []), new.get("prefixItems", [])
        if len(old_prefix) != len(new_prefix):
            findings.append(
                _Finding(
                    "field-retyped",
                    f"{self.at(path)} retyped (a tuple of {len(old_prefix)} -> {len(new_prefix)})",
                )
            )
        for index, (a, b) in enumerate(zip(old_prefix, new_prefix, strict=False)):
            findings += self.compare(a, b, f"{path}[{index}]")
        return findings

    def _values(self, old: dict[str, Any], new: dict[str, Any], path: str) -> list[_Finding]:
        findings: list[_Finding] = []
        new_values = _allowed_values(new)
        if new_values is not None:
            old_values = _allowed_values(old)
            lost = (
                [v for v in old_values if v not in new_values]
                if old_values is not None
                else ["any other value"]
            )
            if lost:
                findings.append(
                    _Finding(
                        "field-retyped", f"{self.at(path)} no longer accepts {', '.join(map(repr, lost))}"
                    )
                )
        findings.extend(
            _Finding("field-retyped", f"{self.at(path)} constraint {keyword} is now {new[keyword]!r}")
            for keyword in _CONSTRAINTS
            if keyword in new and old.get(keyword) != new[keyword]
        )
        return findings

    def _objects(self, old: dict[str, Any], new: dict[str, Any], path: str) -> list[_Finding]:
        findings: list[_Finding] = []
        old_props: dict[str, Any] = old.get("properties", {})
        new_props: dict[str, Any] = new.get("properties", {})
        old_required, new_required = set(old.get("required", ())), set(new.get("required", ()))
        for name, schema in old_props.items():
            child = f"{path}.{name}" if path else name
            if name not in new_props:
                findings.append(_Finding("field-removed", f"{self.at(child)} was removed"))
            else:
                findings += self.compare(schema, new_props[name], child)
        for name in new_props:
            child = f"{path}.{name}" if path else name
            if name in old_props:
                if name in new_required and name not in old_required:
                    findings.append(_Finding("field-required", f"{self.at(child)} is now required"))
            elif name in new_required:
                findings.append(_Finding("field-required", f"{self.at(child)} was added without a default"))
            else:
                findings.append(_Finding("field-added", f"{self.at(child)} was added with a default"))
        return findings


def _breaking_findings(findings: Iterable[_Finding]) -> list[_Finding]:
    """The findings that break running instances (by :data:`RULES`)."""
    return [f for f in findings if RULES[f.rule].breaking]


def _fewest(candidates: list[list[_Finding]]) -> list[_Finding]:
    return sorted(candidates, key=len)[0]


def _resolve(schema: dict[str, Any], defs: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    name = ""
    for _ in range(64):
        ref = schema.get("$ref")
        if not isinstance(ref, str) or not ref.startswith("#/$defs/"):
            break
        name = ref.removeprefix("#/$defs/")
        schema = defs.get(name, {})
    return name, schema


def _alternatives(schema: dict[str, Any]) -> list[dict[str, Any]]:
    for keyword in ("anyOf", "oneOf"):
        if isinstance(schema.get(keyword), list):
            return list(schema[keyword])
    return [schema]


_JSON_TYPES: Final = {bool: "boolean", int: "integer", float: "number", str: "string", type(None): "null"}


def _types(schema: dict[str, Any]) -> set[str]:
    declared = schema.get("type")
    if isinstance(declared, str):
        return {declared}
    if isinstance(declared, list):
        return set(declared)
    values = _allowed_values(schema)
    if values is not None:
        return {_JSON_TYPES.get(type(v), "object") for v in values}
    if "properties" in schema:
        return {"object"}
    return set()


def _widen_number(types: set[str]) -> set[str]:
    """An ``integer`` still decodes where a ``number`` is expected."""
    return {"integer"} if "number" in types else set()


def _allowed_values(schema: dict[str, Any]) -> list[Any] | None:
    if "const" in schema:
        return [schema["const"]]
    if isinstance(schema.get("enum"), list):
        return list(schema["enum"])
    return None


def _describe(schema: dict[str, Any]) -> str:
    types = sorted(_types(schema))
    return "|".join(types) if types else "any"


def rules_table() -> str:
    """The rule set as a Markdown table (docs/versioning.md shows it; a test keeps them equal)."""
    lines = ["| rule | breaking | why |", "|---|---|---|"]
    lines += [f"| `{r.id}` | {'yes' if r.breaking else 'no (safe)'} | {r.why} |" for r in RULES.values()]
    return "\n".join(lines)
