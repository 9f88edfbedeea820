"""docs/embedding.md's Django recipe runs: its settings, its client and view, its worker as a
management command, and its outbox write inside ``transaction.atomic()`` on PostgreSQL.

Django configures itself once per process, so the recipe runs in processes of its own: the
management command as the worker, and a script that calls the view through Django's test
client and writes charges through the outbox.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlparse, urlunparse

import psycopg
import pytest

from bus import Stream
from tests.conftest import PG_DSN, REDIS_URL, require_server
from tests.docs.test_embedding import lay_out

pytestmark = pytest.mark.postgres

TEST_SETTINGS = """
from psycopg.conninfo import conninfo_to_dict

from settings import *  # the page's settings

_pg = conninfo_to_dict({dsn!r})
DATABASES = {{"default": {{
    "ENGINE": "django.db.backends.postgresql", "NAME": _pg["dbname"], "USER": _pg.get("user", ""),
    "HOST": _pg.get("host", ""), "PORT": _pg.get("port", ""), "PASSWORD": _pg.get("password", ""),
}}}}
INSTALLED_APPS = ["shop", "payments"]
ROOT_URLCONF = "urls"
SECRET_KEY = "test"
ALLOWED_HOSTS = ["testserver"]
USE_TZ = True
"""

URLS = """
from django.urls import path

from shop.views import place

urlpatterns = [path("orders/<str:order_id>", place)]
"""

DRIVER = """
import json

import anyio
import django

django.setup()

from django.db import connection, transaction
from django.test import Client

import relay
from payments.charges import charge
from shop.sagas import client

anyio.run(relay.init_db, {dsn!r})
with connection.cursor() as cursor:
    cursor.execute("CREATE TABLE charges (order_id text PRIMARY KEY, amount int)")

http = Client()
placed = http.post("/orders/o1?amount=100")
conflict = http.post("/orders/o1?amount=5")
charge("o1", 100)
try:
    with transaction.atomic():
        charge("o2", 50)
        raise RuntimeError("the business change failed")
except RuntimeError:
    pass
with connection.cursor() as cursor:
    cursor.execute("SELECT order_id FROM charges")
    charges = [row[0] for row in cursor.fetchall()]
    cursor.execute("SELECT stream, ordering_key FROM redsaga_outbox")
    rows = [list(row) for row in cursor.fetchall()]
client.close()
print(json.dumps({{
    "placed": [placed.status_code, placed.json()],
    "conflict": [conflict.status_code, conflict.json()],
    "charges": charges,
    "outbox": rows,
}}))
"""


@pytest.fixture
def database() -> Iterator[str]:
    """A PostgreSQL database of this test's own (the outbox rows it writes disturb no other)."""
    require_server("PostgreSQL", PG_DSN)
    name = f"redsaga_django_{secrets.token_hex(4)}"
    with psycopg.connect(PG_DSN, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name}")
    try:
        yield urlunparse(urlparse(PG_DSN)._replace(path=f"/{name}"))
    finally:
        with psycopg.connect(PG_DSN, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE {name} WITH (FORCE)")


@pytest.fixture
def project(tmp_path: Path, database: str) -> Path:
    """The page's files, the README's example as checkout.py, and what a Django project adds."""
    lay_out(tmp_path)
    for package in ("shop", "shop/management", "shop/management/commands", "payments"):
        (tmp_path / package / "__init__.py").touch()
    (tmp_path / "test_settings.py").write_text(TEST_SETTINGS.format(dsn=database))
    (tmp_path / "urls.py").write_text(URLS)
    (tmp_path / "driver.py").write_text(DRIVER.format(dsn=database))
    return tmp_path


def test_the_django_recipe(project: Path) -> None:
    env = {
        **os.environ,
        "PYTHONPATH": str(project),
        "DJANGO_SETTINGS_MODULE": "test_settings",
        "REDSAGA_REDIS_URL": REDIS_URL,
    }
    command = "import django; django.setup(); from django.core.management import call_command; "
    worker = subprocess.Popen(
        [sys.executable, "-c", command + "call_command('sagaworker')"], cwd=project, env=env
    )
    try:
        driven = subprocess.run(
            [sys.executable, "driver.py"],
            check=False,
            cwd=project,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert driven.returncode == 0, driven.stderr
        outcome = json.loads(driven.stdout)
    finally:
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=30) == 0  # the command drains and exits cleanly
    assert outcome["placed"] == [200, {"order": "o1", "tracking": "T-1"}]
    assert outcome["conflict"] == [409, {"error": "StartConflict", "saga_id": "o1"}]
    assert outcome["charges"] == ["o1"]  # o2's charge rolled back, and its outbox row with it
    assert outcome["outbox"] == [[Stream.named("payments.events").key, "o1"]]
