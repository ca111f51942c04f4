"""The gateway's Prometheus metrics: requests it holds and refuses (limits.py), and the executors' places it
mirrors (replica_room.py). With no registry (monitoring off) every method is a no-op."""

from __future__ import annotations

#: name -> (type, labels, help), for the docs' reference
METRICS = {
    'clipserve_gateway_requests_in_flight': ('gauge', (), 'Requests the gateway holds (HTTP, gRPC calls, WebSockets)'),
    'clipserve_gateway_refused': ('counter', ('protocol', 'limit'), 'Requests the gateway refused, by limit'),
    'clipserve_gateway_executor_places': (
        'gauge',
        ('executor',),
        "Places for large requests the gateway mirrors per executor: its answering replicas' max_requests together",
    ),
    'clipserve_gateway_executor_requests': (
        'gauge',
        ('executor',),
        'Large requests the gateway has in flight per executor; past its places the gateway refuses them itself',
    ),
}


class GatewayMetrics:
    def __init__(self, registry=None):
        self.enabled = registry is not None
        if self.enabled:
            from prometheus_client import Counter, Gauge

            kinds = {'gauge': Gauge, 'counter': Counter}
            self._m = {
                name: kinds[kind](name, text, labels, registry=registry)
                for name, (kind, labels, text) in METRICS.items()
            }

    def watch(self, in_flight) -> None:
        """The gauge of requests in flight reads `in_flight.count` (limits.InFlight) when scraped."""
        if self.enabled:
            self._m['clipserve_gateway_requests_in_flight'].set_function(lambda: in_flight.count)

    def refused(self, protocol: str, limit: str) -> None:
        if self.enabled:
            self._m['clipserve_gateway_refused'].labels(protocol, limit).inc()

    def executor_room(self, executor: str, places: int | None = None, held: int | None = None) -> None:
        if self.enabled:
            if places is not None:
                self._m['clipserve_gateway_executor_places'].labels(executor).set(places)
            if held is not None:
                self._m['clipserve_gateway_executor_requests'].labels(executor).set(held)
