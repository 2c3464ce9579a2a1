"""``runfleet dashboard``: a server-rendered web UI over the same answers the CLI prints."""
