"""The Postgres and Redis that tests, the demo and the benches run against: found or started.

``resolve`` finds them (environment URLs, Docker compose, else throwaway local servers);
``throwaway`` is the lifecycle of a server started from local binaries on a free loopback
port, and ``postgres`` and ``redis`` are its kinds (with PgBouncer and a Redis Cluster);
the servers only the test suites start (Patroni, TLS) build on them in tests/servers/.
Never imported by a worker or a producer: this is test and demo tooling.
"""
