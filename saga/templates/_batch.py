"""The batch/ETL template: a map over chunks with bounded concurrency and per-chunk retries.

One step, ``chunks``: ``process(job, chunk)`` builds the command for each chunk of
``chunks(job)`` (at most ``limit`` chunks), at most ``concurrency`` in flight. Each chunk is
retried by ``retry`` and timed out by ``timeout`` on its own; a chunk that fails for good
stops the job (no further chunk starts, the ones in flight finish) and the chunks done so
far are undone, newest first, by ``undo`` when given. A chunk that runs out of attempts
parks the job for an operator (``Retry(on_exhausted="dead_letter")``, the default): ``saga
retry`` then sends only the chunks that ran out again. The step's output is the list of
every chunk's reply, in chunk order; add a step after it to load or report the results.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import TypeVar

from saga.definition.retry import Retry
from saga.definition.saga import Command, Saga, StepContext

J = TypeVar("J")
C = TypeVar("C")
O = TypeVar("O")  # noqa: E741 - the conventional name for an output type variable
T = TypeVar("T")

CHUNK_RETRY = Retry(attempts=5, initial=1.0, backoff=2.0, max_delay=60.0)
"""The default per-chunk retry policy: five attempts, then an operator decides."""


def batch(
    name: str,
    *,
    job: type[J],
    chunks: Callable[[J], Sequence[C]],
    process: Callable[[J, C], Command],
    reply: type[O],
    undo: Callable[[J, C, O], Command] | None = None,
    concurrency: int = 10,
    limit: int = 10_000,
    retry: Retry = CHUNK_RETRY,
    timeout: float | timedelta | None = 300,
    version: int = 1,
    context: str = "batch",
) -> Saga[J]:
    """A batch job over ``chunks(job)`` (see the module docstring); returns its definition."""
    saga: Saga[J] = Saga(name, version=version, context=context, data=job)

    def build(data: J, chunk: C) -> Command:
        return process(data, chunk)

    step = saga.map(
        items=chunks,
        reply=reply,
        compensate="undo_chunk" if undo else None,
        concurrency=concurrency,
        limit=limit,
        retry=retry,
        timeout=timeout,
        name="chunks",
    )(build)
    if undo is not None:
        undo_chunk = undo

        def build_undo(data: J, ctx: StepContext) -> Command:
            return undo_chunk(data, ctx.item, ctx.branch_output(step))

        saga.compensation("undo_chunk", retry=retry, timeout=timeout)(build_undo)
    return saga


def chunked(items: Sequence[T], size: int) -> list[list[T]]:
    """``items`` cut into lists of ``size`` (the last one may be shorter)."""
    if size < 1:
        raise ValueError("chunk size must be at least 1")
    return [list(items[i : i + size]) for i in range(0, len(items), size)]
