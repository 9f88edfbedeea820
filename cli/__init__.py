"""The ``saga`` command line (typer)."""
