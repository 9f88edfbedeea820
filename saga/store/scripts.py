"""Every Lua script of the saga engine, loaded in one place.

Each is one file of ``saga/store/lua/`` (its header documents its keys, arguments and
reply), a function of the ``saga`` Redis Functions library (``bus/_scripts.py`` builds the
library, with the shared helpers of ``bus/lua/_shared.lua`` first). Callers build the keys
with :mod:`saga.store.keys` and pass them in ``KEYS``; the ACL generator
(``saga/ops/acl.py``) reads the commands each one calls from :data:`SCRIPTS`.
"""

from __future__ import annotations

from typing import Final

from bus.lowlevel import Script

PACKAGE: Final = "saga.store"
"""Where the scripts live (``saga/store/lua/``)."""

TRANSITION: Final = Script.load(PACKAGE, "transition")
"""One saga's transition: revision check, state, history, indexes, effects (saga/store/commit.py)."""
FIRE_TIMERS: Final = Script.load(PACKAGE, "fire_timers")
"""Move due timers of a partition onto its inbox (saga/runtime/timer_firing.py)."""
PRUNE_ENDED: Final = Script.load(PACKAGE, "prune_ended")
"""Forget ended sagas whose hash expired (saga/store/pruning.py)."""
MIGRATE: Final = Script.load(PACKAGE, "migrate")
"""Move one saga to another definition version (saga/versions/migrator.py)."""
REGISTER_SHAPE: Final = Script.load(PACKAGE, "register_shape")
"""Register a definition version's shape (saga/versions/registry.py)."""
WORKERS: Final = Script.load(PACKAGE, "workers")
"""Renew a worker's registration, forget expired ones (saga/versions/registry.py)."""
SCHEDULE_WRITE: Final = Script.load(PACKAGE, "schedule_write")
"""Compare-and-set one schedule (saga/runtime/schedule_runner.py)."""
WATCH_EVENT: Final = Script.load(PACKAGE, "watch_event")
"""Register an event wait, find an event that came first (saga/store/wait_index.py)."""
ROUTE_EVENT: Final = Script.load(PACKAGE, "route_event")
"""Route an event to its waits, or buffer it (saga/store/wait_index.py)."""
TASK_WRITE: Final = Script.load(PACKAGE, "task_write")
"""Apply one change to one human task (saga/store/tasks.py)."""
RATE_TAKE: Final = Script.load(PACKAGE, "rate_take")
"""Take (or give back) a rate limit's token for one command (saga/store/rates.py)."""
RATE_SET: Final = Script.load(PACKAGE, "rate_set")
"""Change a rate limit and record the change (saga/store/rates.py)."""
SLOT: Final = Script.load(PACKAGE, "slot")
"""Take a concurrency key's slot or wait in line, give one back (saga/store/slots.py)."""

SCRIPTS: Final = (
    TRANSITION, FIRE_TIMERS, PRUNE_ENDED, MIGRATE, REGISTER_SHAPE, WORKERS, SCHEDULE_WRITE,
    WATCH_EVENT, ROUTE_EVENT, TASK_WRITE, RATE_TAKE, RATE_SET, SLOT,
)  # fmt: skip
"""Every script above (a test checks it is every file of ``saga/store/lua/``)."""
