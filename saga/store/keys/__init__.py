"""Every Redis key the saga engine reads or writes, in one place.

Nothing but this package's modules (``partitions.py``, ``indexes.py``, ``flow.py``) builds a
key in ``saga/``: the store, the runtime, the operator tools and the ACL generator
(``saga/ops/acl.py``) ask the builders here, and a Lua script receives its keys from Python
in ``KEYS`` (or, when it must derive a key from an id, the key's prefix in ``ARGV``, built
here). The bus's own keys (streams and their companions: dedupe, failures, lost reports, the
publish window, the dead letters) are ``redsaga/streams.py``'s.

Each entry: key, type, what it holds, who writes it.

A context's sagas are spread over P partitions; every key of one partition shares the hash
tag ``{<context>:<partition>}``, so each transition is one single-slot script
(:class:`Partition`)::

    rs:{orders:0}:saga:<id>          hash: the saga's state (layout: saga/store/codec.py);
                                     transition.lua, migrate.lua
    rs:{orders:0}:hist:<id>          list: the saga's history, one MessagePack entry per
                                     event, referring to the saga hash (saga/store/history.py);
                                     transition.lua, migrate.lua
    rs:{orders:0}:branches:<id>      hash: '<group>#<index>' -> one branch's record (JSON), for
                                     sagas with group steps (saga/store/branches.py); transition.lua
    rs:{orders:0}:inbox              stream: replies, timer firings, operator requests, event
                                     deliveries, child reports; every principal adds, the
                                     orchestrator reads
    rs:{orders:0}:cmd:<participant>  stream: commands for a participant (cmd:_local: actions,
                                     cmd:_waits: event-wait registrations, cmd:_child: child
                                     sagas to start or cancel); transition.lua
    rs:{orders:0}:timers             zset: timer id -> due time (ms); transition.lua, fire_timers.lua
    rs:private:{orders:0}:timerdata  hash: timer id -> '<len>:<saga id><MAC><event JSON>'; same, private
    rs:{orders:0}:idx:<status>       zset: saga id -> when it last moved (an ended saga: when it
                                     ended); the unfinished statuses' indexes together are the
                                     sagas in flight, by staleness (``saga list --stuck-for``);
                                     transition.lua, migrate.lua, prune_ended.lua (derives it
                                     from the prefix it is given)
    rs:{orders:0}:counts             hash: '<name>@<version>|<status>' -> number of sagas;
                                     transition.lua, prune_ended.lua
    rs:{orders:0}:ending             zset: 'name@version|status|id' -> when the ended saga's hash
                                     expires; transition.lua, prune_ended.lua
    rs:{orders:0}:ends               stream: one entry per saga that ended or was dead-lettered
                                     ('saga' id, 'status'), the last 1,000 or more (~43 KB); the
                                     transition that ends it adds it; SagaClient.wait blocks
                                     on it (saga/runtime/results.py)
    rs:{orders:0}:drained            set: 'name@version' that new sagas may not start on (drain);
                                     the start transition checks it in the same script;
                                     versions drain (saga/versions/registry.py)
    rs:{orders:0}:task:<id>          hash: one human task ('rev', 'task' JSON: saga/core/task_rules.py);
                                     task_write.lua; prune_ended.lua deletes it with its saga
    rs:private:{orders:0}:tokens     hash: task id -> an open human task's resume token ('' once
                                     closed); task_write.lua, prune_ended.lua (HDEL with its
                                     saga). Outside ``rs:{orders:0}:*``, so no pattern of the
                                     operator's reaches it: the orchestrator and the task client only
    rs:{orders:0}:tasks:<assignee>   zset: open task id -> due (ms), per 'role:<r>' or 'user:<u>';
                                     task_write.lua, prune_ended.lua
    rs:{orders:0}:tasktimers         zset: '<task id>|<stage>' -> when (ms): reminders and
                                     escalation steps; task_write.lua, prune_ended.lua
    rs:{orders:0}:tasklog:<id>       list: a saga's task actions (who, what, when; JSON);
                                     task_write.lua; prune_ended.lua deletes it with its saga
    rs:{orders:0}:refused:<request>  string: why a client's start request was refused (JSON
                                     ``{"kind", "reason"}``, expiring), read by the client that
                                     waits for its verdict; the orchestrator
    rs:{orders:0}:dlq                stream: dead letters of every stream in the partition; the
                                     bus's consumers (``Stream.dlq_key``), read by ``saga dlq``

A context's definition versions are registered under the context's own hash tag
(``saga/versions/registry.py`` writes them; see docs/versioning.md; :class:`ContextKeys`)::

    rs:{orders}:versions:shapes      hash: 'name@version' -> registered shape (JSON,
                                     saga/definition/shape.py); register_shape.lua
    rs:{orders}:versions:info        hash: 'name@version' -> when and by whom it was registered;
                                     register_shape.lua
    rs:{orders}:versions:drained     hash: 'name@version' -> drain note (who, when, why); versions drain
    rs:{orders}:versions:workers     zset: worker id -> when its registration expires (ms);
                                     workers.lua
    rs:{orders}:versions:served      hash: worker id -> what the worker serves (JSON); workers.lua
    rs:{orders}:versions:participant-names  set: the participants workers ran (which
                                     cmd:<participant> streams the context has); each participant
                                     adds its own name (SADD only)
    rs:{orders}:versions:participant:<name>  string: the worker that last ran <name> (JSON);
                                     written by that participant's user alone, so a name in the
                                     set counts only with its record
    rs:{redsaga}:contexts            set: every context with a version registry; the registry

A context's schedules (``saga/runtime/schedule_runner.py``; :class:`ScheduleKeys`), one
slot per context::

    rs:{orders:sched}:specs          hash: schedule id -> Schedule (JSON); schedule_write.lua
    rs:{orders:sched}:states         hash: schedule id -> ScheduleState (JSON); schedule_write.lua
    rs:{orders:sched}:revs           hash: schedule id -> revision (compare-and-set); schedule_write.lua
    rs:{orders:sched}:due            zset: schedule id -> when to look at it next (Unix ms);
                                     schedule_write.lua

A context's index of event waits (``saga/store/wait_index.py``; :class:`WaitIndexKeys`),
one slot per (context, awaited stream)::

    rs:{orders:w:<tag>/<name>}:wait:<key>   hash: '<type> <saga>|<step>|<n>' -> waiter (JSON);
                                            watch_event.lua, the orchestrator (HDEL when it ends)
    rs:{orders:w:<tag>/<name>}:early:<key>  list: '<type> <event JSON>', events that came before
                                            their wait (capped, expiring); route_event.lua

A context's resume-token keys (``saga/store/token_keys.py``; :class:`ContextKeys`)::

    rs:{orders:meta}:signal-secret   string: the generated master secret (signing off, none
                                     configured); the first process that needs it (SET NX)
    rs:{orders:meta}:token-keys      hash: key id -> public key (base64url); the orchestrator

A rate limit's bucket (``saga/store/rates.py``; :class:`LimitKeys`), one slot per limit, so a
limit shared by every context and partition is one single-slot script on a Redis Cluster::

    rs:{limit:payments}:bucket       hash: 'tokens', 'at' (ms of the last refill), and the
                                     operator's 'rate' and 'burst' when set; rate_take.lua,
                                     rate_set.lua
    rs:{limit:payments}:grants       zset: command id -> when its token is due (ms), for the
                                     last minute (a repeated take changes nothing); rate_take.lua
    rs:{limit:payments}:log          list: the operator's changes (JSON: who, when, old, new),
                                     the last 100; rate_set.lua
    rs:{limits}:names                set: every limit a worker declared or an operator set
                                     (``saga limits list`` starts here)

A concurrency key's line (``saga/store/slots.py``; :class:`SlotKeys`), one slot per key
value, so the sagas of every partition that share a value share one single-slot script::

    rs:{slot:orders:account:42}:holders   zset: saga ref '<partition>:<id>' -> when it took
                                          its slot (ms); slot.lua
    rs:{slot:orders:account:42}:waiting   hash: ref -> '<priority> <tenant> <seq> <timers>', the
                                          sagas in line; slot.lua
    rs:{slot:orders:account:42}:seq       string: arrivals so far; slot.lua
    rs:{slot:orders:account:42}:prios     zset: the priorities with sagas in line; slot.lua
    rs:{slot:orders:account:42}:weights   hash: tenant -> weight; slot.lua
    rs:{slot:orders:account:42}:pending   string: the saga whose debounce window is open; slot.lua
    rs:{slot:orders:account:42}:tenants:<p>, :line:<p>:<tenant>, :vt:<p>   the line of each
                                          priority, per tenant (stride scheduling); slot.lua
    rs:{slots:orders}:lines               zset: '<name>:<value>' -> last use (ms), the lines of
                                          the context (``saga limits list``, metrics); the
                                          orchestrator
    rs:{slots:orders}:waiters             hash: ref -> '<name>:<value>', the line each waiting
                                          saga is in (``saga inspect``); the orchestrator

The deployment's epoch (``bus/_epoch.py`` owns it; :data:`EPOCH`)::

    rs:epoch                         string: the deployment's epoch; epoch.lua (orchestrators)
    rs:{epoch:<n>}                   string: on a Redis Cluster, 64 copies of it spread over the
                                     slots, so each master holds one (:data:`EPOCH_COPIES`)

:class:`Partition` and :class:`ContextKeys` built with a glob (``PartitionKeys("orders:[0-9]")``)
give the ACL patterns matching exactly those keys, so ``saga acl`` derives every pattern here.
"""

from saga.store.keys.flow import LIMIT_NAMES, LimitKeys, SlotKeys, slot_lines, slot_waiters
from saga.store.keys.indexes import ScheduleKeys, WaitIndexKeys
from saga.store.keys.partitions import (
    CONTEXTS,
    EPOCH,
    EPOCH_COPIES,
    MAX_ID_LENGTH,
    ContextKeys,
    Partition,
    PartitionKeys,
    check_saga_id,
    partition_of,
)

__all__ = [
    "CONTEXTS",
    "EPOCH",
    "EPOCH_COPIES",
    "LIMIT_NAMES",
    "MAX_ID_LENGTH",
    "ContextKeys",
    "LimitKeys",
    "Partition",
    "PartitionKeys",
    "ScheduleKeys",
    "SlotKeys",
    "WaitIndexKeys",
    "check_saga_id",
    "partition_of",
    "slot_lines",
    "slot_waiters",
]
