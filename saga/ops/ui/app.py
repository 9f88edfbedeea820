"""The UI's ASGI app: six read-only pages over one Redis connection.

``/`` lists sagas (search by id or business key; filters: status, definition, version,
moved within, stuck for; sorted stalest or newest first), ``/sagas/<id>`` shows one saga
(its path over its diagram, its attempts on a time axis, timeline, attempts, timers and
waits, compensations), ``/workers`` the live workers and who runs each participant,
``/dead-letters`` the dead letters with their reasons, ``/stats`` queues, lag, in-flight
and stuck sagas, and ``/tasks`` the open human tasks of a role or a person, soonest due
first (read only: people act through the application's own task inbox). Each request
reads the definitions registered in Redis afresh (:meth:`saga.SagaAdmin.from_redis`), so
versions registered since show up.

Errors are pages too: an unknown saga 404, a filter that does not parse 400, Redis not
answering 503. Responses carry a Content-Security-Policy that runs only the app's own
scripts, so even a value that escaped escaping could not run as one.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import jinja2
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates
from starlette.types import ASGIApp, Receive, Scope, Send

from bus import BusError, LetterFilter, dead_letter_sizes
from saga.core.states import SagaStatus
from saga.errors import CodeRequired, InvalidInput, SagaNotFound, UnknownDefinition
from saga.ops.admin import SagaAdmin
from saga.ops.durations import parse_duration
from saga.ops.ui import formatting
from saga.ops.ui.auth import Authenticate, UiAuth
from saga.ops.ui.pages import SORTS, Filters, compensations, status_counts, step_bars
from saga.runtime.task_client import TaskClient
from saga.runtime.tasks import nobody
from saga.versions.registry import Versions

_HERE = Path(__file__).parent
_HEADERS = {
    # mermaid writes a <style> into each diagram it draws: inline styles, never inline scripts
    "content-security-policy": (
        "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
        "connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
    ),
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
}


def _templates() -> Jinja2Templates:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(_HERE / "templates"),
        autoescape=True,  # every page, every value
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters |= {
        "when": formatting.when,
        "ago": formatting.ago,
        "pretty": formatting.pretty,
        "saga_href": formatting.saga_href,
        "at": formatting.at,
    }
    return Jinja2Templates(env=env)


_pages = _templates()


def create_app(redis: Any, *, allowed_hosts: Sequence[str] = ("*",), auth: UiAuth | None = None) -> Starlette:
    """The UI over ``redis`` (the caller owns and closes the connection).

    ``allowed_hosts`` are the host names requests may name (their ``Host`` header): a UI
    bound to the loopback should allow only loopback names, so that no other site's page
    can reach it through a DNS name pointed at 127.0.0.1. ``auth`` says how a request
    proves who it is (:mod:`saga.ops.ui.auth`; ``None``: nothing is asked).
    """
    app = Starlette(
        routes=[
            Route("/", _sagas, name="sagas"),
            Route("/sagas/{saga_id:path}", _saga, name="saga"),
            Route("/dead-letters", _dead_letters, name="dead_letters"),
            Route("/stats", _stats, name="stats"),
            Route("/tasks", _tasks, name="tasks"),
            Route("/workers", _workers, name="workers"),
            Mount("/static", StaticFiles(directory=_HERE / "static"), name="static"),
        ],
        middleware=[
            Middleware(TrustedHostMiddleware, allowed_hosts=list(allowed_hosts)),
            Middleware(Authenticate, auth=auth or UiAuth()),
            Middleware(_SecurityHeaders),
        ],
        exception_handlers={
            HTTPException: _http_error,
            SagaNotFound: _error_page(404, "No such saga"),
            InvalidInput: _error_page(400, "Bad filter"),
            UnknownDefinition: _error_page(400, "Unknown definition or context"),
            BusError: _error_page(503, "Redis is not answering"),
        },
    )
    app.state.redis = redis
    return app


class _SecurityHeaders:
    """Adds the security headers to every response."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def with_headers(message: Any) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [
                    *message.get("headers", []),
                    *((k.encode(), v.encode()) for k, v in _HEADERS.items()),
                ]
            await send(message)

        await self.app(scope, receive, with_headers)


async def _admin(request: Request) -> SagaAdmin:
    return await SagaAdmin.from_redis(request.app.state.redis)


