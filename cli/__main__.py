"""``python -m cli``: the same as the ``saga`` command."""

from cli.main import main

main()
