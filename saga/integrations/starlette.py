"""A worker in a Starlette or FastAPI app's lifespan, and redsaga's errors as HTTP responses.

``run_worker`` runs a :class:`~saga.SagaWorker` in the app's event loop from start-up
until shutdown, when it stops gracefully (handlers in flight finish; what it has not taken
stays for the other workers). Each server process (each uvicorn or gunicorn worker) then
runs its own worker: they share the consumer groups, so this scales with the processes; run
``saga worker`` as its own process instead when the web processes must not handle commands.
``add_error_handlers`` answers every redsaga error with the status
:func:`saga.integrations.http.status_of` gives and a JSON body (:func:`~saga.integrations.http.body_of`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from bus import BusError
from saga.errors import SagaError
from saga.integrations.http import body_of, status_of
from saga.runtime.worker import SagaWorker


@asynccontextmanager
async def run_worker(worker: SagaWorker) -> AsyncIterator[SagaWorker]:
    """Run ``worker`` while the block runs (it has registered and started when the block begins).

    Leaving the block stops it and waits for it to finish; a worker that fails ends the block
    with its error (the app does not go on without its worker).
    """
    try:
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(worker.run)
            await worker.started.wait()
            try:
                yield worker
            finally:
                worker.stop()
    except BaseExceptionGroup as group:  # the task group's: raise the one error as itself
        if len(group.exceptions) == 1:
            raise group.exceptions[0] from group
        raise


async def _respond(_request: Request, error: Exception) -> Response:
    return JSONResponse(body_of(error), status_code=status_of(error))


def add_error_handlers(app: Any) -> None:
    """Answer :class:`~saga.errors.SagaError` and :class:`bus.BusError` with their HTTP status.

    ``app`` is a Starlette or FastAPI application.
    """
    app.add_exception_handler(SagaError, _respond)
    app.add_exception_handler(BusError, _respond)
