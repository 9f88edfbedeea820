"""The ACL generator's structure (no server: fakeredis enforces no ACL; see test_acl.py)."""

from __future__ import annotations

import hashlib
import json
from fnmatch import fnmatchcase

import pytest
from redis import exceptions as rx
from typer.testing import CliRunner

from bus import EPOCH_KEY, RedisCommandError, RedisPermissionDenied, Stream
from bus._errors import translate
from redsaga.cli.main import app as cli
from redsaga.examples.all import app as demo
from saga import App, Context, DefinitionError, Participant
from saga.ops.acl import _CONNECT, acl_rules
from saga.ops.acl_grants import AclUser, script_commands
from saga.store.keys import CONTEXTS, ContextKeys, Partition
from saga.store.token_keys import secret_key
from tests.saga import compose_sagas, time_sagas

runner = CliRunner()


def users_of(app: App) -> dict[str, AclUser]:
    return {u.name: u for u in acl_rules(app)}


def reaches(user: AclUser, key: str, access: str = "rw") -> bool:
    """Whether ``user`` may ``access`` (``r``, ``w`` or ``rw``) ``key``: one of its selectors grants
    each asked letter (``~`` both, ``%R~`` read, ``%W~`` write; ``fnmatch`` globs as ACL's do here:
    ``*``, ``?`` and ``[0-9]``, with ``{`` and ``}`` plain characters)."""
    granted = set()
    for selector in user.keys:
        flags, _, pattern = selector.partition("~")
        if fnmatchcase(key, pattern):
            granted |= set(flags.lstrip("%").lower() or "rw")
    return set(access) <= granted


def test_one_user_per_orchestrator_context_participant_relay_and_operator() -> None:
    users = users_of(demo)
    assert {name: u.role for name, u in users.items()} == {
        "redsaga.orders": "orchestrator",
        "redsaga.orders.payments": "participant",
        "redsaga.orders.inventory": "participant",
        "redsaga.orders.shipping": "participant",
        "redsaga.client": "client",
        "redsaga.tasks": "tasks",  # the example's large orders wait for a manager
        "redsaga.relay": "relay",
        "redsaga.operator": "operator",
    }
    for user in users.values():
        rules = user.rules(None)
        assert rules[:4] == ["reset", "on", "nopass", "-@all"]
        root, *selectors = user.grants
        assert rules.index("resetkeys") < min((rules.index(k) for k in root.keys), default=len(rules))
        assert rules[rules.index("resetchannels") + 1 :] == [g.selector() for g in selectors]


def test_write_only_keys_take_only_xadd_so_nothing_there_is_trimmed_deleted_or_acked() -> None:
    """%W~ admits every write: XTRIM and DEL as well as XADD. So a write-only key is granted
    with XADD alone, in a grant of its own; a participant's registration with SET on its own
    record and SADD on the set of names, each in a grant of its own key."""
    for user in users_of(demo).values():
        for grant in user.grants:
            if any(k.startswith("%W~") for k in grant.keys):
                commands = set(grant.commands) - set(_CONNECT)
                assert commands <= {"xadd"} or (commands, len(grant.keys)) in (({"set"}, 1), ({"sadd"}, 1)), (
                    user.name,
                    grant,
                )


def test_every_partition_key_belongs_to_the_orchestrator_and_none_to_another_context() -> None:
    orders = users_of(demo)["redsaga.orders"]
    partition = Partition("orders", 7)
    keys = [
        partition.saga("s"), partition.history("s"), partition.branches("s"), partition.inbox.key,
        partition.commands("payments").key, partition.timers, partition.timer_data,
        partition.by_status("running"), partition.counts, partition.drained,
        partition.ending, partition.inbox.dlq_key, partition.inbox.published_key,
        partition.inbox.dedupe_key("orders"), partition.inbox.failures_key("orders"),
        ContextKeys("orders").shapes, ContextKeys("orders").workers, CONTEXTS, secret_key("orders"),
        "rs:{orders:sched}:due", "rs:{orders:w:treasury/stream}:wait:k",
    ]  # fmt: skip
    assert [k for k in keys if not reaches(orders, k)] == []
    others = [Partition("orders2", 0).saga("s"), ContextKeys("order").shapes, "rs:{orders.events}:stream"]
    assert [k for k in others if reaches(orders, k)] == []


