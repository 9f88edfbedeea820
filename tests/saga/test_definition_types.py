"""The decorator API's types, as a type checker sees them (mypy, strict, on a small program)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

PROGRAM = """
from typing import assert_type

import msgspec

from saga import Command, Saga, command
from saga.definition.step import Step


class Data(msgspec.Struct):
    n: int = 0


class Pong(msgspec.Struct, tag=True):
    n: int = 0


flow = Saga("typed", data=Data)
both = flow.parallel("both")


@flow.action()
async def step_action(data: Data) -> Pong:
    return Pong()


@both.action()
async def branch_action(data: Data) -> Pong:
    return Pong()


@both.step(reply=Pong)
def branch_command(data: Data) -> Command:
    return command("svc", Pong())


assert_type(step_action, Step[Data, Pong])
assert_type(branch_action, Step[Data, Pong])
assert_type(branch_command, Step[Data, Pong])
"""


def test_a_group_branch_keeps_its_output_type_as_a_step_does(tmp_path: Path) -> None:
    program = tmp_path / "typed.py"
    program.write_text(PROGRAM)
    # In a process of its own: mypy's in-process API raises the interpreter's recursion limit
    # for good, and the tests that feed the decoder deeply nested payloads rely on the default.
    checked = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--follow-imports=silent",
            "--cache-dir",
            str(tmp_path),
            str(program),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
