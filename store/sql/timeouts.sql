-- Step attempts that ran past their timeout (worker/authoring/step_timeouts.py records the error).

-- name: timed_out
SELECT key, attempt, started_at_ms, finished_at_ms, error FROM runfleet.attempts
 WHERE run_id = %(run_id)s AND error LIKE 'StepTimeout(%%'
 ORDER BY started_at_ms, key, attempt;