def test_a_participant_reaches_only_its_stream_records_and_what_its_replies_write() -> None:
    payments = users_of(demo)["redsaga.orders.payments"]
    partition = Partition("orders", 0)
    stream = partition.commands("payments")
    own = [stream.key, stream.dedupe_key("payments"), stream.dedupe_expiry_key("payments")]
    own += [stream.failures_key("payments"), stream.lost_key("payments")]
    assert [k for k in own if not reaches(payments, k)] == []
    # one record per key, as earlier releases kept them: read as a fallback, never made
    legacy = stream.legacy_dedupe_key("payments", "s/charge/do")
    assert reaches(payments, legacy, "r")
    assert not reaches(payments, legacy, "w")
    upgrading = {u.name: u for u in acl_rules(demo, upgrading_dedupe=True)}["redsaga.orders.payments"]
    assert reaches(upgrading, legacy, "w")  # while workers of an earlier release still write them
    # its replies and dead letters: it adds them, and reads, deletes or trims nobody's
    for added in (partition.inbox.key, stream.dlq_key):
        assert reaches(payments, added, "w")
        assert not reaches(payments, added, "r")
    foreign = [
        partition.saga("s"), partition.history("s"), partition.commands("inventory").key,
        partition.commands("payments2").key, stream.dedupe_key("inventory"), partition.timers,
        stream.legacy_dedupe_key("inventory", "k"), stream.dedupe_key("payments2"),
        partition.counts, secret_key("orders"), partition.inbox.published_key,
        Partition("billing", 0).commands("payments").key,
    ]  # fmt: skip
    assert [k for k in foreign if reaches(payments, k, "r") or reaches(payments, k, "w")] == []
    for read_only in (ContextKeys("orders").shapes, EPOCH_KEY):  # its partition count; the epoch
        assert reaches(payments, read_only, "r")
        assert not reaches(payments, read_only, "w")


def test_partition_patterns_are_anchored_no_id_moves_a_key_under_another_pattern() -> None:
    """``[0-9]*`` matched ``}`` too: a saga id ``x}:inbox`` put its hash under a participant's
    pattern. Tags are matched digit by digit now, for as many digits as the partitions need."""
    users = users_of(demo)
    crafted = Partition("orders", 0).saga("x}:inbox")  # refused by the API; made by hand here
    for name, user in users.items():
        if user.role in ("participant", "relay", "client"):
            assert not reaches(user, crafted, "w"), name
    wide = App("wide", sagas=[], participants=[Participant("payments", serves=[Context("shop", 12)])])
    shop = users_of(wide)["redsaga.shop.payments"]
    assert reaches(shop, Partition("shop", 11).commands("payments").key)
    assert not reaches(shop, "rs:{shop:011}:cmd:payments")
    assert not reaches(shop, "rs:{shop:1x}:cmd:payments")


def test_a_client_adds_to_inboxes_and_reads_sagas_and_nothing_more() -> None:
    client = users_of(demo)["redsaga.client"]
    partition = Partition("orders", 0)
    assert reaches(client, partition.inbox.key, "w")
    assert not reaches(client, partition.inbox.key, "r")  # nobody's replies
    for readable in (partition.saga("s"), partition.timers, partition.by_status("running"), partition.counts):
        assert reaches(client, readable, "r")
        assert not reaches(client, readable, "w")
    assert reaches(client, "rs:{orders:meta}:token-keys", "r")  # public keys: it checks tokens
    for hidden in (secret_key("orders"), partition.history("s"), partition.inbox.dlq_key, EPOCH_KEY):
        assert not reaches(client, hidden, "r")


