"""``saga limits``: list the rate limits with their buckets and changes; change one at run time.

Thin shells over :mod:`saga.store.rates`; see docs/flow-control.md. A change is an operator
write: it runs as a context's orchestrator user (``saga acl``), and the read-only operator
may list but not change a limit.

``saga limits list --json`` prints a list of objects::

    {"name": "payments", "rate": 50.0, "burst": 10, "tokens": 9.5, "declared": true,
     "set_by_operator": true,
     "changes": [{"id": "...", "at": 1764806400000, "by": "ops (alice)",
                  "old": {"rate": 100.0, "burst": 20}, "new": {"rate": 50.0, "burst": 10}}]}

``rate`` is in commands per second; ``tokens`` below zero count the commands promised a
token and waiting for it; ``changes`` are the newest first (at most 100). ``saga limits set
--json`` prints the one change it made, in the same shape as an item of ``changes``.

``saga limits lines <context> --json`` prints the concurrency keys' lines, most recently asked
first::

    {"key": "withdraw", "value": "acct-42", "holders": ["w-0193..."], "waiting": 3,
     "used_ms": 1764806400000}
"""

from __future__ import annotations

import os
from datetime import UTC, datetime
from typing import Annotated

import typer

import bus
from redsaga.cli._common import (
    Json,
    RedisUrl,
    UsageProblem,
    app_option,
    emit_json,
    emit_line,
    emit_table,
    reporting_errors,
    with_redis,
)
from redsaga.cli._load import load_app
from saga.definition.rate import RateLimit, check_burst, check_limit_name, parse_rate
from saga.store.rates import LimitChange, read_limits, set_limit
from saga.store.slots import read_lines

limits_app = typer.Typer(
    help="Rate limits: list them with their buckets and who changed them; change one at run time. "
    "Concurrency keys: their lines.",
    no_args_is_help=True,
)

AppRef = Annotated[
    str | None,
    app_option("The App that declares the limits (their defaults, and the declared ones not yet used)."),
]


def _declared(app_ref: str | None) -> list[RateLimit]:
    return [] if app_ref is None else list(load_app(app_ref).limits)


def _describe(rate: float | None, burst: float | None) -> str:
    return "unset" if rate is None else f"{rate:g}/s burst {burst if burst is None else int(burst)}"


def _when(at_ms: int) -> str:
    return datetime.fromtimestamp(at_ms / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def set_command(
    name: Annotated[str, typer.Argument(help="The limit: a participant, or SAGA.STEP.")],
    rate: Annotated[
        str | None, typer.Option("--rate", help="The new rate: 50/s, 3000/min, 2/h (default: keep).")
    ] = None,
    burst: Annotated[
        int | None, typer.Option("--burst", help="The new burst, in commands (default: keep).")
    ] = None,
    app_ref: AppRef = None,
    by: Annotated[str, typer.Option("--by", help="Who changes it (recorded; default: $USER).")] = "",
    redis_url: RedisUrl = None,
    json_output: Json = False,
) -> None:
    """Change a rate limit for every worker at once, and record who, when, old and new.

    The new rate counts from now; commands already waiting for a token keep their time.
    """
    if rate is None and burst is None:
        raise UsageProblem("give --rate, --burst or both")
    try:
        check_limit_name(name)
        per_second = None if rate is None else parse_rate(rate)
        if burst is not None:
            check_burst(burst, name)
    except ValueError as error:
        raise UsageProblem(str(error)) from error
    declared = {limit.name: limit for limit in _declared(app_ref)}.get(name)
    who = by or f"saga limits ({os.environ.get('USER', 'unknown')})"
    change: LimitChange = with_redis(
        redis_url,
        lambda redis: set_limit(
            redis, name, rate=per_second, burst=burst, declared=declared, by=who, change_id=bus.uuid7()
        ),
    )
    if json_output:
        emit_json(change)
        return
    old = _describe(change.old.get("rate"), change.old.get("burst"))
    new = _describe(change.new["rate"], change.new["burst"])
    emit_line(f"{name}: {old} -> {new} (by {change.by}, {_when(change.at)})")


def list_command(app_ref: AppRef = None, redis_url: RedisUrl = None, json_output: Json = False) -> None:
    """Every rate limit declared or set: its rate, burst, tokens now and its last change."""
    declared = _declared(app_ref)
    views = with_redis(redis_url, lambda redis: read_limits(redis, declared))
    if json_output:
        emit_json(views)
        return
    rows = []
    for view in views:
        last = view.changes[0] if view.changes else None
        change = (
            f"{_describe(last.old.get('rate'), last.old.get('burst'))} -> "
            f"{_describe(last.new['rate'], last.new['burst'])} by {last.by}, {_when(last.at)}"
            if last
            else ""
        )
        rows.append(
            [
                view.name,
                "" if view.rate is None else f"{view.rate:g}/s",
                "" if view.burst is None else str(view.burst),
                "" if view.tokens is None else f"{view.tokens:g}",
                "operator" if view.set_by_operator else ("declared" if view.declared else "?"),
                change,
            ]
        )
    emit_table(["limit", "rate", "burst", "tokens", "from", "last change"], rows)


def lines_command(
    context: Annotated[str, typer.Argument(help="The context whose sagas have concurrency keys.")],
    key: Annotated[str | None, typer.Option("--key", help="Only this key's lines (its name).")] = None,
    most: Annotated[
        int, typer.Option("--most", min=1, max=10_000, help="Lines shown, most recent first.")
    ] = 100,
    redis_url: RedisUrl = None,
    json_output: Json = False,
) -> None:
    """Concurrency keys' lines: per value, the sagas holding a slot and how many wait."""
    keys = None if key is None else {key}
    views = with_redis(redis_url, lambda redis: read_lines(redis, context, keys=keys, most=most))
    if json_output:
        emit_json(views)
        return
    rows = [
        [v.key, v.value, str(len(v.holders)), ", ".join(v.holders[:5]), str(v.waiting), _when(v.used_ms)]
        for v in views
    ]
    emit_table(["key", "value", "holding", "sagas", "waiting", "last asked"], rows)


limits_app.command("set")(reporting_errors(set_command))
limits_app.command("lines")(reporting_errors(lines_command))
limits_app.command("list")(reporting_errors(list_command))
