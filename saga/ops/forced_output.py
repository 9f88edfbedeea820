"""The output an operator gives a step they force-complete, checked before anything is sent.

``saga force-complete`` takes the output as an object or its JSON; :func:`json_output` makes
it JSON for a step the definition has, and :func:`typed_output` checks it against the step's
output type: decoded as the type when the code is at hand, else against the JSON schema the
definition's shape registered. Each raises :class:`~saga.errors.InvalidInput` saying what is
wrong.
"""

from __future__ import annotations

from typing import Any

import msgspec

from saga.core.model import SagaState
from saga.core.states import StepStatus
from saga.definition.human_tasks import ANSWER_SUFFIX
from saga.definition.saga import Saga
from saga.definition.shape import Shape
from saga.errors import InvalidInput

_json = msgspec.json.Encoder()


def task_answer(state: SagaState, step_name: str, output: object, *, by: str) -> tuple[str, object]:
    """The step and output to force for ``step_name``: a human task's answer, or as given.

    A saga waiting on human task ``approve`` waits on its ``approve.answer`` signal for a
    ``TaskResult``; forcing ``approve`` with the form's answer forces that wait with the
    answer, recorded as given by ``by``.
    """
    wait = state.wait
    if wait is None or wait.kind != "signal" or wait.step != f"{step_name}{ANSWER_SUFFIX}":
        return step_name, output
    if isinstance(output, bytes | str):
        try:
            output = msgspec.json.decode(output)
        except msgspec.DecodeError as error:
            raise InvalidInput(f"the output is not valid JSON: {error}") from error
    return wait.step, {"answer": output, "by": by, "outcome": "answered"}


def json_output(shape: Shape, step_name: str, output: object) -> msgspec.Raw:
    """The output as JSON, for a step of ``shape``'s definition (:class:`InvalidInput` if not)."""
    try:
        shape.step_named(step_name)
    except KeyError:
        names = ", ".join(s.name for s in shape.steps)
        raise InvalidInput(f"unknown step {step_name!r} in {shape.key} (steps: {names})") from None
    if not isinstance(output, bytes | str):
        return msgspec.Raw(_json.encode(output))
    raw = output.encode() if isinstance(output, str) else output
    try:
        msgspec.json.decode(raw)
    except msgspec.DecodeError as error:
        raise InvalidInput(f"the output is not valid JSON: {error}") from error
    return msgspec.Raw(raw)


def typed_output(
    definition: Saga[Any] | None, shape: Shape, state: SagaState, step_name: str, raw: msgspec.Raw
) -> bytes:
    """The output as canonical JSON, checked against the step's output type.

    With the code, decoded as the type; without it, checked against the type's registered
    JSON schema. A failed compensation takes any JSON. :class:`InvalidInput` says what is
    wrong, before anything is sent.
    """
    shaped = shape.step_named(step_name)
    record = state.branches.get(step_name) if "#" in step_name else state.steps.get(shaped.name)
    if record is not None and record.status in (StepStatus.COMPENSATION_FAILED, StepStatus.CONFIRM_FAILED):
        return _json.encode(msgspec.json.decode(raw))
    if shaped.output is None:
        if msgspec.json.decode(raw) is not None:
            raise InvalidInput(f"{shape.key}.{shaped.name} has no output: give null")
        return b"null"
    if definition is None:
        try:
            return _json.encode(shaped.output.check(msgspec.json.decode(raw)))
        except ValueError as error:
            raise InvalidInput(
                f"the output is not a valid {shaped.output.name} for {shape.key}.{shaped.name}: {error}"
            ) from error
    step = definition.step_named(step_name)
    assert step.output_type is not None  # noqa: S101 - the shape of this very definition has one
    try:
        typed = msgspec.json.decode(raw, type=step.output_type)
    except msgspec.ValidationError as error:
        name = getattr(step.output_type, "__name__", str(step.output_type))
        raise InvalidInput(
            f"the output is not a valid {name} for {definition.key}.{step.name}: {error}"
        ) from error
    return _json.encode(typed)