def test_script_commands_are_read_from_the_scripts_themselves() -> None:
    # the dedupe helpers it calls (bus/lua/_shared.lua) count: the record hash, its expiry set
    # and the fallback read of an earlier release's record
    assert {"xpending", "hget", "zscore", "get", "hset", "zadd", "hdel", "zrem", "xadd", "xack"} <= set(
        script_commands("bus", "complete_batch")
    )
    assert "set" not in script_commands("bus", "complete_batch")  # no record is a key of its own
    assert "xgroup|delconsumer" in script_commands("bus", "delete_consumer")
    assert "xinfo|groups" in script_commands("bus", "trim")
    payments = users_of(demo)["redsaga.orders.payments"]
    # "publish": a consumer dead-letters an entry deleted while pending with the publish script
    for name in (
        "ack",
        "record",
        "complete_batch",
        "fail",
        "heartbeat",
        "dedupe_claim",
        "read_claim",
        "publish",
    ):
        assert set(script_commands("bus", name)) <= set(payments.commands), name
    # it reads new commands and claims their keys in one function, behind a wake-up (XREAD)
    assert {"xreadgroup", "xinfo|groups", "hset", "zadd"} <= set(script_commands("bus", "read_claim"))
    assert "xread" in payments.commands
    assert "hset" in payments.commands  # fail.lua records the failure history
    assert "hgetall" in payments.commands  # the registered partition count, read at start


def test_the_shared_helpers_a_script_calls_count_as_its_commands() -> None:
    """``leased`` (XPENDING) and ``clock_ms`` (TIME) live in ``bus/lua/_shared.lua``."""
    assert {"xpending", "xack"} <= set(script_commands("bus", "ack"))
    assert "time" in script_commands("relay", "publish_rows")
    assert "xpending" not in script_commands("relay", "publish_rows")  # it calls no lease check
    assert "xpending" not in users_of(demo)["redsaga.relay"].commands


def test_scripts_run_as_functions_and_no_user_runs_its_own_lua_or_loads_functions() -> None:
    lua = {"eval", "evalsha", "eval_ro", "evalsha_ro", "script", "script|load", "function", "function|load"}
    for user in users_of(demo).values():
        assert not lua & set(user.commands), user.name
        assert ("fcall" in user.commands) == (user.role != "operator"), user.name


def test_the_operator_reads_everything_but_the_secrets_and_writes_nothing() -> None:
    operator = users_of(demo)["redsaga.operator"]
    partition = Partition("orders", 0)
    readable = [
        partition.saga("s"), partition.history("s"), partition.inbox.key, partition.inbox.dlq_key,
        partition.commands("payments").key, ContextKeys("orders").shapes, CONTEXTS, EPOCH_KEY,
        "rs:{orders:meta}:token-keys", "rs:{orders:sched}:due",
    ]  # fmt: skip
    assert [k for k in readable if not reaches(operator, k, "r")] == []
    assert [k for k in readable if reaches(operator, k, "w")] == []
    assert not reaches(operator, secret_key("orders"), "r")  # it cannot mint resume tokens
    assert all(selector.startswith("%R~") for selector in operator.keys)
    assert not {"fcall", "evalsha", "eval", "set", "hset", "xadd", "del", "function|load"} & set(
        operator.commands
    )