async def _sagas(request: Request) -> Response:
    filters = Filters.of(request.query_params)
    admin = await _admin(request)
    if filters.search and not filters.offset and (found := await _exactly(admin, filters)):
        return RedirectResponse(formatting.saga_href(found), status_code=303)
    now_ms = await admin.now_ms()
    arguments = filters.arguments(now_ms)
    page = await admin.list(**arguments, offset=filters.offset, limit=filters.limit)
    tally = await admin.tally(context=arguments["context"])
    return _pages.TemplateResponse(
        request,
        "sagas.html",
        {
            "filters": filters,
            "page": page,
            "statuses": [s.value for s in SagaStatus],
            "definitions": sorted({*admin.catalogue.names(), *(c.definition for c in tally.counts)}),
            "contexts": sorted(admin.catalogue.contexts),
            "by_status": status_counts(tally.counts),
            "total": tally.total,
            "sorts": SORTS,
            "now_ms": now_ms,
        },
    )


async def _exactly(admin: SagaAdmin, filters: Filters) -> str | None:
    """The saga whose id is the search text, when one exists (one ``EXISTS`` per context)."""
    try:
        await admin.get(filters.search, context=filters.context or None)
    except (SagaNotFound, InvalidInput, UnknownDefinition):
        return None
    return filters.search


async def _saga(request: Request) -> Response:
    saga_id = request.path_params["saga_id"]
    context = request.query_params.get("context") or None
    admin = await _admin(request)
    try:
        found = await admin.inspect(saga_id, context=context, graph="mermaid")
    except CodeRequired:  # neither code nor a registered shape: no diagram to draw
        found = await admin.inspect(saga_id, context=context)
    return _pages.TemplateResponse(
        request,
        "saga.html",
        {
            "saga": found,
            "compensations": compensations(found),
            "bars": step_bars(found, await admin.now_ms()),
        },
    )


async def _dead_letters(request: Request) -> Response:
    context = request.query_params.get("context") or None
    saga_id = request.query_params.get("saga", "")
    admin = await _admin(request)
    streams = admin.dead_letter_streams(context=context)
    where = LetterFilter(correlation_id=saga_id) if saga_id else None
    letters = await admin.dead_letters(where, context=context, limit=200)
    return _pages.TemplateResponse(
        request,
        "dead_letters.html",
        {
            "letters": letters,
            "sizes": await dead_letter_sizes(admin.redis, streams),
            "saga_id": saga_id,
        },
    )


async def _stats(request: Request) -> Response:
    stuck_for = request.query_params.get("stuck_for", "").strip()
    try:
        stuck_for_ms = parse_duration(stuck_for) if stuck_for else None
    except ValueError as error:
        raise InvalidInput(f"stuck for: {error}") from None
    admin = await _admin(request)
    context = request.query_params.get("context") or None
    found = await (
        admin.stats(context=context)  # its threshold, saga stats's
        if stuck_for_ms is None
        else admin.stats(context=context, stuck_for_ms=stuck_for_ms)
    )
    return _pages.TemplateResponse(request, "stats.html", {"stats": found, "stuck_for": stuck_for})


async def _tasks(request: Request) -> Response:
    kind = request.query_params.get("kind", "role")
    name = request.query_params.get("name", "").strip()
    context = request.query_params.get("context") or None
    if kind not in ("role", "user"):
        raise InvalidInput(f"assignee kind {kind!r} is not role or user")
    client = await TaskClient.from_redis(request.app.state.redis, authorize=nobody)
    role, user = (name, "") if kind == "role" else ("", name)
    found = await client.list(role=role, user=user, context=context) if name else []
    return _pages.TemplateResponse(
        request,
        "tasks.html",
        {
            "kind": kind,
            "name": name,
            "context": context or "",
            "contexts": sorted(client.catalogue.contexts),
            "tasks": found,
            "now_ms": await client.engine.now_ms(),
        },
    )


async def _workers(request: Request) -> Response:
    admin = await _admin(request)
    versions = Versions(request.app.state.redis, clock=admin.clock)
    contexts = sorted(admin.catalogue.contexts)
    return _pages.TemplateResponse(
        request,
        "workers.html",
        {
            "workers": {c: await versions.workers(c) for c in contexts},
            "participants": {c: await versions.participant_records(c) for c in contexts},
            "now_ms": await admin.now_ms(),
        },
    )


def _error_page(status: int, title: str) -> Callable[[Request, Exception], Awaitable[Response]]:
    async def page(request: Request, error: Exception) -> Response:
        return _pages.TemplateResponse(
            request, "error.html", {"title": title, "message": str(error)}, status_code=status
        )

    return page


async def _http_error(request: Request, error: Exception) -> Response:
    assert isinstance(error, HTTPException)  # noqa: S101 - registered for HTTPException only
    return await _error_page(error.status_code, "Not found" if error.status_code == 404 else "Error")(
        request, error
    )
