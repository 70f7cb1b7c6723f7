"""Prometheus metrics (prometheus_client), one registry per daemon.

Counters count events as they happen; the gauges (running, queued, held tasks, open
connections, event subscribers) are read from the daemon when scraped, by a custom collector,
so nothing has to keep them in step.  No per-uid labels: one uid's activity is not another's
business, and labels by uid would grow without bound.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

__all__ = ["CONTENT_TYPE", "Metrics"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class _Gauges(Collector):
    def __init__(self, read: Callable[[], dict[str, tuple[str, float]]]) -> None:
        self._read = read

    def collect(self) -> Iterator[Metric]:
        for name, (doc, value) in self._read().items():
            yield GaugeMetricFamily(name, doc, value=value)


class Metrics:
    def __init__(self, gauges: Callable[[], dict[str, tuple[str, float]]]) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.submitted = Counter("corral_tasks_submitted", "Tasks accepted",
                                 registry=self.registry)
        self.finished = Counter("corral_tasks_finished", "Tasks that ended, by outcome",
                                ["outcome"], registry=self.registry)
        self.requests = Counter("corral_http_requests", "Requests answered, by verb and "
                                "status", ["verb", "status"], registry=self.registry)
        self.shed = Counter("corral_connections_shed", "Connections closed by the daemon, by "
                            "reason", ["reason"], registry=self.registry)
        self.shed_rate = self.shed.labels(reason="connection_rate")  # (hot in a flood)
        self.retention_passes = Counter("corral_retention_passes", "Retention passes made",
                                        registry=self.registry)
        self.expired = Counter("corral_tasks_expired", "Finished tasks retention removed",
                               registry=self.registry)
        self.offloaded = Counter("corral_offloaded_jobs", "Work moved off the event loop to "
                                 "the offload thread (a large request's, or one of many "
                                 "variables), by step", ["step"], registry=self.registry)
        self.registry.register(_Gauges(gauges))

    def render(self) -> bytes:
        return generate_latest(self.registry)
