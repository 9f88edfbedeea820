"""Traces: a saga's recorded run as one JSON document, and replaying it in CI.

``saga export <id>`` (or :meth:`saga.SagaAdmin.export`) writes a :class:`Trace`: the
definition name and version it ran, its input data, every event with the outputs it
carried and what was decided, and the state at export. :func:`replay_trace` runs the
history through today's code and asserts that every decision and the final state come out
the same: check production traces into ``tests/`` and a change that would decide a running
saga differently fails CI, naming the step::

    from saga.testing import replay_trace   # also importable from saga

    def test_production_traces_still_replay():
        for path in Path("tests/traces").glob("*.json"):
            replay_trace(path, app)

The format is versioned (``format``); fields are only ever added, with defaults.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Final

import msgspec

from saga.core.history_entry import HistoryEntry
from saga.core.model import SagaState
from saga.core.replay import replay_history
from saga.core.task_rules import TaskLog
from saga.definition.registry import Registry
from saga.definition.saga import Saga
from saga.errors import TraceMismatch
from saga.runtime.app import App

TRACE_FORMAT: Final = "redsaga.trace/1"


class Trace(msgspec.Struct, kw_only=True):
    """One saga's run, exported.

    Attributes:
        format: ``redsaga.trace/1``.
        saga_id: The saga's id.
        definition: The definition's name.
        version: The definition version the saga ran on.
        context: Its bounded context.
        partition: The partition it lived in.
        steps: The definition's step names when exported (its shape).
        data: The saga's input data as JSON.
        exported_at_ms: When it was exported.
        state: The saga's state when exported (status, every step with every attempt).
        history: Every event with its input or output, and what was decided for it.
        tasks: Every action on the saga's human tasks (who, what, when); replay reads
            only ``history``, so a trace exported before tasks existed reads the same.

    """

    format: str = TRACE_FORMAT
    saga_id: str
    definition: str
    version: int
    context: str
    partition: int
    steps: list[str]
    data: msgspec.Raw
    exported_at_ms: int
    state: SagaState
    history: list[HistoryEntry]
    tasks: list[TaskLog] = msgspec.field(default_factory=list)


_trace_decoder = msgspec.json.Decoder(Trace)


def encode_trace(trace: Trace) -> bytes:
    """The trace as indented JSON (stable key order, for diffs in code review)."""
    return msgspec.json.format(msgspec.json.encode(trace), indent=2) + b"\n"


TraceSource = Trace | bytes | str | os.PathLike[str]
"""What :func:`decode_trace` and :func:`replay_trace` read (see :func:`decode_trace`)."""


def decode_trace(source: TraceSource) -> Trace:
    """A trace from a file, or from its JSON document.

    ``source`` is one of:

    - a path: a :class:`pathlib.Path` (any ``os.PathLike``), or a ``str`` that is not JSON
      text -- the file ``saga export --output`` wrote;
    - the JSON document itself: ``bytes`` (what ``encode_trace`` returns), or a ``str``
      whose first non-blank character is ``{`` (a trace is always a JSON object; a file
      whose name starts with ``{`` is read when given as a ``Path``);
    - a :class:`Trace`, returned as it is.
    """
    if isinstance(source, Trace):
        return source
    if isinstance(source, os.PathLike) or (isinstance(source, str) and not source.lstrip().startswith("{")):
        source = Path(source).read_bytes()
    trace = _trace_decoder.decode(source)
    if trace.format != TRACE_FORMAT:
        raise ValueError(f"unsupported trace format {trace.format!r} (this code reads {TRACE_FORMAT})")
    return trace


def replay_trace(trace: TraceSource, definitions: Saga[Any] | Registry | App) -> SagaState:
    """Replay ``trace`` against today's definitions; return the state it rebuilds.

    ``trace`` is a path (``Path`` or ``str``), the JSON document (``bytes``, or a ``str``
    starting with ``{``) or a :class:`Trace`: see :func:`decode_trace`.

    Raises :class:`TraceMismatch` (an ``AssertionError``) naming the first decision that
    differs, or the fields of the final state that differ. ``definitions`` is the saga
    itself, or a registry or app holding the trace's ``definition@version``; give a saga of
    another version to check that it would decide old runs the same.
    """
    trace = decode_trace(trace)
    definition = _definition(trace, definitions)
    report = replay_history(definition, trace.history, saga_id=trace.saga_id, partition=trace.partition)
    if report.mismatch is not None:
        raise TraceMismatch(trace, report.mismatch, [])
    if report.state is None:
        raise TraceMismatch(trace, None, ["the trace has no history"])
    differences = state_differences(trace.state, report.state)
    if differences:
        raise TraceMismatch(trace, None, differences)
    return report.state


def state_differences(recorded: SagaState, replayed: SagaState) -> list[str]:
    """What differs between two states, field by field.

    Fields are the state's (``s:<step>`` and ``branch <key>`` for each step and branch
    record), compared as JSON values, so a pretty-printed trace compares equal.
    """
    old, new = _parts(recorded), _parts(replayed)
    differences = [
        f"{name}: recorded {_text(old.get(name))}, replayed {_text(new.get(name))}"
        for name in sorted(set(old) | set(new))
        if name not in old or name not in new or old[name] != new[name]
    ]
    if recorded.revision != replayed.revision:
        differences.append(f"revision: recorded {recorded.revision}, replayed {replayed.revision}")
    return differences


def _parts(state: SagaState) -> dict[str, Any]:
    """The state as JSON values by field, each step and branch record on its own.

    Not its id or revision: the revision is compared apart. Nor whether it is stamped: that
    is a fact of the release that started the saga, not a decision (a replay always starts
    it afresh). ``null`` and a field left out are the same (the default of every optional
    field and raw value).
    """
    plain: dict[str, Any] = _without_nulls(msgspec.json.decode(_json.encode(state)))
    parts = {name: value for name, value in plain.items() if name not in _NOT_COMPARED}
    parts |= {f"s:{name}": record for name, record in plain.get("steps", {}).items()}
    parts |= {f"branch {key}": record for key, record in plain.get("branches", {}).items()}
    return parts


def _without_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _without_nulls(item) for key, item in value.items() if item is not None}
    if isinstance(value, list):
        return [_without_nulls(item) for item in value]
    return value


_NOT_COMPARED: Final = frozenset({"id", "revision", "steps", "branches", "stamped"})
_json = msgspec.json.Encoder()


def _definition(trace: Trace, definitions: Saga[Any] | Registry | App) -> Saga[Any]:
    if isinstance(definitions, Saga):
        if definitions.name != trace.definition:
            raise ValueError(f"the trace is of {trace.definition!r}, not {definitions.name!r}")
        return definitions
    registry = definitions.registry if isinstance(definitions, App) else definitions
    return registry.get(trace.definition, trace.version)


def _text(value: object) -> str:
    if value is None:
        return "nothing"
    text = value if isinstance(value, str) else _json.encode(value).decode()
    return text if len(text) <= 300 else text[:300] + "…"
