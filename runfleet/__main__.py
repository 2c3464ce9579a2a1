"""``python -m runfleet``: the ``runfleet`` command line."""

from runfleet.ops.cli.app import main

main()
