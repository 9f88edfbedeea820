"""Comparing two versions of a message type by their JSON schemas: do stored values still decode.

A step's data, output and reply types are compared by the schemas msgspec writes for them
(:class:`~saga.definition.shape.TypeShape`); every difference is named by a rule of
:mod:`saga.versions.rules`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final

from saga.definition.shape import TypeShape
from saga.versions.rules import RULES, Finding

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


def compare_types(old: TypeShape, new: TypeShape, label: str) -> list[Finding]:
    """Every difference from type ``old`` to type ``new`` (``label`` names where it is used)."""
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

    def compare(self, old: dict[str, Any], new: dict[str, Any], path: str) -> list[Finding]:
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
    ) -> list[Finding]:
        findings: list[Finding] = []
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
                    Finding(
                        "field-retyped", f"{self.at(path)} retyped: {_describe(alt)} is no longer accepted"
                    )
                )
        return findings

    def at(self, path: str) -> str:
        """How a finding names where it is: ``data``, or ``data field 'lines[].sku'``."""
        return f"{self.label} field {path!r}" if path else self.label

    def _quietly(self, old: dict[str, Any], new: dict[str, Any], path: str) -> list[Finding]:
        seen = set(self.seen)
        try:
            return self.compare(old, new, path)
        finally:
            self.seen = seen

    def _compare_one(self, old: dict[str, Any], new: dict[str, Any], path: str) -> list[Finding]:
        old_types, new_types = _types(old), _types(new)
        if old_types and new_types and not old_types <= new_types | _widen_number(new_types):
            return [
                Finding("field-retyped", f"{self.at(path)} retyped ({_describe(old)} -> {_describe(new)})")
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
                Finding(
                    "field-retyped",
                    f"{self.at(path)} retyped (a tuple of {len(old_prefix)} -> {len(new_prefix)})",
                )
            )
        for index, (a, b) in enumerate(zip(old_prefix, new_prefix, strict=False)):
            findings += self.compare(a, b, f"{path}[{index}]")
        return findings

    def _values(self, old: dict[str, Any], new: dict[str, Any], path: str) -> list[Finding]:
        findings: list[Finding] = []
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
                    Finding(
                        "field-retyped", f"{self.at(path)} no longer accepts {', '.join(map(repr, lost))}"
                    )
                )
        findings.extend(
            Finding("field-retyped", f"{self.at(path)} constraint {keyword} is now {new[keyword]!r}")
            for keyword in _CONSTRAINTS
            if keyword in new and old.get(keyword) != new[keyword]
        )
        return findings

    def _objects(self, old: dict[str, Any], new: dict[str, Any], path: str) -> list[Finding]:
        findings: list[Finding] = []
        old_props: dict[str, Any] = old.get("properties", {})
        new_props: dict[str, Any] = new.get("properties", {})
        old_required, new_required = set(old.get("required", ())), set(new.get("required", ()))
        for name, schema in old_props.items():
            child = f"{path}.{name}" if path else name
            if name not in new_props:
                findings.append(Finding("field-removed", f"{self.at(child)} was removed"))
            else:
                findings += self.compare(schema, new_props[name], child)
        for name in new_props:
            child = f"{path}.{name}" if path else name
            if name in old_props:
                if name in new_required and name not in old_required:
                    findings.append(Finding("field-required", f"{self.at(child)} is now required"))
            elif name in new_required:
                findings.append(Finding("field-required", f"{self.at(child)} was added without a default"))
            else:
                findings.append(Finding("field-added", f"{self.at(child)} was added with a default"))
        return findings


def _breaking_findings(findings: Iterable[Finding]) -> list[Finding]:
    """The findings that break running instances (by :data:`RULES`)."""
    return [f for f in findings if RULES[f.rule].breaking]


def _fewest(candidates: list[list[Finding]]) -> list[Finding]:
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