def test_child_sagas_and_event_waits_reach_across_contexts() -> None:
    app = App(
        "composed",
        sagas=[compose_sagas.parent, compose_sagas.invoicing, time_sagas.loan],
        participants=[Participant("worker", serves=[compose_sagas.CONTEXT, "billing"])],
    )
    users = users_of(app)
    parent_context = compose_sagas.CONTEXT
    parent = users[f"redsaga.{parent_context}"]
    billing = users["redsaga.billing"]
    # the parent's orchestrator starts and cancels the child in billing by request, and reads
    # it; billing reports the end back onto the parent's inbox; neither writes the other's sagas
    child, mine = Partition("billing", 0), Partition(parent_context, 0)
    assert reaches(parent, child.inbox.key, "w")
    assert reaches(parent, child.saga("p-bill"), "r")
    assert not reaches(parent, child.saga("p-bill"), "w")
    assert not reaches(parent, "rs:{billing:meta}:signal-secret", "r")
    assert reaches(billing, mine.inbox.key, "w")
    assert not reaches(billing, mine.inbox.key, "r")
    assert not reaches(billing, mine.saga("p"), "r")
    loan = users[f"redsaga.{time_sagas.loan.context.name}"]
    events = Stream.named(time_sagas.TREASURY_EVENTS)
    assert reaches(loan, events.key)
    assert reaches(loan, events.failures_key(f"{time_sagas.loan.context.name}.waits"))
    assert not reaches(loan, "rs:{other}:stream")


def test_a_password_is_stored_only_as_its_sha256() -> None:
    user = users_of(demo)["redsaga.orders"]
    line = user.line("s3cret")
    assert "s3cret" not in line
    assert "#" + hashlib.sha256(b"s3cret").hexdigest() in line.split()
    assert "nopass" in user.line(None).split()


def test_the_cli_prints_one_line_per_user_and_reads_passwords_from_the_environment() -> None:
    result = runner.invoke(cli, ["acl", "--app", "redsaga.examples.all:app", "--nopass"])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert [line.split()[:3] for line in lines] == [["ACL", "SETUSER", name] for name in users_of(demo)]
    assert "read-only operator" in result.stderr

    names = list(users_of(demo))
    env = {f"PW_{n.upper().replace('.', '_')}": f"pw-{n}" for n in names}
    result = runner.invoke(
        cli, ["acl", "--app", "redsaga.examples.all:app", "--password-env", "PW", "--json"], env=env
    )
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert [r["name"] for r in rows] == names
    assert all(f"pw-{r['name']}" not in json.dumps(r) for r in rows)
    assert all("#" + hashlib.sha256(f"pw-{r['name']}".encode()).hexdigest() in r["rules"] for r in rows)


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        ([], 2, "exactly one of --password-env VAR and --nopass"),  # bad usage
        (["--nopass", "--password-env", "PW"], 2, "exactly one of"),
        (["--password-env", "NOT_SET_ANYWHERE"], 1, "NOT_SET_ANYWHERE_REDSAGA_ORDERS"),  # refused
    ],
)
def test_the_cli_refuses_an_unclear_password_choice(args: list[str], code: int, message: str) -> None:
    result = runner.invoke(cli, ["acl", "--app", "redsaga.examples.all:app", *args])
    assert result.exit_code == code
    assert message in result.stderr
    assert len(result.stderr.splitlines()) == 1


def test_a_refused_permission_is_a_typed_error_that_says_what_to_do() -> None:
    error = translate(rx.NoPermissionError("this user has no permissions to run the 'evalsha' command"))
    assert isinstance(error, RedisPermissionDenied)
    assert isinstance(error, RedisCommandError)
    assert not error.retryable
    assert "'evalsha'" in str(error)
    assert "saga acl" in str(error)


@pytest.mark.parametrize(
    "name", ["_local", "_waits", "_child", "pay*", "pay?", "p[a]y", "pay{x}", "pay\n", ""]
)
def test_a_participant_named_like_an_orchestrator_stream_or_a_glob_cannot_be_declared(name: str) -> None:
    """``cmd:_local`` and friends are the orchestrator's own streams, and glob characters would
    become ACL patterns: a participant of such a name would be granted more than its own."""
    with pytest.raises(DefinitionError, match="invalid participant name"):
        Participant(name, serves=["orders"])
