"""rq's job registries for runfleet queues, each a read of the run rows in Postgres.

``StartedJobRegistry``, ``FinishedJobRegistry``, ``FailedJobRegistry``,
``DeferredJobRegistry``, ``ScheduledJobRegistry``, ``CanceledJobRegistry``: one class,
``BaseRegistry``, parameterised by the registry it reads (``RegistryKind``); rq's names pin
the kind (``class StartedJobRegistry(BaseRegistry, kind=...)``), and only the scheduled and
failed ones add calls of their own. rq's constructor (``name``, ``connection``, ``queue``),
``get_job_ids``, ``count``, ``len``, ``in``, ``==``. Nothing is added to or removed from
them by hand (rq's ``add``/``remove`` have no meaning here): a run is in the registry its
status puts it in (store/registries.py, store/sql/registries.sql).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, ClassVar

from runfleet.rqface.connection import Connection
from runfleet.rqface.jobs import Job, NoSuchJobError
from runfleet.rqface.rq_api import InvalidJobOperation
from runfleet.store.registries import Registries, RegistryEntry, RegistryKind


class BaseRegistry:
    """One rq registry of one queue; which one is the class's ``kind``."""

    kind: ClassVar[RegistryKind]

    def __init_subclass__(cls, *, kind: RegistryKind | None = None, **rest: Any) -> None:
        super().__init_subclass__(**rest)
        if kind is not None:
            cls.kind = kind

    def __init__(
        self,
        name: str = "default",
        connection: Connection | None = None,
        job_class: Any = None,
        queue: Connection | None = None,
        serializer: Any = None,
    ) -> None:
        if queue is not None:
            name = queue.name
            connection = connection or queue
        if connection is None:
            raise ValueError("a registry needs connection= (a runfleet Queue) or queue=")
        self.name = name
        self.connection = connection
        self._queue = queue

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"

    def __eq__(self, other: object) -> bool:
        return (
            type(other) is type(self)
            and isinstance(other, BaseRegistry)
            and other.name == self.name
            and other.connection.settings_key == self.connection.settings_key
        )

    def __hash__(self) -> int:
        return hash((type(self), self.name))

    def get_queue(self) -> Connection:
        return self._queue or self.connection.sibling(self.name)

    def _entries(self) -> list[RegistryEntry]:
        conn = self.connection
        scopes = conn._async.scopes

        async def read() -> list[RegistryEntry]:
            registries = Registries(conn._async.store)
            return await conn._async.session.available(
                lambda: registries.ids(self.kind, self.name, scopes)
            )

        return conn._call(read())

    def get_job_ids(self, start: int = 0, end: int = -1, desc: bool = False) -> list[str]:
        """Ids, oldest first; ``start``/``end`` inclusive, as rq's."""
        ids = [entry.rq_id for entry in self._entries()]
        if desc:
            ids.reverse()
        return ids[start:] if end < 0 else ids[start : end + 1]

    def get_jobs(self, start: int = 0, end: int = -1) -> list[Job]:
        found = Job.fetch_many(self.get_job_ids(start, end), connection=self.connection)
        return [j for j in found if j is not None]

    @property
    def count(self) -> int:
        return len(self._entries())

    def get_job_count(self, cleanup: bool = True) -> int:
        return self.count

    def __len__(self) -> int:
        return self.count

    def __contains__(self, item: object) -> bool:
        job_id = getattr(item, "id", item)
        return job_id in self.get_job_ids()

    def cleanup(self, timestamp: float | None = None) -> None:
        """rq's cleanup: nothing to do (rows are their own registries; retention prunes)."""


class StartedJobRegistry(BaseRegistry, kind=RegistryKind.STARTED):
    """Runs executing (or parked mid-run on a wait), dependencies met, no cancel asked."""


class FinishedJobRegistry(BaseRegistry, kind=RegistryKind.FINISHED):
    """Runs that completed (not handed off)."""


class DeferredJobRegistry(BaseRegistry, kind=RegistryKind.DEFERRED):
    """Open runs whose ``depends_on`` dependencies are not met yet."""


class CanceledJobRegistry(BaseRegistry, kind=RegistryKind.CANCELED):
    """Runs cancelled, or asked to be."""


class ScheduledJobRegistry(BaseRegistry, kind=RegistryKind.SCHEDULED):
    """Runs waiting for their ``enqueue_at``/``enqueue_in`` time."""

    def get_scheduled_time(self, job_or_id: Job | str) -> datetime:
        """When the job is due (UTC, whole seconds as rq's); NoSuchJobError if not here."""
        job_id = getattr(job_or_id, "id", job_or_id)
        for entry in self._entries():
            if entry.rq_id == job_id and entry.wake_at_ms is not None:
                return datetime.fromtimestamp(entry.wake_at_ms // 1000, UTC)
        raise NoSuchJobError(str(job_id))

    get_expiration_time = get_scheduled_time


class FailedJobRegistry(BaseRegistry, kind=RegistryKind.FAILED):
    """Failed runs of the queue not yet requeued."""

    def requeue(self, job_or_id: Job | str, at_front: bool = False) -> Job:
        """Run a failed job again: a new round of its run, read through the same id.
        InvalidJobOperation (rq's) if the job is not in this registry."""
        job_id = getattr(job_or_id, "id", job_or_id)
        conn = self.connection
        if job_id not in self.get_job_ids():
            Job.fetch(str(job_id), conn)  # NoSuchJobError if absent or not this producer's
            raise InvalidJobOperation(f"Job {job_id!r} is not failed: not in the failed registry")
        conn._call(conn._async.requeue(str(job_id), actor="failed_job_registry"))
        job = Job(conn, str(job_id))
        job.refresh()
        return job
