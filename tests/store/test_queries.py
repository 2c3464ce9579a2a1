"""The named SQL blocks as sent: compacted (store/queries.py), nothing of the SQL lost."""

from __future__ import annotations

import re

from psycopg import _queries

from runfleet.store.queries import _all, compact, q, written


def test_comments_and_layout_go_and_the_first_line_of_the_documentation_stays() -> None:
    body = """
    -- Names the statement.
    -- More documentation, not sent.
    SELECT a,   -- a trailing comment
           b

      FROM t  -- another
     WHERE c = %(c)s;
    """
    assert compact(body) == "-- Names the statement.\nSELECT a,\nb\nFROM t\nWHERE c = %(c)s;"


def test_what_looks_like_a_comment_inside_a_literal_or_an_identifier_is_kept() -> None:
    body = """SELECT '-- not a comment', 'it''s -- still', "odd -- name"
      FROM t WHERE s.query ~ '^-- (How long)'  -- the run's own comment: it's dropped
    """
    assert compact(body) == (
        "SELECT '-- not a comment', 'it''s -- still', \"odd -- name\"\n"
        "FROM t WHERE s.query ~ '^-- (How long)'"
    )


def test_a_literal_spanning_lines_keeps_its_layout() -> None:
    body = "SELECT 'one\n    two' AS x,\n    'three'"
    assert compact(body) == "SELECT 'one\n    two' AS x,\n'three'"


def test_a_dollar_quoted_body_is_kept_byte_for_byte() -> None:
    inner = "$$\nDECLARE\n    x int;  -- kept: PL/pgSQL's own\nBEGIN\n    NULL;\nEND\n$$"
    body = f"-- A block.\n-- more\nDO {inner};\n"
    assert compact(body) == f"-- A block.\nDO {inner};"


def test_no_block_loses_sql() -> None:
    """Outside comments and whitespace each compacted block has the file's text: strip both
    of every comment line and all whitespace (crudely: no block's SQL has ``--`` in a
    literal except bench.limits_counters') and they must be equal."""

    def bare(text: str) -> str:
        return re.sub(r"\s+", "", re.sub(r"--(?! \(How long)[^\n]*", "", text))

    blocks = written()
    for name, body in blocks.items():
        assert bare(q(name)) == bare(body), name
    assert blocks.keys() == _all().keys()


def test_the_claim_a_worker_sends_for_every_delivery_fits_psycopgs_conversion_cache() -> None:
    """psycopg converts ``%(name)s`` placeholders again at every call for a query longer
    than its cache's limit (4 KB): the per-delivery claim must stay under it."""
    limit = _queries.MAX_CACHED_STATEMENT_LENGTH
    for name in ("runs.claim_if_fresh", "runs.claim_and_activate", "admit.one", "admit.batch"):
        assert len(q(name).encode()) <= limit, name


def test_the_first_line_names_the_statement_where_operators_read_it() -> None:
    # tests/retention/test_scale.py finds the prune in pg_stat_activity by it
    assert q("retention.prune_batch").startswith("-- One batch: scan up to")
    assert "\n--" not in q("runs.claim_if_fresh")
