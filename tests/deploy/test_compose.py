"""compose.yaml keeps its promises: no Docker engine runs here, so the file is read and checked.

The invariants: every container of the example image names the App operations need; every
worker and relay has a health check, and those checks run here (against a real Redis) and
exit 0 or 1 as they should; each participant with state has its own PostgreSQL database and
its own relay; Redis is a supported official image with AOF on; a generator keeps orders
coming. ``check-jsonschema --builtin-schema vendor.compose-spec`` (lint) checks the schema.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
import yaml
from psycopg.conninfo import conninfo_to_dict
from typer.testing import CliRunner, Result

import bus
import relay
from bus._auth import load_keyrings
from bus._epoch import join_epoch
from redsaga.cli._load import load_object
from redsaga.cli.main import app as cli
from relay.metrics import RelayMetrics
from saga import App, EngineConfig, SagaWorker
from saga.metrics import WorkerMetrics
from saga.runtime.tasks import task_contexts
from tests.helpers import eventually

ROOT = Path(__file__).resolve().parents[2]
COMPOSE: dict[str, Any] = yaml.safe_load((ROOT / "compose.yaml").read_text())
SERVICES: dict[str, dict[str, Any]] = COMPOSE["services"]
APP_IMAGE = {name: s for name, s in SERVICES.items() if s.get("image") == "redsaga:dev" and name != "keys"}
"""The long-running containers of the example image (``keys`` runs once, before them)."""
# Redis Open Source lines still receiving fixes in December 2026: 7.4 and the 8.x minors
# (8.12 is a release candidate). redsaga needs 7.0 or newer.
SUPPORTED_REDIS = {"7.4", "8.2", "8.4", "8.6", "8.8", "8.10"}


def command(service: dict[str, Any]) -> list[str]:
    value = service["command"]
    return shlex.split(value) if isinstance(value, str) else list(value)


def env(service: dict[str, Any]) -> dict[str, str]:
    return {k: str(v) for k, v in service.get("environment", {}).items()}


def health_args(service: dict[str, Any]) -> list[str]:
    """The health check's ``saga`` arguments (after ``CMD saga``)."""
    test = service["healthcheck"]["test"]
    assert test[:2] == ["CMD", "saga"], test
    return list(test[2:])


WORKERS = {n: s for n, s in APP_IMAGE.items() if command(s)[:2] == ["saga", "worker"]}
RELAYS = {n: s for n, s in APP_IMAGE.items() if command(s)[:2] == ["saga", "relay"]}


def app_of(service: dict[str, Any]) -> App:
    args = command(service)
    app = load_object(args[args.index("--app") + 1])
    assert isinstance(app, App)
    return app


def stateful(service: dict[str, Any]) -> bool:
    """Whether the worker's participants keep state in a database (they reply via the outbox)."""
    return any(p.uses_outbox for p in app_of(service).participants)


def test_the_system_has_its_workers_relays_and_generator() -> None:
    assert set(WORKERS) == {"orders", "payments", "inventory", "shipping"}
    assert set(RELAYS) == {"payments-relay", "inventory-relay"}
    generator = SERVICES["generator"]
    assert command(generator)[:3] == ["python", "-m", "redsaga.examples.generator"]
    assert generator["depends_on"]["orders"]["condition"] == "service_healthy"


def test_every_container_of_the_image_names_the_app_operations_need() -> None:
    for name, service in APP_IMAGE.items():
        reference = env(service).get("REDSAGA_APP")
        assert reference, f"{name} has no REDSAGA_APP"
        app = load_object(reference)
        assert isinstance(app, App)
        served = {d.key for d in app.registry}
        for worker in WORKERS.values():  # every saga any worker runs can be operated from here
            assert {d.key for d in app_of(worker).registry} <= served, name


def test_every_worker_and_relay_has_a_health_check_on_its_metrics_port() -> None:
    for name, service in {**WORKERS, **RELAYS}.items():
        assert health_args(service) == ["health", "ready"], name  # /readyz of its metrics port
        assert env(service)["REDSAGA_METRICS_PORT"] == "9464", name
        assert env(service)["REDSAGA_METRICS_HOST"] == "0.0.0.0", name  # noqa: S104 - Prometheus scrapes it
    for name, service in SERVICES.items():
        for needed, condition in service.get("depends_on", {}).items():
            if condition["condition"] == "service_healthy":
                assert "healthcheck" in SERVICES[needed], f"{name} waits for {needed}: it has no health check"


def database_of(dsn: str) -> tuple[str, str]:
    """(service host, database name) of a PostgreSQL DSN."""
    parts = conninfo_to_dict(dsn)
    return str(parts["host"]), str(parts["dbname"])


