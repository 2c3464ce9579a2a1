"""Producer calls on an existing run: read it, cancel it, answer its waits, resume it.

``RunControl`` is built with the producer's session (``producer.session``), and
``producer.queue.AsyncQueue`` delegates to it. Every call that reads or changes a run first
reads it through the session's ``authorized``, so a producer acts only on runs its scopes
cover. Postgres decides each change; the wake published after the commit is a hint that
never fails the call (the lost-wake sweep covers a lost one). An answer or resume whose
first try committed but whose reply was lost is recognised by its own journal record, so
retrying it is not reported as a refusal.
"""

from __future__ import annotations

from typing import Any

import psycopg

from runfleet.broker.wake_reasons import WakeReason
from runfleet.producer.session import ProducerSession
from runfleet.store import journal_records as jr
from runfleet.store.errors import (
    CancelRequestFailed,
    InvalidInput,
    Unavailable,
)
from runfleet.store.journal import Kind
from runfleet.store.transient import is_transient
from runfleet.store.types import (
    CancelOutcome,
    CancelRequested,
    EventAnswer,
    EventCompleted,
    WaitingReason,
)
from runfleet.store.waits import token_hash


class RunControl:
    """A producer's calls on an existing run, built with its ``ProducerSession``
    (``producer.queue.AsyncQueue`` delegates to one)."""

    def __init__(self, session: ProducerSession) -> None:
        self._session = session

    async def cancel(self, run_id: str, *, actor: str | None = None) -> CancelOutcome:
        """Durably request cancellation of the logical run (every round of its lineage),
        then tell the owners by publish (a hint).

        A write that fails for the whole retry budget is CancelRequestFailed with
        ``retryable`` set (nothing was recorded: ask again), never a raw driver error.
        """
        await self._session.authorized(run_id)
        try:
            outcome = await self._session.available(
                lambda: self._session.store.lifecycle.request_cancel(run_id, note=actor)
            )
        except psycopg.errors.InsufficientPrivilege:
            raise  # the caller's role may not cancel this run: its error, not a failed write
        except (Unavailable, psycopg.Error) as exc:
            retryable = isinstance(exc, Unavailable) or is_transient(exc)
            raise CancelRequestFailed(
                run_id, "cancel_request_failed", repr(exc), retryable=retryable
            ) from exc
        targets, known = [run_id], {}
        if isinstance(outcome, CancelRequested):
            targets = list(dict.fromkeys([*outcome.rounds, *outcome.cascaded])) or [run_id]
            known = {outcome.row.id: outcome.row}  # as the request left it: no second read
        for target in targets:  # each closes through its own cancel path, promptly
            await self._session.notifier.publish_cancel(target)
            await self._session.hint(target, WakeReason.CANCEL, known.get(target))
        return outcome

    async def interrupt_unsafe(self, run_id: str) -> None:
        """Refused: runfleet has one cancellation path, ``cancel``, durable and cascading.

        Forcing a run to stop without its compensations and without the cascade
        to its children would leave exactly the half-done state this system exists
        to prevent, so the call always fails with ``unsafe_interrupt_unsupported``.
        """
        raise CancelRequestFailed(
            run_id,
            "unsafe_interrupt_unsupported",
            "use cancel(): it is durable, runs compensations and cascades to attached children",
        )

    async def complete(
        self, run_id: str, name: str, value: Any = None, *, actor: str | None = None
    ) -> EventAnswer:
        """Complete the event ``name`` a run waits for (first writer wins).

        Answers what stands (``store.types.EventAnswer``): EventCompleted (this value),
        EventExisting (an earlier answer; ``same`` when it has this value's digest, as a
        retry after a lost reply finds its own commit), EventTimedOut or EventRunSettled.
        It is truthy exactly when the event holds this value, so ``if q.complete(...)``
        still reads "my answer is the answer".

        Only ``ctx.wait_for`` events: an approval, a child, a timer or a quota is
        ``NotAnswerable`` (nothing written). The journal names the database role that
        answered and the digest of the value that won; ``actor`` is kept as a note.
        """
        row = await self._session.authorized(run_id)  # a run waiting on an event has started
        done = await self._session.available(
            lambda: self._session.store.deferreds.answer_event(run_id, name, value, note=actor)
        )
        if isinstance(done, EventCompleted) and done.woke:
            await self._session.hint(run_id, WakeReason.EVENT, row)
        return done

    async def approve(
        self, run_id: str, token: str, value: Any = None, *, actor: str, reason: str | None = None
    ) -> None:
        await self._answer(run_id, token, True, value, actor, reason)

    async def deny(
        self, run_id: str, token: str, value: Any = None, *, actor: str, reason: str | None = None
    ) -> None:
        await self._answer(run_id, token, False, value, actor, reason)

    async def _answer(
        self, run_id: str, token: str, approved: bool, value: Any, actor: str, reason: str | None
    ) -> None:
        row = await self._session.authorized(run_id)  # a run waiting for an approval has started
        retried: list[BaseException] = []
        done = await self._session.available(
            lambda: self._session.store.deferreds.answer_approval(
                run_id, token, approved=approved, value=value, actor=actor, reason=reason
            ),
            retried=retried,
        )
        if done is None and retried and await self._journaled(run_id, token, actor, approved):
            return  # the first try committed; its answer was lost with the connection
        if done is None:
            raise InvalidInput("token", f"run {run_id!r} is not waiting for an approval with it")
        if done.woke:
            await self._session.hint(run_id, WakeReason.APPROVAL, row)

    async def resume(
        self,
        run_id: str,
        *,
        accept_recorded: bool = False,
        rerun_step: str | None = None,
        actor: str | None = None,
    ) -> None:
        """Move a quarantined run on: trust its recorded outputs, or re-run one step.

        A run parked ``dead`` (a poison run: its executions kept ending in a lost process)
        takes neither option: its wait is cleared and its recoveries in a row start again
        (``runfleet resume RUN``); the body re-runs from its last recorded step.
        """
        row = await self._session.authorized(run_id)  # a quarantined or dead run has started
        retried: list[BaseException] = []
        if row.waiting is not None and row.waiting.reason == WaitingReason.DEAD:
            if accept_recorded or rerun_step is not None:
                raise InvalidInput(
                    "resume", f"run {run_id!r} is parked dead: resume it without options"
                )
            revived = await self._session.available(
                lambda: self._session.store.runs.revive(run_id, note=actor), retried=retried
            )
            if revived is None and not (retried and await self._revived(run_id, actor)):
                raise InvalidInput("run_id", f"run {run_id!r} is not parked dead")
            await self._session.hint(run_id, WakeReason.RESUME, row)
            return
        if not accept_recorded and rerun_step is None:
            if row.waiting is None or row.waiting.reason != WaitingReason.QUARANTINE:
                raise InvalidInput("run_id", f"run {run_id!r} is not quarantined or parked dead")
            raise InvalidInput(
                "resume",
                f"run {run_id!r} is quarantined: choose exactly one of accept_recorded or "
                "rerun_step (only a run parked dead is resumed without either)",
            )
        resumed = await self._session.available(
            lambda: self._session.store.steps.resume_quarantined(
                run_id, accept_recorded=accept_recorded, rerun_key=rerun_step, note=actor
            ),
            retried=retried,
        )
        if not resumed and not (retried and await self._resumed(run_id, rerun_step, actor)):
            raise InvalidInput("run_id", f"run {run_id!r} is not quarantined")
        await self._session.hint(run_id, WakeReason.RESUME, row)

    async def _last_record(self, run_id: str, *kinds: str) -> jr.Decoded | None:
        """The run's newest journal record of one of ``kinds``, decoded (None: there is none)."""
        found = await self._session.available(
            lambda: self._session.store.journal.last_of(run_id, kinds)
        )
        return None if found is None else jr.decode(found.kind, found.payload)

    async def _journaled(self, run_id: str, token: str, actor: str, approved: bool) -> bool:
        """Whether the run's last decision is this one (a retried answer's own commit)."""
        last = await self._last_record(run_id, Kind.APPROVAL_APPROVED, Kind.APPROVAL_DENIED)
        wanted = jr.ApprovalApproved if approved else jr.ApprovalDenied
        return isinstance(last, wanted) and last.token == token_hash(token) and last.note == actor

    async def _revived(self, run_id: str, actor: str | None) -> bool:
        """Whether the run's last resume is this one from dead (a retried resume's commit)."""
        last = await self._last_record(run_id, Kind.RESUMED)
        return (
            isinstance(last, jr.Resumed)
            and last.from_state is jr.ResumedFrom.DEAD
            and last.note == actor
        )

    async def _resumed(self, run_id: str, rerun_step: str | None, actor: str | None) -> bool:
        """Whether the run's last resume is this one (a retried resume's own commit)."""
        last = await self._last_record(run_id, Kind.RESUMED)
        return (
            isinstance(last, jr.Resumed)
            and last.from_state is jr.ResumedFrom.QUARANTINE
            and last.rerun_step == rerun_step
            and last.note == actor
        )
