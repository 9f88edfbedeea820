"""The ACL generator's structure (no server: fakeredis enforces no ACL; see test_acl.py)."""

from __future__ import annotations

import hashlib
import json
from fnmatch import fnmatchcase

import pytest
from redis import exceptions as rx
from typer.testing import CliRunner

from bus import RedisCommandError, RedisPermissionDenied, Stream
from bus._errors import translate
from cli.main import app as cli
from saga import AclUser, App, DefinitionError, Participant, acl_rules
from saga._acl import script_commands
from saga._keys import CONTEXTS, ContextKeys, Partition
from saga._tokens import secret_key
from services_example.all import app as demo
from tests.saga import compose_sagas, time_sagas

runner = CliRunner()


def users_of(app: App) -> dict[str, AclUser]:
    return {u.name: u for u in acl_rules(app)}


def reaches(user: AclUser, key: str, *, write: bool = True) -> bool:
    """Whether one of ``user``'s key selectors matches ``key`` (``fnmatch`` globs as ACL's do here:
    ``*``, ``?`` and ``[0-9]``, with ``{`` and ``}`` plain characters)."""
    for selector in user.keys:
        flags, _, pattern = selector.partition("~")
        if write and flags == "%R":
            continue
        if fnmatchcase(key, pattern):
            return True
    return False


def test_one_user_per_orchestrator_context_participant_relay_and_operator() -> None:
    users = users_of(demo)
    assert {name: u.role for name, u in users.items()} == {
        "redsaga.orders": "orchestrator",
        "redsaga.orders.payments": "participant",
        "redsaga.orders.inventory": "participant",
        "redsaga.orders.shipping": "participant",
        "redsaga.relay": "relay",
        "redsaga.operator": "operator",
    }
    for user in users.values():
        rules = user.rules(None)
        assert rules[:4] == ["reset", "on", "nopass", "-@all"]
        assert rules.index("resetkeys") < min(rules.index(k) for k in user.keys)
        assert rules[-1] == "resetchannels"


def test_every_partition_key_belongs_to_the_orchestrator_and_none_to_another_context() -> None:
    orders = users_of(demo)["redsaga.orders"]
    partition = Partition("orders", 7)
    keys = [
        partition.saga("s"), partition.history("s"), partition.branches("s"), partition.inbox.key,
        partition.commands("payments").key, partition.timers, partition.timer_data,
        partition.by_status("running"), partition.active, partition.counts, partition.drained,
        partition.ending, partition.inbox.dlq_key, partition.inbox.published_key,
        partition.inbox.dedupe_key("orders", "k"), partition.inbox.failures_key("orders"),
        ContextKeys("orders").shapes, ContextKeys("orders").workers, CONTEXTS, secret_key("orders"),
        "rs:{orders:sched}:due", "rs:{orders:w:treasury/stream}:wait:k",
    ]  # fmt: skip
    assert [k for k in keys if not reaches(orders, k)] == []
    others = [Partition("orders2", 0).saga("s"), ContextKeys("order").shapes, "rs:{orders.events}:stream"]
    assert [k for k in others if reaches(orders, k)] == []


def test_a_participant_reaches_only_its_stream_records_and_what_its_replies_write() -> None:
    payments = users_of(demo)["redsaga.orders.payments"]
    partition = Partition("orders", 3)
    stream = partition.commands("payments")
    own = [
        stream.key, stream.dedupe_key("payments", "s/charge/do"), stream.failures_key("payments"),
        stream.dlq_key, stream.published_key, partition.inbox.key,
    ]  # fmt: skip
    assert [k for k in own if not reaches(payments, k)] == []
    foreign = [
        partition.saga("s"), partition.history("s"), partition.commands("inventory").key,
        partition.commands("payments2").key, stream.dedupe_key("inventory", "k"), partition.timers,
        partition.counts, secret_key("orders"),
        Partition("billing", 0).commands("payments").key,
    ]  # fmt: skip
    assert [k for k in foreign if reaches(payments, k, write=False)] == []
    shapes = ContextKeys("orders").shapes  # read at start: its partition count (PartitionMismatch)
    assert reaches(payments, shapes, write=False)
    assert not reaches(payments, shapes)


def test_script_commands_are_read_from_the_scripts_themselves() -> None:
    assert {"xpending", "get", "set", "del", "xadd", "xack", "hdel"} <= set(
        script_commands("bus", "complete_batch")
    )
    assert "xgroup|delconsumer" in script_commands("bus", "delete_consumer")
    assert "xinfo|groups" in script_commands("bus", "trim")
    payments = users_of(demo)["redsaga.orders.payments"]
    # "publish": a consumer dead-letters an entry deleted while pending with the publish script
    for name in ("ack", "record", "complete_batch", "fail", "heartbeat", "dedupe_claim", "publish"):
        assert set(script_commands("bus", name)) <= set(payments.commands), name
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


def test_the_operator_reads_everything_and_writes_nothing() -> None:
    operator = users_of(demo)["redsaga.operator"]
    assert operator.keys == ("%R~rs:*",)
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
    # the parent's orchestrator starts the child in billing; billing reports the end back
    assert reaches(parent, Partition("billing", 0).saga("p-bill"))
    assert reaches(billing, Partition(parent_context, 0).inbox.key)
    assert not reaches(billing, Partition(parent_context, 0).saga("p"))
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
    result = runner.invoke(cli, ["acl", "--app", "services_example.all:app", "--nopass"])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert [line.split()[:3] for line in lines] == [["ACL", "SETUSER", name] for name in users_of(demo)]
    assert "read-only operator" in result.stderr

    names = list(users_of(demo))
    env = {f"PW_{n.upper().replace('.', '_')}": f"pw-{n}" for n in names}
    result = runner.invoke(
        cli, ["acl", "--app", "services_example.all:app", "--password-env", "PW", "--json"], env=env
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
    result = runner.invoke(cli, ["acl", "--app", "services_example.all:app", *args])
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
