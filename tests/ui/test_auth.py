"""A UI served beyond the loopback asks who is reading: a bearer token, HTTP basic, or the
header of an authenticating proxy; ``saga ui`` refuses to serve there without one."""

from __future__ import annotations

import base64
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

import bus
from redsaga.cli.main import app as cli
from saga.ops.ui import UiAuth, allowed_hosts, create_app

pytestmark = pytest.mark.anyio
TOKEN = "a-token-of-at-least-16-chars"


async def _status(redis: bus.Redis, auth: UiAuth, headers: dict[str, str]) -> int:
    ui = create_app(redis, allowed_hosts=allowed_hosts("0.0.0.0"), auth=auth)  # noqa: S104 - the exposed case
    async with httpx.AsyncClient(transport=httpx.ASGITransport(ui), base_url="http://ui.example") as client:
        response = await client.get("/stats", headers=headers)
    if response.status_code == 401:
        assert "WWW-Authenticate" in response.headers
        assert "saga" not in response.text.lower()  # nothing of the data
    return response.status_code


def _basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


@pytest.mark.parametrize(
    ("auth", "headers", "status"),
    [
        (UiAuth(token=TOKEN), {}, 401),
        (UiAuth(token=TOKEN), {"Authorization": f"Bearer {TOKEN}"}, 200),
        (UiAuth(token=TOKEN), {"Authorization": f"Bearer {TOKEN}x"}, 401),
        (UiAuth(token=TOKEN), _basic("ann", TOKEN), 401),
        (UiAuth(basic="ann:s3cret"), _basic("ann", "s3cret"), 200),
        (UiAuth(basic="ann:s3cret"), _basic("ann", "wrong"), 401),
        (UiAuth(basic="ann:s3cret"), {"Authorization": "Basic not-base64!"}, 401),
        (UiAuth(proxy_header="X-Forwarded-User"), {"X-Forwarded-User": "ann"}, 200),
        (UiAuth(proxy_header="X-Forwarded-User"), {}, 401),
        (UiAuth(), {}, 200),
    ],
    ids=[
        "bearer-none", "bearer-ok", "bearer-wrong", "bearer-basic", "basic-ok", "basic-wrong",
        "basic-garbled", "proxy-ok", "proxy-missing", "none",
    ],
)  # fmt: skip
async def test_a_request_reads_the_ui_only_as_its_auth_allows(
    fake_redis: bus.Redis, auth: UiAuth, headers: dict[str, str], status: int
) -> None:
    assert await _status(fake_redis, auth, headers) == status


def test_no_secret_is_shown() -> None:
    assert "secret" not in repr(UiAuth(token="short-but-secret", basic="ann:secret"))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "would show every saga's data to whoever reaches it"),
        (["--auth-token-file", "/nonexistent/token"], "/nonexistent/token cannot be read"),
        (["--auth-token-file", "{empty}"], "is empty"),
        (["--auth-token-file", "{short}"], "at least 16 characters"),
        (["--basic-auth-file", "{short}"], "must hold one line user:password"),
    ],
    ids=["no-auth-method", "unreadable-token", "empty-token", "short-token", "basic-without-colon"],
)
def test_saga_ui_beyond_the_loopback_refuses_to_start_without_authentication(
    args: list[str], message: str, tmp_path: Path
) -> None:
    (tmp_path / "empty").write_text("\n")
    (tmp_path / "short").write_text("short\n")
    args = [a.format(empty=tmp_path / "empty", short=tmp_path / "short") for a in args]
    result = CliRunner().invoke(
        cli, ["ui", "--host", "0.0.0.0", "--port", "0", "--redis-url", "redis://127.0.0.1:1/0", *args],  # noqa: S104
        env={"REDSAGA_UI_TOKEN": "", "REDSAGA_UI_TOKEN_FILE": "", "REDSAGA_UI_BASIC_FILE": ""},
    )  # fmt: skip
    assert result.exit_code == 1, result.output
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_saga_ui_without_authentication_on_purpose_warns_before_it_starts() -> None:
    result = CliRunner().invoke(
        cli, ["ui", "--host", "0.0.0.0", "--port", "0", "--redis-url", "redis://127.0.0.1:1/0", "--no-auth"],  # noqa: S104
        env={"REDSAGA_UI_TOKEN": "", "REDSAGA_UI_TOKEN_FILE": "", "REDSAGA_UI_BASIC_FILE": ""},
    )  # fmt: skip
    first, *rest = result.stderr.strip().splitlines()
    assert first == "warning: the UI on 0.0.0.0 asks for no authentication (--no-auth)"
    assert result.exit_code == 1, result.output  # it then needs Redis, which is not there
    assert len(rest) == 1