def test_each_participant_with_state_has_its_own_database_and_relay() -> None:
    owners: dict[tuple[str, str], str] = {}
    for name, service in WORKERS.items():
        dsns = {k: v for k, v in env(service).items() if k.endswith("_DSN")}
        if not stateful(service):
            assert dsns == {}, f"{name} keeps no state but is given a database"
            continue
        assert list(dsns) == [f"{name.upper()}_DSN"], name  # the variable its module reads
        host, database = database_of(dsns[f"{name.upper()}_DSN"])
        assert (host, database) not in owners, f"{name} shares {database} with {owners.get((host, database))}"
        owners[host, database] = name
        server = SERVICES[host]
        assert server["image"].startswith("postgres:")
        assert server["environment"]["POSTGRES_DB"] == database
        assert service["depends_on"][host]["condition"] == "service_healthy"
        relay_service = RELAYS[f"{name}-relay"]
        assert database_of(env(relay_service)["REDSAGA_RELAY_DSN"]) == (host, database)
    assert sorted(owners.values()) == ["inventory", "payments"]
    assert len(RELAYS) == len(owners)  # one relay per outbox, none without one
    assert "REDSAGA_PG_DSN" not in {k for s in APP_IMAGE.values() for k in env(s)}  # no shared database


def test_redis_is_a_supported_official_image_with_aof_and_no_eviction() -> None:
    redis = SERVICES["redis"]
    match = re.fullmatch(r"redis:(\d+\.\d+)(?:\.\d+)?", redis["image"])
    assert match, f"{redis['image']} is not the official image pinned to a release line"
    assert match.group(1) in SUPPORTED_REDIS
    args = command(redis)
    settings = dict(zip(args[1::2], args[2::2], strict=True))
    assert settings == {
        "--appendonly": "yes",
        "--appendfsync": "everysec",
        "--maxmemory-policy": "noeviction",
    }
    assert redis["volumes"] == ["redis-data:/data"]  # the AOF outlives the container


def test_every_app_container_reaches_the_redis_service() -> None:
    for name, service in APP_IMAGE.items():
        url = env(service)["REDSAGA_REDIS_URL"]
        assert url.startswith("redis://redis:6379/"), name
        waits_for = service["depends_on"]  # Redis itself, or the orders worker that waited for it
        assert "redis" in waits_for or "orders" in waits_for, name


async def saga(args: list[str], environment: dict[str, str]) -> Result:
    return await anyio.to_thread.run_sync(lambda: CliRunner().invoke(cli, args, env=environment))


@pytest.mark.anyio
@pytest.mark.redis
async def test_the_worker_health_check_of_the_compose_file_exits_0_while_the_worker_is_ready(
    real_redis: bus.Redis,
) -> None:
    service = WORKERS["shipping"]
    args = health_args(service)
    await join_epoch(real_redis)  # as the orders worker would: a participant's only reads it
    worker = SagaWorker(real_redis, app_of(service), config=EngineConfig(auth=bus.SIGNING_OFF))
    async with anyio.create_task_group() as tasks:
        port = await tasks.start(WorkerMetrics(worker).server().serve)  # a free port, not 9464
        environment = {**env(service), "REDSAGA_METRICS_PORT": str(port)}
        refused = await saga(args, environment)
        assert refused.exit_code == 1, refused.output  # the port answers, the worker is not reading
        assert refused.stderr == "unhealthy: the worker is not reading its streams yet\n"
        tasks.start_soon(worker.run)

        async def healthy() -> bool:
            return (await saga(args, environment)).exit_code == 0

        await eventually(healthy, 30, "the compose health check passes")
        worker.stop()
        tasks.cancel_scope.cancel()
    assert (await saga(args, environment)).exit_code == 1  # nothing answers: unhealthy


def test_prometheus_scrapes_every_worker_and_grafana_shows_the_dashboard_over_it() -> None:
    config = yaml.safe_load((ROOT / "deploy/prometheus/prometheus.yml").read_text())
    [job] = config["scrape_configs"]
    [targets] = job["static_configs"]
    assert sorted(targets["targets"]) == sorted(f"{name}:9464" for name in {**WORKERS, **RELAYS})
    prometheus, grafana = SERVICES["prometheus"], SERVICES["grafana"]
    assert "./deploy/prometheus:/etc/prometheus:ro" in prometheus["volumes"]
    assert config["rule_files"] == ["/etc/prometheus/alerts.yml"]
    assert grafana["depends_on"]["prometheus"]["condition"] == "service_healthy"
    assert "./deploy/grafana/provisioning:/etc/grafana/provisioning:ro" in grafana["volumes"]
    assert "./deploy/grafana/dashboards:/var/lib/grafana/dashboards:ro" in grafana["volumes"]
    home = grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert (ROOT / "deploy/grafana/dashboards" / Path(home).name).is_file()
    sources = yaml.safe_load((ROOT / "deploy/grafana/provisioning/datasources/prometheus.yaml").read_text())
    [source] = sources["datasources"]
    assert source["url"] == "http://prometheus:9090"
    assert source["uid"] == "prometheus"  # what every panel of the dashboard names
    for name in ("prometheus", "grafana"):
        assert all(port.startswith("127.0.0.1:") for port in SERVICES[name]["ports"]), name


