"""The ``saga`` command-line interface (typer)."""
