"""Loading the user's app or saga from a ``module:attribute`` reference."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any

from redsaga.cli._common import CommandError
from saga import App


def load_object(reference: str) -> Any:
    """Import ``module:attribute`` (the current directory is importable, like ``python -m``)."""
    module_name, _, attribute = reference.partition(":")
    if not module_name or not attribute:
        raise CommandError(f"{reference!r} is not 'module:attribute' (e.g. redsaga.examples.all:app)")
    cwd = str(Path.cwd())
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise CommandError(f"cannot import {module_name!r}: {error}") from error
    try:
        return getattr(module, attribute)
    except AttributeError:
        raise CommandError(f"module {module_name!r} has no attribute {attribute!r}") from None


def load_app(reference: str) -> App:
    """The :class:`saga.App` named ``module:attribute`` (an error when it is something else)."""
    loaded = load_object(reference)
    if not isinstance(loaded, App):
        raise CommandError(f"{reference} is a {type(loaded).__name__}, not a saga.App")
    return loaded
