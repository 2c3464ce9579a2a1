-- runfleet schema v6: retention walks settled runs oldest first (store/sql/retention.sql).
-- A partial index over exactly those rows keeps each batch an index scan bounded by the
-- batch, however many open runs sit in the table.
CREATE INDEX runs_settled_idx ON runfleet.runs (updated_at_ms, id)
    WHERE status IN ('completed', 'failed', 'cancelled');
