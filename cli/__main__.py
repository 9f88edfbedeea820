"""``python -m redsaga.cli``: the same as the ``saga`` command."""

from redsaga.cli.main import main

main()