@pytest.mark.anyio
@pytest.mark.redis
async def test_the_relay_health_check_of_the_compose_file_exits_0_once_the_relay_is_ready(
    tmp_path: Path, real_redis: bus.Redis
) -> None:
    service = RELAYS["payments-relay"]
    args = health_args(service)
    dsn = f"sqlite:///{tmp_path / 'payments.db'}"
    await relay.init_db(dsn)
    worker = relay.Relay.connect(dsn, real_redis)
    async with anyio.create_task_group() as tasks:
        port = await tasks.start(RelayMetrics(worker).server().serve)  # a free port, not 9464
        environment = {**env(service), "REDSAGA_METRICS_PORT": str(port)}
        refused = await saga(args, environment)
        assert refused.exit_code == 1, refused.output  # the orders worker has not set the epoch
        assert refused.stderr.startswith("unhealthy: rs:epoch is not set")
        await join_epoch(real_redis)
        assert (await saga(args, environment)).exit_code == 0
        tasks.cancel_scope.cancel()
    assert (await saga(args, environment)).exit_code == 1  # nothing answers: unhealthy


def test_the_keys_service_issues_the_keyring_each_container_reads(tmp_path: Path) -> None:
    """Run the keys service's script here (the volume is a temporary directory): every
    container that signs names a keyring it writes, holding that container's principals only
    (an orchestrator's worker runs its context's task inbox too); a second run keeps the
    master and issues the same keys."""
    keys = SERVICES["keys"]
    [script] = keys["command"]
    local = script.replace("/keys", str(tmp_path)).replace("saga ", f"{sys.executable} -m redsaga.cli ")
    subprocess.run(["sh", "-c", local], check=True, capture_output=True, timeout=120, cwd=ROOT)
    first = {p.name: p.read_bytes() for p in tmp_path.glob("*.keyring.json")}
    signing = {name: s for name, s in APP_IMAGE.items() if name not in RELAYS and name != "ui"}
    for name, service in signing.items():
        path = env(service)["REDSAGA_KEYRING"].replace("/keys", str(tmp_path))
        held = sorted(k.principal for k in load_keyrings(path))
        expected = ["client:generator"] if name == "generator" else app_principals(service)
        assert held == expected, name
        assert "keys:/keys:ro" in service["volumes"], name
        assert service["depends_on"]["keys"]["condition"] == "service_completed_successfully", name
    for name in [*RELAYS, "ui"]:  # a relay forwards rows as their writers signed them; the UI reads
        assert "REDSAGA_KEYRING" not in env(SERVICES[name]), name
    login = (tmp_path / "ui-login").read_text().strip()
    user, password = login.split(":")  # what `saga ui --basic-auth-file` reads
    assert user == "oncall"
    assert len(password) >= 32
    subprocess.run(["sh", "-c", local], check=True, capture_output=True, timeout=120, cwd=ROOT)
    assert {p.name: p.read_bytes() for p in tmp_path.glob("*.keyring.json")} == first
    assert (tmp_path / "ui-login").read_text().strip() == login  # kept, as the master is


def test_the_ui_serves_beyond_its_container_only_behind_a_login_on_the_loopback_port() -> None:
    ui = SERVICES["ui"]
    arguments = command(ui)
    assert arguments[:2] == ["saga", "ui"]
    assert arguments[arguments.index("--host") + 1] == "0.0.0.0"  # noqa: S104 - inside its container
    assert arguments[arguments.index("--basic-auth-file") + 1] == "/keys/ui-login"
    assert "--no-auth" not in arguments
    assert ui["ports"] == ["127.0.0.1:8080:8080"]
    assert "'.[ui]'" in (ROOT / "Dockerfile").read_text()  # the image has Starlette and uvicorn
    assert ui["depends_on"]["orders"]["condition"] == "service_healthy"


def app_principals(service: dict[str, Any]) -> list[str]:
    """The principals a worker of one orchestrator (and its task inbox) or one participant runs as."""
    app = app_of(service)
    if app.registry.contexts:
        [context] = app.registry.contexts
        return [f"orchestrator:{context}", *(["participant:tasks"] if task_contexts(app.registry) else [])]
    [participant] = app.participants
    return [f"participant:{participant.name}"]
