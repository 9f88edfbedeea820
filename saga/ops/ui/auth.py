"""Who may read the UI: a bearer token, HTTP basic, or a header an authenticating proxy sets.

The UI shows every saga's data. On the loopback it answers only this machine; bound
anywhere else it needs one of these (``saga ui --auth-token-file``, ``--basic-auth-file``,
``--proxy-auth-header``; docs/operations.md):

- **bearer**: ``Authorization: Bearer <token>``, the token read from a file or
  ``REDSAGA_UI_TOKEN`` (for scripts and dashboards);
- **basic**: HTTP basic with the one ``user:password`` line of a file (a browser asks);
- **proxy**: a reverse proxy that authenticates (oauth2-proxy, an SSO gateway) and passes
  the user in a header, ``X-Forwarded-User`` say; a request without it is refused. Only
  safe when nothing but the proxy can reach the UI's port.

Secrets are compared in constant time and never logged or shown.
"""

from __future__ import annotations

import base64
import binascii
import hmac
from dataclasses import dataclass, field

from starlette.datastructures import Headers
from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Receive, Scope, Send


@dataclass(frozen=True)
class UiAuth:
    """How requests prove who they are (every field empty: nothing is asked)."""

    token: str = field(default="", repr=False)
    """The bearer token."""
    basic: str = field(default="", repr=False)
    """The ``user:password`` of HTTP basic."""
    proxy_header: str = ""
    """The header an authenticating reverse proxy sets to the user's name."""

    @property
    def enabled(self) -> bool:
        """Whether any method is configured."""
        return bool(self.token or self.basic or self.proxy_header)

    def allows(self, headers: Headers) -> bool:
        """Whether a request with ``headers`` may read the UI."""
        if not self.enabled:
            return True
        if self.proxy_header and headers.get(self.proxy_header, "").strip():
            return True
        scheme, _, credentials = headers.get("authorization", "").partition(" ")
        if self.token and scheme.lower() == "bearer":
            return hmac.compare_digest(credentials.strip().encode(), self.token.encode())
        if self.basic and scheme.lower() == "basic":
            try:
                given = base64.b64decode(credentials.strip(), validate=True)
            except (binascii.Error, ValueError):
                return False
            return hmac.compare_digest(given, self.basic.encode())
        return False


class Authenticate:
    """ASGI middleware: a request :class:`UiAuth` does not allow gets 401 and nothing else."""

    def __init__(self, app: ASGIApp, auth: UiAuth) -> None:
        self.app = app
        self.auth = auth

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Pass an allowed request on; answer any other with 401 and a challenge."""
        if scope["type"] != "http" or self.auth.allows(Headers(scope=scope)):
            await self.app(scope, receive, send)
            return
        challenge = 'Basic realm="redsaga"' if self.auth.basic else 'Bearer realm="redsaga"'
        response = PlainTextResponse(
            "authentication required", status_code=401, headers={"WWW-Authenticate": challenge}
        )
        await response(scope, receive, send)
