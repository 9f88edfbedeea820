"""What the operations commands share: the app option, a real Redis, and an admin session.

Every operations command talks to a real Redis (``--redis-url``, or ``$REDSAGA_REDIS_URL``;
the embedded demo server holds no sagas worth operating) and runs one :class:`saga.SagaAdmin`
call on the definitions registered there (:meth:`saga.SagaAdmin.from_redis`). The app's code
(``--app``, or ``$REDSAGA_APP``) is loaded only when given; start, replay and dry runs need it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated, TypeVar

import typer

import bus
from bus.lowlevel import redis_errors
from redsaga.cli._common import APP_ENV, CommandError, real_redis_url, run
from redsaga.cli._load import load_object
from saga import App, Registry, SagaAdmin

T = TypeVar("T")
QUEUED_EXIT = 3
"""Exit code of an action that was sent but not decided within ``--wait``."""

AppRef = Annotated[
    str | None,
    typer.Option(
        "--app",
        envvar=APP_ENV,
        help="The App (or Registry) with the definitions' code, as module:attribute (env REDSAGA_APP). "
        "Only start, replay, redrive and dry runs need it; without it the definitions registered "
        "in Redis are used.",
        show_default=False,
    ),
]
ContextName = Annotated[
    str | None,
    typer.Option(
        "--context", help="Only this bounded context (default: every registered context).", show_default=False
    ),
]
By = Annotated[
    str | None,
    typer.Option(
        "--by",
        envvar="REDSAGA_OPERATOR",
        help="Who is acting, recorded in the history (env REDSAGA_OPERATOR; default user@host).",
        show_default=False,
    ),
]
Wait = Annotated[
    float,
    typer.Option(
        "--wait",
        min=0,
        help="Seconds to wait for the orchestrator to decide the action (0: send and return). "
        f"Exit code {QUEUED_EXIT} if it is still queued.",
    ),
]
Reason = Annotated[str, typer.Option("--reason", help="Why (recorded in the history with --by).")]


def definitions(reference: str | None) -> App | Registry | None:
    """The app named by ``--app`` (or ``$REDSAGA_APP``); ``None`` when none is named."""
    if not reference:
        return None
    loaded = load_object(reference)
    if not isinstance(loaded, App | Registry):
        raise CommandError(f"{reference} is a {type(loaded).__name__}, not a saga.App or saga.Registry")
    return loaded


def with_admin(
    redis_url: str | None,
    app: str | None,
    job: Callable[[SagaAdmin], Awaitable[T]],
    *,
    by: str | None = None,
    wait_s: float = 10.0,
) -> T:
    """Run ``job`` with an admin client on a fresh connection, closed afterwards.

    The client knows the definitions registered in Redis, and the app's code when ``app``
    names one.
    """
    loaded, url = definitions(app), real_redis_url(redis_url)

    async def main() -> T:
        redis = bus.connect(url)
        try:
            with redis_errors():
                return await job(await SagaAdmin.from_redis(redis, loaded, by=by, wait_s=wait_s))
        finally:
            await redis.aclose()

    return run(main)
