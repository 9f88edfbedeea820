"""Human renderings of what the admin client returns (``--json`` prints the objects instead)."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import msgspec
import typer

from bus import DeadLetter, Requeued
from redsaga.cli._common import emit_line, emit_table
from redsaga.cli._format import ago, cell, clip, outcome_colour, status_colour, when
from saga.core.model import Attempt, GroupState
from saga.core.replay import ReplayReport
from saga.ops.inspect import Inspection
from saga.ops.listing import SagaPage
from saga.ops.operator_actions import ActionResult
from saga.ops.stats import SagaTally, Stats

_STATUS = {0: status_colour}
_packed = msgspec.json.Decoder(dict[str, Any])


def heading(text: str) -> None:
    """A section heading."""
    emit_line()
    emit_line(text, bold=True, underline=True)


def field(name: str, value: str, colour: str | None = None) -> None:
    """One ``name  value`` line."""
    emit_line(value, prefix=f"{name:<12}", fg=colour)


def inspection(found: Inspection, *, history: bool) -> None:
    """``saga inspect``: the summary, steps, attempts, timers, errors, letters, timeline."""
    emit_line(f"saga {found.id}", bold=True)
    field("definition", f"{found.definition}@{found.version}   context {found.context}/{found.partition}")
    field("status", f"{found.status}", status_colour(found.status))
    field("revision", str(found.revision))
    field("created", when(found.created_ms))
    field("last moved", f"{when(found.updated_ms)} ({ago(found.idle_ms)} ago)")
    field("waiting for", found.waiting_for)
    if found.last_error:
        note = found.last_error
        who = f" by {note.by}" if note.by else ""
        field("last note", f"{note.what}{' at ' + note.step if note.step else ''}{who}: {note.reason}")
    if found.cancel:
        field(
            "cancel",
            f"requested by {found.cancel.by or '?'} at {when(found.cancel.at_ms)}: {found.cancel.reason}",
        )
    if found.error_chain:
        field("error chain", found.error_chain[0], typer.colors.RED)
        for link in found.error_chain[1:]:
            field("", f"<- {link}", typer.colors.RED)
    heading("steps")
    emit_table(
        ["step", "status", "attempts", "compensation", "output"],
        [
            [
                s.name,
                s.status,
                len(s.attempts),
                s.compensation or "-",
                _group_line(s.group) if s.group else clip(bytes(s.output).decode(), 60),
            ]
            for s in found.steps
        ],
        colours={1: status_colour},
    )
    if found.branches:
        shown = found.branches if history else found.branches[:BRANCH_ROWS]
        more = len(found.branches) - len(shown)
        heading(
            "branches"
            + (f" (first {len(shown)} of {len(found.branches)}; --history for all)" if more else "")
        )
        emit_table(
            ["branch", "step", "status", "done #", "attempts", "output or error"],
            [
                [
                    b.key,
                    b.branch,
                    b.status,
                    b.completed or "-",
                    len(b.attempts),
                    clip(_last_error(b.attempts) or bytes(b.output).decode(), 60),
                ]
                for b in shown
            ],
            colours={2: status_colour},
        )
    heading("attempts")
    emit_table(
        ["attempt", "participant", "input", "outcome", "sent", "took", "worker", "output or error"],
        [
            [
                f"{s.name}/{a.kind} #{a.n}",
                a.participant,
                a.input_type,
                a.outcome or "in flight",
                when(a.dispatched_ms),
                ago(a.ended_ms - a.dispatched_ms) if a.ended_ms is not None else "-",
                a.worker or "-",
                clip(a.error or bytes(a.output).decode(), 70),
            ]
            for s in found.steps
            for a in s.attempts
        ],
        colours={3: outcome_colour},
    )
    if history:
        heading("attempt inputs")
        for s in found.steps:
            for a in s.attempts:
                emit_line(f"{s.name}/{a.kind} #{a.n}  {bytes(a.input).decode()}")
    if found.timers:
        heading("pending timers")
        emit_table(
            ["timer", "purpose", "step", "due", "when"],
            [
                [t.timer_id, t.purpose, f"{t.step}/{t.kind} #{t.attempt}", when(t.due_ms), _due(t.due_in_ms)]
                for t in found.timers
            ],
        )
    if found.dead_letters:
        heading("dead letters naming this saga")
        letters(found.dead_letters)
    rows = found.timeline if history else found.timeline[-10:]
    heading(
        "history" if history else f"history (last {len(rows)} of {len(found.timeline)}; --history for all)"
    )
    emit_table(
        ["#", "at", "event", "then", "status", "rev"],
        [
            [
                r.index if r.source == "history" else "task",
                when(r.at_ms),
                clip(r.summary, 70) + (f"  [ignored: {clip(r.ignored, 60)}]" if r.ignored else ""),
                clip("; ".join(r.effects), 60) or "-",
                r.status,
                r.revision,
            ]
            for r in rows
        ],
        colours={4: status_colour},
    )


BRANCH_ROWS = 40
"""Branches ``saga inspect`` lists without ``--history`` (``--json`` has them all)."""


def _group_line(group: GroupState) -> str:
    line = f"{group.succeeded}/{group.total} branches succeeded"
    if group.failed:
        line += f", {group.failed} failed"
    if group.running:
        line += f", {len(group.running)} in flight"
    if group.closed:
        line += f" ({group.closed})"
    return line


def _last_error(attempts: Sequence[Attempt]) -> str:
    return next((a.error for a in reversed(attempts) if a.error), "") or ""


def _due(due_in_ms: int | None) -> str:
    if due_in_ms is None:
        return "-"
    return f"in {ago(due_in_ms)}" if due_in_ms >= 0 else f"overdue by {ago(-due_in_ms)}"


def page(found: SagaPage) -> None:
    """``saga list``: one line per saga, and where the next page starts."""
    emit_table(
        ["id", "definition", "status", "since", "idle", "rev"],
        [
            [r.id, f"{r.definition}@{r.version}", r.status, when(r.since_ms), ago(r.idle_ms), r.revision]
            for r in found.rows
        ],
        colours={2: status_colour},
    )
    shown = f"{found.offset + 1}-{found.offset + len(found.rows)}" if found.rows else "none"
    more = f"; next page: --offset {found.next_offset}" if found.next_offset is not None else ""
    emit_line()
    emit_line(f"{shown} of {found.total}{more}{_waiting(found.waiting)}")


def tally(found: SagaTally) -> None:
    """``saga list --count``: sagas per definition, version and status, and the total."""
    emit_table(
        ["definition", "status", "sagas"],
        [[f"{c.definition}@{c.version}", c.status, c.count] for c in found.counts],
        colours={1: status_colour},
    )
    stuck = f" not moved for {ago(found.stuck_for_ms)}" if found.stuck_for_ms is not None else ""
    emit_line()
    emit_line(f"total {found.total}{stuck}{_waiting(found.waiting)}")


def _waiting(waiting: int | None) -> str:
    return f" ({waiting} more waiting within their wait's deadline)" if waiting else ""


def action(result: ActionResult) -> None:
    """The outcome of cancel, retry, force-complete or redrive."""
    if result.outcome == "applied":
        emit_line(f"{result.action} of {result.saga_id} applied", fg=typer.colors.GREEN, bold=True)
    elif result.outcome == "dry-run":
        emit_line(f"dry run: {result.action} of {result.saga_id} would apply; nothing was sent", bold=True)
    else:
        emit_line(
            f"{result.action} of {result.saga_id} sent as {result.request_id} but not decided yet: "
            "is a worker running for this context? It applies when decided, unless the saga moves first.",
            fg=typer.colors.YELLOW,
            bold=True,
        )
    verb = "now" if result.outcome == "applied" else "then"
    field("status", f"{verb} {result.status} (revision {result.revision})", status_colour(result.status))
    field("by", f"{result.by}: {result.reason}" if result.reason else result.by)
    for line in result.dispatched or ["nothing"]:
        field("sends", line)


def replay(report: ReplayReport) -> None:
    """``saga replay``: every decision matched, or the first that differs."""
    if report.mismatch is None:
        emit_line(
            f"replayed {report.matched} of {report.entries} history entries of {report.saga_id} "
            f"through {report.definition}: every decision matches",
            fg=typer.colors.GREEN,
        )
        return
    m = report.mismatch
    emit_line(
        f"replay of {report.saga_id} through {report.definition} differs at history entry {m.index} "
        f"({m.event}{', step ' + m.step if m.step else ''}): {m.what}",
        fg=typer.colors.RED,
        bold=True,
    )
    field("recorded", m.recorded)
    field("replayed", m.replayed)
    emit_line(f"{report.matched} earlier decision(s) matched")


def stats(found: Stats) -> None:
    """``saga stats``."""
    stuck = f"stuck (no move for {ago(found.stuck_for_ms)}) {found.stuck}   waiting {found.waiting}"
    emit_line(f"in flight {found.in_flight}   {stuck}   at {when(found.checked_at_ms)}", bold=True)
    heading("sagas")
    emit_table(
        ["definition", "status", "sagas"],
        [[f"{c.definition}@{c.version}", c.status, c.count] for c in found.sagas],
        colours={1: status_colour},
    )
    heading("streams")
    rows: list[list[object]] = []
    for stream in found.streams:
        rows += [
            [
                stream.stream,
                stream.length,
                g.group,
                f"{g.consumers} (+{g.idle_consumers} idle)" if g.idle_consumers else g.consumers,
                g.pending,
                "-" if g.lag is None else g.lag,
                ago(g.oldest_pending_age_ms),
            ]
            for g in stream.groups
        ] or [[stream.stream, stream.length, "-", "-", "-", "-", "-"]]
    emit_table(["stream", "length", "group", "live consumers", "pending", "lag", "oldest pending"], rows)
    heading("dead letters")
    emit_table(["dead-letter stream", "letters"], sorted(found.dead_letters.items()))
    if found.nodes:
        heading("cluster masters")
        emit_table(
            ["master", "partitions", "streams", "keys", "memory MiB"],
            [
                [n.node, n.partitions, n.streams, n.keys, f"{n.used_memory_bytes / 2**20:.1f}"]
                for n in found.nodes
            ],
        )
    if found.outbox:
        heading("outbox")
        emit_table(
            ["database", "backlog", "oldest unsent", "failed", "error"],
            [
                [
                    o.dsn,
                    "-" if o.backlog is None else o.backlog,
                    ago(o.oldest_unsent_age_ms),
                    o.failed or 0,
                    o.error or "-",
                ]
                for o in found.outbox
            ],
        )


def letters(found: Sequence[DeadLetter]) -> None:
    """``saga dlq list``."""
    emit_table(
        ["letter", "stream", "type", "saga", "deliveries", "died", "reason"],
        [
            [
                x.id,
                x.stream,
                x.type or "-",
                x.correlation_id or "-",
                "-" if x.deliveries is None else x.deliveries,
                when(x.last_failed_ms),
                clip(x.reason, 160),
            ]
            for x in found
        ],
    )


def letter(found: DeadLetter) -> None:
    """``saga dlq show``: every field, the error chain and the raw entry."""
    emit_line(f"dead letter {found.id} in {found.dlq}", bold=True)
    field("stream", f"{found.stream} entry {found.entry}")
    field("group", f"{found.group} (consumer {found.consumer}, {cell(found.deliveries)} deliveries)")
    field("reason", found.reason, typer.colors.RED)
    field("failed", f"first {when(found.first_failed_ms)}, last {when(found.last_failed_ms)}")
    field("message", f"{found.type or '-'} {found.message_id or ''}".rstrip())
    field("saga", found.correlation_id or "-")
    field("key", found.idempotency_key or "-")
    for name, value in found.headers.items():
        field(f"header.{name}"[:11], value)
    heading("errors (oldest first)")
    for error in found.errors or ["none recorded"]:
        emit_line(f"  {error}")
    heading("raw entry" + (" (cut to the size cap)" if found.raw_truncated else ""))
    if found.raw_missing:
        emit_line("  the entry was gone when it died")
    for name, value in found.raw.items():
        _raw_field(name, value)
    verdict = "can be requeued" if found.requeueable else "cannot be requeued (no full copy)"
    emit_line()
    emit_line(verdict)


def _raw_field(name: str, value: str) -> None:
    """One raw field of a dead entry: the packed envelope item by item (empty ones left out)."""
    items = None
    if name == "e":
        with contextlib.suppress(msgspec.DecodeError):  # not a packed envelope: shown as it is
            items = _packed.decode(value)
    if items is None:
        emit_line(f"  {name}: {value}")
        return
    for item, shown in items.items():
        if shown not in ("", {}):
            text = shown if isinstance(shown, str | int) else msgspec.json.encode(shown).decode()
            emit_line(f"  e.{item}: {text}")


def requeued(results: Sequence[Requeued]) -> None:
    """``saga dlq requeue``."""
    emit_table(
        ["letter", "stream", "outcome", "new entry or why"],
        [[r.letter, r.stream, r.outcome, r.new_entry or r.why or "-"] for r in results],
    )
