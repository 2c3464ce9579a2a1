"""Postgres: the single source of truth for runs, the journal, waits, clocks and the run DAG."""
