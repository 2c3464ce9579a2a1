"""The ``runfleet`` command line: ``app`` assembles the typer app from one module per group.

``common`` is what every command shares (connections, one-line errors, time and owner
text); the dashboard reuses it and the ``*_view`` functions of ``runs`` and ``fleet``, so
the web pages and ``--json`` answer with the same models (``ops.models``).
"""
