"""The errors of human-task actions (drawn in ``saga/errors/__init__.py``'s tree)."""

from __future__ import annotations

from saga.errors._base import SagaError


class TaskError(SagaError):
    """A human-task action was refused; ``task`` names the task. Nothing was written."""

    def __init__(self, message: str, *, task: str) -> None:
        super().__init__(message)
        self.task = task


class TaskNotFound(TaskError):
    """No task has this id (in the contexts this client knows)."""

    def __init__(self, task: str) -> None:
        super().__init__(f"no task with id {task!r}", task=task)


class TaskAlreadyClaimed(TaskError):
    """Another person holds the task's claim until ``until_ms`` (Unix ms)."""

    def __init__(self, task: str, *, holder: str, until_ms: int) -> None:
        super().__init__(f"task {task!r} is claimed by {holder!r} until {until_ms} ms", task=task)
        self.holder = holder
        self.until_ms = until_ms


class TaskClosed(TaskError):
    """The task is no longer open: it was completed, withdrawn or failed (``state``)."""

    def __init__(self, task: str, *, state: str) -> None:
        super().__init__(f"task {task!r} is {state}", task=task)
        self.state = state


class NotAuthorized(TaskError):
    """``by`` may not ``action`` the task (the application's authorizer said no)."""

    def __init__(self, task: str, *, by: str, action: str) -> None:
        super().__init__(f"{by!r} may not {action} task {task!r}", task=task)
        self.by = by
        self.action = action


class InvalidAnswer(TaskError):
    """The answer does not match the task's form ``form``; ``reason`` says where."""

    def __init__(self, task: str, *, form: str, reason: str) -> None:
        super().__init__(f"answer to task {task!r} is not a valid {form}: {reason}", task=task)
        self.form = form
        self.reason = reason
