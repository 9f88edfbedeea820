"""A definition's shape: the part of a saga definition that running instances depend on.

A shape is plain data derived from a :class:`~saga.Saga`: its name, version and context,
the JSON schema of its data type, and its steps in order -- each with its kind, its
compensation, its output type (wire name and JSON schema), what it waits for and its
branches. Workers store shapes in Redis when they start (``saga/versions/registry.py``), and
:func:`~saga.versions.compatibility.compare_shapes` compares a registered shape with the
code's by an explicit rule set (``saga/versions/rules.py``).

What is left out on purpose: retry policies, timeouts and the code of builders and
actions. Changing them is always safe for running instances (they are read when the next
attempt is made), so they do not belong in a compatibility check.

New step kinds slot in without touching the rules: a step object that has a ``shape()``
method returns its own :class:`StepShape`; otherwise ``kind``, ``waits`` and ``branches``
attributes are read when present (a kind name, the names of the signals, events or timers
the step can be resumed by, and named lists of steps). The rules compare kinds, waits and
branches generically, branches recursively with the same step rules.
"""

from __future__ import annotations

import hashlib
from typing import Any, Final

import msgspec

from redsaga.ids import message_type
from saga.definition.saga import Compensation, Saga
from saga.definition.waits import EventWait, SignalWait, Sleep

SHAPE_FORMAT: Final = 1
"""The format of stored shapes; a reader refuses a shape of a newer format."""

_DROPPED_KEYWORDS: Final = frozenset({"description", "examples", "$comment"})


class TypeShape(msgspec.Struct, kw_only=True, frozen=True):
    """A type as instances depend on it: its wire name and its JSON schema."""

    name: str
    schema: dict[str, Any]

    def check(self, value: Any) -> Any:
        """``value`` (decoded JSON) checked against the schema, without the type's code.

        Returns it with a tagged struct's tag filled in when left out, as msgspec's own
        decoding allows; ``ValueError`` says what is wrong and where.
        """
        import jsonschema  # noqa: PLC0415 - only operators without the code validate this way

        root = self.schema
        target = root.get("$defs", {}).get(root.get("$ref", "").rpartition("/")[2], root)
        if isinstance(value, dict):
            tags = {
                name: prop["enum"][0]
                for name, prop in target.get("properties", {}).items()
                if name in target.get("required", ()) and len(prop.get("enum", ())) == 1 and name not in value
            }
            value = {**tags, **value}
        error = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(root).iter_errors(value))
        if error is not None:
            where = "".join(f"[{p!r}]" for p in error.absolute_path) or "the top level"
            raise ValueError(f"{error.message} (at {where})")
        return value


class CompensationShape(msgspec.Struct, kw_only=True, frozen=True):
    """A step's compensation: its name and kind (``command`` or ``action``)."""

    name: str
    kind: str


class StepShape(msgspec.Struct, kw_only=True, frozen=True, omit_defaults=True):
    """One step: name, kind, compensation, output type, waits and branches.

    ``kind`` is ``command`` (a participant's command) or ``action`` (a local action); step
    kinds added later name themselves. ``waits`` lists what the step can be resumed by
    (each one a path the instance may be on); ``branches`` holds named sub-sequences of
    steps (parallel groups, decision branches).
    """

    name: str
    kind: str
    compensation: CompensationShape | None = None
    output: TypeShape | None = None
    waits: tuple[str, ...] = ()
    branches: dict[str, tuple[StepShape, ...]] = msgspec.field(default_factory=dict)


