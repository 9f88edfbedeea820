"""``saga ui``: serve the read-only web UI until stopped."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

import bus
from bus.lowlevel import redis_errors
from redsaga.cli._common import CommandError, RedisUrl, emit_line, real_redis_url, run
from redsaga.cli._logging import LogLevel

UI_EXTRA = "pip install 'redsaga[ui]'"
TOKEN_ENV = "REDSAGA_UI_TOKEN"  # noqa: S105 - the variable's name, not a secret
"""The UI's bearer token itself, when no --auth-token-file is given."""


def _secret(path: Path) -> str:
    """The secret a file holds (its text, stripped); a one-line error when it cannot."""
    try:
        text = path.read_text(encoding="utf-8").strip()
    except OSError as error:
        raise CommandError(f"{path} cannot be read: {error.strerror or error}") from None
    if not text:
        raise CommandError(f"{path} is empty")
    return text


def ui(
    port: Annotated[
        int, typer.Option("--port", min=0, max=65535, help="The port to serve on (0: a free one).")
    ] = 8080,
    host: Annotated[
        str,
        typer.Option(
            "--host",
            help="The address to listen on. The default answers only this machine; anything else "
            "needs --auth-token-file, --basic-auth-file or --proxy-auth-header (or --no-auth).",
        ),
    ] = "127.0.0.1",
    auth_token_file: Annotated[
        Path | None,
        typer.Option(
            "--auth-token-file",
            envvar="REDSAGA_UI_TOKEN_FILE",
            help="A file holding the bearer token requests must send (Authorization: Bearer …); "
            "or the token itself in REDSAGA_UI_TOKEN.",
        ),
    ] = None,
    basic_auth_file: Annotated[
        Path | None,
        typer.Option(
            "--basic-auth-file",
            envvar="REDSAGA_UI_BASIC_FILE",
            help="A file holding one line user:password for HTTP basic (a browser asks for it).",
        ),
    ] = None,
    proxy_auth_header: Annotated[
        str,
        typer.Option(
            "--proxy-auth-header",
            envvar="REDSAGA_UI_PROXY_HEADER",
            help="Trust an authenticating reverse proxy that sets this header to the user "
            "(X-Forwarded-User, say); requests without it are refused. Only when nothing but "
            "the proxy reaches the port.",
        ),
    ] = "",
    no_auth: Annotated[
        bool,
        typer.Option(
            "--no-auth",
            help="Serve beyond the loopback with no authentication (warned about at start-up).",
        ),
    ] = False,
    redis_url: RedisUrl = None,
    log_level: LogLevel = "warning",
) -> None:
    """Serve the read-only web UI: sagas, a saga's path over its diagram, dead letters, stats.

    Pages: / (the sagas, by status, definition, version or time stuck), /sagas/ID (timeline,
    attempts with input and output, timers and waits, compensations in order, the diagram
    with the path taken), /dead-letters and /stats. Reads only what is in Redis: no --app,
    and it changes nothing (operator actions stay in this command line). Bound to anything
    but the loopback it refuses to start without an authentication method (a bearer token,
    HTTP basic, or an authenticating proxy's header; docs/operations.md) unless --no-auth
    says so, and then warns. Prints the URL on stderr and serves until SIGINT or SIGTERM.
    No --json: it serves pages, it prints no data. Exit code 1 when Redis does not answer,
    the port cannot be bound or authentication is missing or unusable, 2 for bad usage.
    """
    url = real_redis_url(redis_url)
    try:
        from saga.ops.ui import (  # noqa: PLC0415 - only this command needs the extra
            UiAuth,
            allowed_hosts,
            create_app,
            is_loopback,
            listen,
            ui_server,
        )
    except ImportError as error:
        raise CommandError(
            f"saga ui needs the ui extra ({error.name} is not installed): {UI_EXTRA}"
        ) from None
    token = _secret(auth_token_file) if auth_token_file else os.environ.get(TOKEN_ENV, "").strip()
    basic = _secret(basic_auth_file) if basic_auth_file else ""
    if token and len(token) < 16:
        raise CommandError("the UI's bearer token must have at least 16 characters")
    if basic and ":" not in basic:
        raise CommandError(f"{basic_auth_file} must hold one line user:password")
    auth = UiAuth(token=token, basic=basic, proxy_header=proxy_auth_header.strip())
    if not auth.enabled and not is_loopback(host):
        if not no_auth:
            raise CommandError(
                f"saga ui on {host} would show every saga's data to whoever reaches it: give "
                "--auth-token-file, --basic-auth-file or --proxy-auth-header, or --no-auth"
            )
        emit_line(f"warning: the UI on {host} asks for no authentication (--no-auth)", err=True)
    try:
        sock = listen(host, port)
    except OSError as error:
        raise CommandError(f"cannot listen on {host}:{port}: {error.strerror or error}") from None

    async def main() -> None:
        redis = bus.connect(url)
        try:
            with redis_errors():
                await redis.ping()  # Redis down is an error now, not a page later
            app = create_app(redis, allowed_hosts=allowed_hosts(host), auth=auth)
            bound = sock.getsockname()
            where = f"[{bound[0]}]" if ":" in bound[0] else bound[0]
            emit_line(f"redsaga UI on http://{where}:{bound[1]}/ (read-only; Ctrl-C stops it)", err=True)
            await ui_server(app, log_level=log_level).serve([sock])
        finally:
            sock.close()
            await redis.aclose()

    run(main)
