"""docs/embedding.md runs: its FastAPI service and its synchronous caller, written from the
docs alone on the README's example, against a real Redis; and its Django pieces."""

from __future__ import annotations

import importlib
import re
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import redis as sync_redis
from starlette import exceptions as starlette_exceptions

from tests.conftest import REDIS_URL, require_server

# Starlette 1.10 would have httpx2 send its test requests (httpx still does); older ones say nothing
NEWER_TRANSPORT_WARNING = getattr(starlette_exceptions, "StarletteDeprecationWarning", DeprecationWarning)
with warnings.catch_warnings():
    warnings.simplefilter("ignore", NEWER_TRANSPORT_WARNING)
    from fastapi.testclient import TestClient

ROOT = Path(__file__).parents[2]


def doc_files() -> dict[str, str]:
    """Every ``python`` block of the page that opens with ``# <path>``, by that path."""
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "docs" / "embedding.md").read_text(), flags=re.DOTALL)
    files = {}
    for block in blocks:
        first = block.splitlines()[0]
        found = re.match(r"# ([\w/]+\.py)\b", first)
        assert found, f"a block without its file name: {first!r}"
        files[found[1]] = block
    return files


def lay_out(folder: Path) -> None:
    """Write the README's example as ``checkout.py`` and the page's files into ``folder``, on an
    emptied test Redis."""
    require_server("Redis", REDIS_URL)
    with sync_redis.Redis.from_url(REDIS_URL) as admin:
        admin.flushdb()
    (folder / "checkout.py").write_text((ROOT / "examples" / "checkout.py").read_text())
    for name, text in doc_files().items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A folder with the README's example as checkout.py and the page's files, importable."""
    lay_out(tmp_path)
    monkeypatch.setenv("REDSAGA_REDIS_URL", REDIS_URL)
    monkeypatch.syspath_prepend(str(tmp_path))
    before = set(sys.modules)
    yield tmp_path
    for name in set(sys.modules) - before:  # each test imports the page's modules afresh
        del sys.modules[name]


def test_the_page_names_the_files_the_tests_run() -> None:
    assert sorted(doc_files()) == [
        "caller.py",
        "payments/charges.py",
        "service.py",
        "settings.py",
        "shop/management/commands/sagaworker.py",
        "shop/sagas.py",
        "shop/views.py",
    ]


def test_the_fastapi_service_and_a_sync_caller(project: Path) -> None:
    service: ModuleType = importlib.import_module("service")
    with TestClient(service.api) as http:
        placed = http.post("/orders/o1", params={"amount": 100})
        assert (placed.status_code, placed.json()) == (200, {"order": "o1", "tracking": "T-1"})
        again = http.post("/orders/o1", params={"amount": 100})  # idempotent by id
        assert again.json() == placed.json()
        conflict = http.post("/orders/o1", params={"amount": 5})
        assert conflict.status_code == 409
        assert conflict.json()["error"] == "StartConflict"
        assert conflict.json()["saga_id"] == "o1"
        refunded = http.post("/orders/o2", params={"amount": 50})
        assert refunded.status_code == 409
        assert (refunded.json()["error"], refunded.json()["status"]) == ("SagaCompensated", "compensated")
        assert refunded.json()["reason"] == "no carrier for this address"
        assert http.get("/orders/nobody").status_code == 404
        assert http.get("/orders/o1").json() == {"order": "o1", "status": "completed"}

        # a synchronous caller in another process would do the same; the app's worker ends its sagas
        caller: ModuleType = importlib.import_module("caller")
        try:
            assert caller.place("o3", 7) == "T-1"
            assert caller.place("o3", 8) == "conflict"
        finally:
            caller.client.close()
