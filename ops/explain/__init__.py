"""Why a run is where it is, and what happens next: the operator's ``runfleet explain``.

``report`` gathers the facts and writes the explanation, ``predict`` says what the fleet
will do next from the rules the driver and the sweeps follow, ``journal_text`` turns
journal records into sentences. The CLI and the dashboard both print what these return.
"""
