"""The worker's Prometheus metrics, also exported through OpenTelemetry.

Off by default and free when off: with ``Settings.otel`` unset nothing here runs and
nothing from OpenTelemetry is imported; the metrics code (``worker.metrics``) is the same
either way, so a counted event costs exactly what it costs without OpenTelemetry. With
``RUNFLEET_OTEL=1`` the worker calls ``enable`` at start, which registers one
*observable* OpenTelemetry instrument per runfleet metric on the global meter provider
the application configured (a provider of the ``otel`` extra's SDK with its readers and
exporters; without one the API's meter does nothing). Nothing is recorded twice and
nothing runs per event: the instruments' callbacks read the Prometheus values when the
provider's reader collects (its export interval), so the cost when on is one read of
each metric per collection.

The mapping keeps Prometheus's names and labels (as attributes):

- a counter ``runfleet_x_total`` is an ``ObservableCounter`` ``runfleet_x`` (cumulative,
  monotonic; an OpenTelemetry-to-Prometheus exporter adds ``_total`` back);
- a gauge ``runfleet_x`` is an ``ObservableGauge`` ``runfleet_x``;
- a histogram ``runfleet_x`` is three ``ObservableCounter``s, as Prometheus exposes it:
  ``runfleet_x_count``, ``runfleet_x_sum`` and ``runfleet_x_bucket`` (attribute ``le``:
  the cumulative count per upper bound, ``+Inf`` last). The SDK has no observable
  histogram, and recording each event twice would cost when on what it saves here.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING

from prometheus_client import Counter, Gauge, Histogram

if TYPE_CHECKING:
    from opentelemetry.metrics import CallbackOptions, Meter, Observation

log = logging.getLogger("runfleet.worker.metrics")

METER_NAME = "runfleet"

Metric = Counter | Gauge | Histogram


@dataclass(frozen=True, slots=True)
class Bridged:
    """One OpenTelemetry instrument and the Prometheus samples it reports."""

    instrument: str
    kind: str
    """``counter`` or ``gauge`` (the OpenTelemetry instrument's kind)."""
    metric: Metric
    sample: str
    """The Prometheus sample name it reads (``runfleet_x_total``, ``runfleet_x_bucket`` ...)."""


BRIDGE: MetricsBridge | None = None
"""The process's bridge, or None (off)."""
_MADE: list[MetricsBridge] = []
"""Every bridge made: a meter's instruments cannot be removed, so each meter gets one."""
_DEFAULT: Meter | None = None
"""The global provider's ``runfleet`` meter, asked for once. Asked before the application
sets its provider, the API answers a proxy that hands its instruments to the provider's
meter once one is set; asked again after, it answers that real meter, and a second bridge
on it would register the same instrument names, which the SDK keeps from the first
registration (the proxy's, by then inactive): nothing would be reported. One meter for
every default ``enable`` (a second worker in the process) keeps one bridge."""


def _modules() -> list[ModuleType]:
    import runfleet.worker.metrics as metrics
    from runfleet.broker import hostile

    return [metrics, hostile]


def runfleet_metrics(modules: Iterable[ModuleType] | None = None) -> list[Metric]:
    """Every Prometheus metric runfleet defines (``docs/reference/metrics.md``)."""
    found: list[Metric] = []
    for module in _modules() if modules is None else modules:
        for value in vars(module).values():
            if isinstance(value, Counter | Gauge | Histogram) and value not in found:
                found.append(value)
    return found


def _family(metric: Metric) -> str:
    # prometheus_client keeps a metric's name private; collect() names the family.
    (family,) = metric.collect()
    return family.name


def bridged(metric: Metric) -> list[Bridged]:
    """The instruments one Prometheus metric becomes (the table above)."""
    family = _family(metric)
    match metric:
        case Counter():
            return [Bridged(family, "counter", metric, f"{family}_total")]
        case Gauge():
            return [Bridged(family, "gauge", metric, family)]
        case Histogram():
            return [
                Bridged(f"{family}_{part}", "counter", metric, f"{family}_{part}")
                for part in ("count", "sum", "bucket")
            ]
    raise TypeError(f"not a runfleet metric: {metric!r}")  # pragma: no cover - typed above


def samples(b: Bridged) -> Iterator[tuple[float, dict[str, str]]]:
    """The values ``b`` reports now, with their labels."""
    for family in b.metric.collect():
        for sample in family.samples:
            if sample.name == b.sample:
                yield sample.value, dict(sample.labels)


class MetricsBridge:
    """The observable instruments of one meter (one per ``Bridged``)."""

    def __init__(self, meter: Meter, metrics: Iterable[Metric]) -> None:
        from opentelemetry.metrics import Observation

        self.meter = meter
        self.active = True
        self.instruments: list[Bridged] = [b for m in metrics for b in bridged(m)]
        for b in self.instruments:
            callback = self._callback(b, Observation)
            if b.kind == "counter":
                meter.create_observable_counter(b.instrument, callbacks=[callback])
            else:
                meter.create_observable_gauge(b.instrument, callbacks=[callback])

    def _callback(
        self, b: Bridged, observation: type[Observation]
    ) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def observe(_options: CallbackOptions) -> Iterable[Observation]:
            if not self.active:
                return []
            return [observation(value, labels) for value, labels in samples(b)]

        return observe


def enable(meter: Meter | None = None) -> MetricsBridge:
    """Export runfleet's metrics through ``meter`` (default: the global provider's
    ``runfleet`` meter), once per meter; ImportError names the extra."""
    global BRIDGE, _DEFAULT
    try:
        from opentelemetry import metrics as otel_metrics
    except ImportError as exc:
        raise ImportError(
            "RUNFLEET_OTEL needs OpenTelemetry: pip install 'runfleet[otel]'"
        ) from exc
    if meter is None:
        if _DEFAULT is None:
            _DEFAULT = otel_metrics.get_meter(METER_NAME)
        meter = _DEFAULT
    for made in _MADE:
        made.active = made.meter is meter  # one meter reports at a time
    found = next((made for made in _MADE if made.meter is meter), None)
    if found is None:
        found = MetricsBridge(meter, runfleet_metrics())
        _MADE.append(found)
    BRIDGE = found
    return found


def disable() -> None:
    """Stop reporting (the instruments stay registered with their meter, and say nothing)."""
    global BRIDGE
    for made in _MADE:
        made.active = False
    BRIDGE = None
