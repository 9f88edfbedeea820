"""``saga dlq list|show|requeue|purge``: the dead-letter streams of every registered context's partitions."""

from __future__ import annotations

from typing import Annotated

import typer

from bus import LetterFilter
from redsaga.cli import _show
from redsaga.cli._common import CommandError, Json, RedisUrl, emit_json, emit_line, reporting_errors
from redsaga.cli._session import AppRef, ContextName, with_admin

dlq_app = typer.Typer(
    help="Dead letters: entries the bus gave up on (malformed, poison, over the delivery limit), "
    "with the reason, delivery count and error chain. Requeue puts them back on their stream.",
    no_args_is_help=True,
    rich_markup_mode="markdown",
)

Ids = Annotated[
    list[str] | None, typer.Argument(help="Letter ids (as dlq list shows them).", show_default=False)
]
StreamName = Annotated[
    str | None, typer.Option("--stream", help="Only letters from this stream (key, or name like inbox).")
]
ReasonText = Annotated[
    str | None, typer.Option("--reason", help="Only letters whose reason contains this text.")
]
TypeName = Annotated[str | None, typer.Option("--type", help="Only letters of this message type.")]
SagaId = Annotated[str | None, typer.Option("--saga", help="Only letters naming this saga (correlation id).")]
Tags = Annotated[
    list[str] | None,
    typer.Option(
        "--tag",
        help="Read the dead-letter stream of this hash tag instead of every registered context's partitions.",
    ),
]
Every = Annotated[bool, typer.Option("--all", help="Every letter matching the filters (none: all letters).")]


def _where(
    ids: list[str] | None, stream: str | None, reason: str | None, type_: str | None, saga: str | None
) -> LetterFilter:
    return LetterFilter(ids=tuple(ids or ()), stream=stream, reason=reason, type=type_, correlation_id=saga)


def _selection(ids: list[str] | None, every: bool, where: LetterFilter) -> LetterFilter:
    filtered = any((where.stream, where.reason, where.type, where.correlation_id))
    if not ids and not every and not filtered:
        raise CommandError("name the letters: give their ids, filters (--stream, --reason, ...) or --all")
    return where


@dlq_app.command("list")
@reporting_errors
def list_letters(
    stream: StreamName = None,
    reason: ReasonText = None,
    type_: TypeName = None,
    saga: SagaId = None,
    tag: Tags = None,
    limit: Annotated[int, typer.Option("--limit", min=1, help="Most letters to show.")] = 100,
    offset: Annotated[
        int, typer.Option("--offset", min=0, help="Skip this many matching letters (the next page).")
    ] = 0,
    app: AppRef = None,
    context: ContextName = None,
    redis_url: RedisUrl = None,
    json: Json = False,
) -> None:
    """List dead letters, oldest first: source stream, type, saga, deliveries, reason.

    Shows at most --limit letters and says when more match, with the --offset of the next
    page (on stderr with --json, whose output stays the list of letters).
    """
    where = _where(None, stream, reason, type_, saga)
    page = with_admin(
        redis_url,
        app,
        lambda admin: admin.dead_letter_page(
            where, context=context, tags=tag or [], limit=limit, offset=offset
        ),
    )
    if json:
        emit_json(page.letters)
        if page.next_offset is not None:
            emit_line(_more(page.limit, page.next_offset), err=True)
    else:
        _show.letters(page.letters)
        if page.next_offset is not None:
            emit_line()
            emit_line(_more(page.limit, page.next_offset))


def _more(limit: int, next_offset: int) -> str:
    return f"stopped at --limit {limit}: more letters match; next page: --offset {next_offset}"


@dlq_app.command("show")
@reporting_errors
def show(
    letter_id: Annotated[str, typer.Argument(help="The letter's id.")],
    tag: Tags = None,
    app: AppRef = None,
    context: ContextName = None,
    redis_url: RedisUrl = None,
    json: Json = False,
) -> None:
    """Show one letter: where it came from, why it died, its error chain and its raw entry."""
    found = with_admin(
        redis_url, app, lambda admin: admin.dead_letter(letter_id, context=context, tags=tag or [])
    )
    if json:
        emit_json(found)
    else:
        _show.letter(found)


@dlq_app.command("requeue")
@reporting_errors
def requeue(
    ids: Ids = None,
    every: Every = False,
    stream: StreamName = None,
    reason: ReasonText = None,
    type_: TypeName = None,
    saga: SagaId = None,
    tag: Tags = None,
    app: AppRef = None,
    context: ContextName = None,
    redis_url: RedisUrl = None,
    json: Json = False,
) -> None:
    """Put letters' entries back on the stream they came from (one, a filter, or --all).

    Each letter is requeued and removed in one atomic step, so running it twice changes
    nothing; a letter without a full copy of its entry is refused.
    """
    where = _selection(ids, every, _where(ids, stream, reason, type_, saga))
    results = with_admin(
        redis_url, app, lambda admin: admin.requeue_dead_letters(where, context=context, tags=tag or [])
    )
    if json:
        emit_json(results)
    else:
        _show.requeued(results)
    if any(r.outcome == "refused" for r in results):
        raise typer.Exit(1)


@dlq_app.command("purge")
@reporting_errors
def purge(
    ids: Ids = None,
    every: Every = False,
    stream: StreamName = None,
    reason: ReasonText = None,
    type_: TypeName = None,
    saga: SagaId = None,
    yes: Annotated[bool, typer.Option("--yes", help="Really delete them (required).")] = False,
    tag: Tags = None,
    app: AppRef = None,
    context: ContextName = None,
    redis_url: RedisUrl = None,
    json: Json = False,
) -> None:
    """Delete letters for good (one, a filter, or --all); needs --yes."""
    where = _selection(ids, every, _where(ids, stream, reason, type_, saga))
    if not yes:
        count = len(
            with_admin(
                redis_url,
                app,
                lambda admin: admin.dead_letters(where, context=context, tags=tag or [], limit=None),
            )
        )
        raise CommandError(f"purge would delete {count} dead letter(s) for good; add --yes to do it")
    deleted = with_admin(
        redis_url, app, lambda admin: admin.purge_dead_letters(where, context=context, tags=tag or [])
    )
    if json:
        emit_json({"purged": deleted})
    else:
        emit_line(f"purged {deleted} dead letter(s)")
