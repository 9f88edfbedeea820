"""The library's loggers: structlog once the application configured it, stdlib otherwise.

A logger binds itself to structlog once per configuration, so these tests check that a
level below the configured one prints nothing, that context and level reach the output,
and that a configuration made after the first call (tests' capture, a CLI command) is the
one used.
"""

from __future__ import annotations

import io
import json
import logging

import pytest
import structlog
from structlog.testing import capture_logs

from bus._log import get_logger


def configure_json(stream: io.StringIO, level: int) -> None:
    structlog.configure(
        processors=[structlog.processors.add_log_level, structlog.processors.JSONRenderer()],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(stream),
    )


def lines(stream: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_structlog_drops_levels_below_its_own_and_prints_the_rest_with_context() -> None:
    out = io.StringIO()
    configure_json(out, logging.INFO)
    log = get_logger("redsaga.test").bind(saga_id="s1")

    log.debug("dropped", n=1)
    log.info("kept", n=2)
    log.warning("also kept", n=3)

    assert lines(out) == [
        {"saga_id": "s1", "n": 2, "event": "kept", "level": "info"},
        {"saga_id": "s1", "n": 3, "event": "also kept", "level": "warning"},
    ]


def test_a_configuration_made_after_the_first_call_is_the_one_used() -> None:
    log = get_logger("redsaga.test")
    first, second = io.StringIO(), io.StringIO()
    configure_json(first, logging.WARNING)
    log.info("below warning")
    log.warning("to the first")

    configure_json(second, logging.DEBUG)
    log.debug("to the second")
    with capture_logs() as captured:
        log.info("captured")

    assert [line["event"] for line in lines(first)] == ["to the first"]
    assert [line["event"] for line in lines(second)] == ["to the second"]
    assert captured == [{"event": "captured", "log_level": "info"}]


def test_without_structlog_configured_the_stdlib_logger_decides(caplog: pytest.LogCaptureFixture) -> None:
    structlog.reset_defaults()
    log = get_logger("redsaga.test").bind(entry="1-0")

    with caplog.at_level(logging.WARNING, logger="redsaga.test"):
        log.info("dropped")
        log.warning("lease lost")

    [record] = caplog.records
    assert record.levelno == logging.WARNING
    assert "event='lease lost'" in record.getMessage()
    assert "entry='1-0'" in record.getMessage()


@pytest.mark.anyio
async def test_a_handlers_log_lines_name_the_saga_step_and_attempt() -> None:
    """What an operator greps for: the saga id, the step and the attempt of a failing command."""
    import bus

    redis = bus.connect(bus.MEMORY_URL)
    stream = bus.Stream("orders:0", "cmd:payments")
    app = bus.Bus("payments")

    @app.handler(stream, None)
    async def fail(_envelope: bus.Envelope) -> None:
        raise bus.TransientError("card processor down")

    worker = bus.Worker(redis, app, auth=bus.SIGNING_OFF)
    await worker.setup()
    command = bus.Envelope(
        id="c1", type="Charge", payload=b"{}", correlation_id="saga-7", attempt=3, headers={"step": "charge"}
    )
    await bus.Publisher(redis).publish_envelope(stream, command)
    with capture_logs() as logs:
        await worker.run_until_idle()
    [line] = [entry for entry in logs if entry["event"] == "handler failed; will retry"]
    assert (line["saga_id"], line["step"], line["attempt"]) == ("saga-7", "charge", 3)
    await redis.aclose()
