"""The read-only web UI behind ``saga ui``: sagas, one saga's path over its diagram, dead letters, stats.

A small ASGI app (Starlette) whose pages are rendered on the server (Jinja2, every value
escaped) from what :class:`~saga.SagaAdmin` reads, with the definitions' shapes registered
in Redis: no application code is needed. It changes nothing: operator actions stay in the
``saga`` command line. Mermaid (vendored under ``static/mermaid``, MIT) draws the diagrams
in the browser, so the pages work offline.

::

    sock = listen("127.0.0.1", 8080)               # OSError now if the port is taken
    app = create_app(redis, allowed_hosts=allowed_hosts("127.0.0.1"))
    await ui_server(app).serve([sock])             # uvicorn; server.should_exit = True stops it
"""

from saga.ops.ui.app import create_app
from saga.ops.ui.auth import UiAuth
from saga.ops.ui.server import allowed_hosts, is_loopback, listen, ui_server

__all__ = ["UiAuth", "allowed_hosts", "create_app", "is_loopback", "listen", "ui_server"]
