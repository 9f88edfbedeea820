"""The root of the saga engine's error tree (drawn in ``saga/errors/__init__.py``)."""


class SagaError(Exception):
    """Base class of the saga engine's errors."""

    retryable: bool = False
