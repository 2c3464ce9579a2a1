"""The servers only the test suites start: a Patroni cluster (tests/ha) and TLS-only
Postgres and Redis (tests/tls), built on ``runfleet.ops.servers``' throwaways. Not in the
wheel: the demo and ``runfleet bench capacity`` need only the plain throwaways."""