class Shape(msgspec.Struct, kw_only=True, frozen=True):
    """The shape of one definition version (see the module docstring)."""

    name: str
    version: int
    context: str
    partitions: int
    data: TypeShape
    steps: tuple[StepShape, ...]
    format: int = SHAPE_FORMAT

    @property
    def key(self) -> str:
        """``name@version``."""
        return f"{self.name}@{self.version}"

    @property
    def fingerprint(self) -> str:
        """A short digest of the shape (equal shapes, equal fingerprints)."""
        return hashlib.sha256(encode_shape(self)).hexdigest()[:16]

    def step_named(self, name: str) -> StepShape:
        """The step ``name``, or the step branch ``<group>#<index>`` runs (``KeyError`` if none).

        The same lookup as :meth:`saga.Saga.step_named`, on the shape: a map's branches all
        run its one branch step; a fixed group's branch ``i`` is the one keyed ``i:<name>``.
        """
        group, sep, index = name.rpartition("#")
        if sep:
            branches = self.step_named(group).branches
            found = branches.get("each") or next(
                (steps for key, steps in branches.items() if key.partition(":")[0] == index), ()
            )
            if not found or not index.isdigit():
                raise KeyError(f"saga {self.key} has no branch {name!r}")
            return found[0]
        for step in self.steps:
            if step.name == name:
                return step
        for step in self.steps:
            for steps in step.branches.values():
                for branch in steps:
                    if branch.name == name:
                        return branch
        raise KeyError(f"saga {self.key} has no step {name!r}")


def shape_of(definition: Saga[Any]) -> Shape:
    """The shape of ``definition``."""
    return Shape(
        name=definition.name,
        version=definition.version,
        context=definition.context.name,
        partitions=definition.context.partitions,
        data=type_shape(definition.data_type),
        steps=tuple(step_shape(step) for step in definition.steps),
    )


def step_shape(step: Any) -> StepShape:
    """The shape of one step (see the module docstring for how new kinds provide theirs)."""
    custom = getattr(step, "shape", None)
    if callable(custom):
        shaped = custom()
        if not isinstance(shaped, StepShape):
            raise TypeError(f"{step!r}.shape() returned {type(shaped).__name__}, not a StepShape")
        return shaped
    kind = getattr(step, "kind", None) or ("action" if step.local else "command")
    compensation: Compensation | None = step.compensation
    return StepShape(
        name=step.name,
        kind=str(kind),
        compensation=(
            CompensationShape(name=compensation.name, kind="action" if compensation.local else "command")
            if compensation is not None
            else None
        ),
        output=type_shape(step.output_type) if step.output_type is not None else None,
        waits=_waits(step),
        branches={
            str(name): tuple(step_shape(s) for s in steps)
            for name, steps in dict(getattr(step, "branches", {})).items()
        },
    )


def _waits(step: Any) -> tuple[str, ...]:
    """What a waiting step waits for, as stable text (a sleep's duration may change freely).

    A child step waits for its child saga's end; a TCC step for its confirmation (or its
    reservation's expiry, whose length may change freely).
    """
    child = getattr(step, "child", None)
    if child is not None:
        return (f"child {child.definition.key}",)
    tcc = getattr(step, "tcc", None)
    if tcc is not None:
        return (f"confirm {tcc.confirm}", "expiry")
    wait = getattr(step, "wait", None)
    if isinstance(wait, EventWait):
        return (f"event {wait.message_type} on {wait.stream.key}",)
    if isinstance(wait, SignalWait):
        return ("signal",)
    if isinstance(wait, Sleep):
        return ("sleep",)
    return ()


def type_shape(type_: Any) -> TypeShape:
    """A type's wire name (its msgspec tag, else its name) and its JSON schema, docs removed."""
    name = message_type(type_) if isinstance(type_, type) else repr(type_)
    return TypeShape(name=name, schema=_strip(msgspec.json.schema(type_)))


def _strip(schema: Any) -> Any:
    """Drop documentation keywords: editing a docstring does not change a shape."""
    if isinstance(schema, dict):
        return {k: _strip(v) for k, v in schema.items() if k not in _DROPPED_KEYWORDS}
    if isinstance(schema, list):
        return [_strip(v) for v in schema]
    return schema


def encode_shape(shape: Shape) -> bytes:
    """Canonical JSON of a shape (keys sorted), as stored and fingerprinted."""
    return msgspec.json.encode(shape, order="sorted")


_decoder = msgspec.json.Decoder(Shape)


def decode_shape(raw: bytes | str) -> Shape:
    """Decode a stored shape (``ValueError`` for a shape of a newer format than this code)."""
    shape = _decoder.decode(raw)
    if shape.format > SHAPE_FORMAT:
        raise ValueError(f"shape of {shape.key} has format {shape.format}; this redsaga reads {SHAPE_FORMAT}")
    return shape
