"""Test sagas in-process: a synchronous runner over the real decider, and participant fakes.

No Redis, no real timers, no sleeps: :class:`SagaRunner` keeps sagas in memory, delivers
commands to participants and their replies to the decider (the same
:func:`saga.core.decider.decide` the orchestrator runs), and moves a virtual clock only when told::

    from saga.testing import FakeParticipant, SagaRunner, fail, fail_transiently, succeed

    inventory = FakeParticipant("inventory", {
        ReserveStock: StockReserved(reservation_id="r-1"),
        ReleaseStock: succeed(lambda cmd: StockReleased(reservation_id=cmd.reservation_id)),
    })
    payments = FakeParticipant("payments", {ChargeCard: fail("card declined")})

    runner = SagaRunner(order_fulfilment, participants=[inventory, payments, shipping])
    state = runner.run(order)                  # start, then run until it settles
    assert state.status == "compensated"
    assert inventory.received(ReleaseStock) == [ReleaseStock(reservation_id="r-1")]
    runner.assert_invariants()                 # compensation order, each effect once, ...

Faults to inject per command type: :func:`succeed`, :func:`fail` (permanent),
:func:`fail_transiently`, :func:`no_reply` (for timeouts), :func:`late_reply`,
:func:`duplicate_reply`, :func:`redeliver`, and :func:`sequence` to script attempt by
attempt. Real participants plug in directly (``participants=[payments]``) or wrapped to
inject faults around their handlers (``FakeParticipant.of(payments).on(ChargeCard,
fail_transiently(times=2))``). Local actions always run for real.

Time: :meth:`SagaRunner.advance` fires exactly the timers that fall due (retry back-offs,
step and wait timeouts, sleeps, deadlines) and the schedule occurrences
(:meth:`SagaRunner.add_schedule`), in order; :meth:`SagaRunner.run_until_settled` skips
from timer to timer until the saga ends or is dead-lettered. Waits:
:meth:`SagaRunner.signal` delivers a resume token (:meth:`SagaRunner.resume_token`,
:meth:`SagaRunner.query`), :meth:`SagaRunner.publish` another context's event, with the
checks and matching rules Redis applies (see ``docs/time.md``).

Human tasks: ``runner.tasks(role="managers")`` lists the open tasks, ``runner.tasks.claim``,
``.release``, ``.complete`` and ``.reassign`` act with the engine's checks (``SagaRunner(...,
authorize=...)`` is the application's authorizer), and :meth:`SagaRunner.advance` fires the
reminders and escalation steps at their due times.

Regression tests from production: :func:`replay_trace` replays a trace that ``saga
export`` wrote (its path, as a ``Path`` or a ``str``, or its JSON document) and fails with
:class:`TraceMismatch` at the first decision or final-state field that differs;
:func:`replay` runs a bare history (the Redis history list) through the decider and fails
at the first decision that differs; given several versions (a registry), it replays each
history on the version it started on, across recorded migrations.

Versions: give the runner several versions of a definition and :meth:`SagaRunner.migrate`
runs a migration function over its sagas exactly as ``saga versions migrate`` does.
"""

from saga.errors import ReplayMismatch, RunnerError, TraceMismatch
from saga.ops.trace import replay_trace
from saga.testing.fakes import (
    Behaviour,
    Call,
    FakeParticipant,
    duplicate_reply,
    fail,
    fail_transiently,
    handler,
    late_reply,
    no_reply,
    redeliver,
    sequence,
    succeed,
)
from saga.testing.invariants import (
    StepSummary,
    Summary,
    compensation_order,
    decode_history,
    invariant_violations,
    replay,
    summarize,
)
from saga.testing.runner import SagaRunner
from saga.testing.runner_sagas import PendingTimer

__all__ = [
    "Behaviour",
    "Call",
    "FakeParticipant",
    "PendingTimer",
    "ReplayMismatch",
    "RunnerError",
    "SagaRunner",
    "StepSummary",
    "Summary",
    "TraceMismatch",
    "compensation_order",
    "decode_history",
    "duplicate_reply",
    "fail",
    "fail_transiently",
    "handler",
    "invariant_violations",
    "late_reply",
    "no_reply",
    "redeliver",
    "replay",
    "replay_trace",
    "sequence",
    "succeed",
    "summarize",
]
