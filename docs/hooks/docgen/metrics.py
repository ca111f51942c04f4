"""The metrics reference: every Prometheus metric clipserve registers, read from the collectors themselves.

Every class named `...Metrics` in the package (serving/replica/metrics.py's `Metrics`, serving/gateway/metrics.py's
`GatewayMetrics`, openai_routes.py's `OpenAIMetrics`, and any added later) is built with a fresh registry, as a replica or a
gateway builds it when monitoring is on; the page lists what that registry then holds: name, type, labels
and help text. Where a module also has a METRICS table, the tests check that it agrees.
"""

from __future__ import annotations

import importlib
import inspect
import re
from dataclasses import dataclass

from docgen.markdown import page, table
from docgen.settings import ROOT

CLASS = re.compile(r'^class (\w*Metrics)\b', re.MULTILINE)
SUFFIXES = {'counter': ('_total',), 'histogram': ('_bucket', '_sum', '_count'), 'summary': ('_sum', '_count')}
WHERE = {
    'clipserve.serving.replica.metrics': "executor (each replica's `port_monitoring`)",
    'clipserve.serving.gateway.metrics': 'gateway',
    'clipserve.serving.gateway.openai_routes': 'gateway (OpenAI-compatible routes)',
}


@dataclass(frozen=True)
class Metric:
    name: str
    kind: str
    labels: tuple[str, ...]
    help: str
    module: str
    cls: str

    @property
    def exposed(self) -> tuple[str, ...]:
        """The sample names Prometheus scrapes (a counter `x` is scraped as `x_total`)."""
        return tuple(self.name + s for s in SUFFIXES.get(self.kind, ('',)))


def metric_classes() -> list[tuple[str, str]]:
    """(module, class) of every `...Metrics` class under executors/clipserve."""
    found = []
    for path in sorted((ROOT / 'executors' / 'clipserve').rglob('*.py')):
        for name in CLASS.findall(path.read_text(encoding='utf-8')):
            module = '.'.join(path.relative_to(ROOT / 'executors').with_suffix('').parts)
            found.append((module, name))
    return found


def collect() -> list[Metric]:
    from prometheus_client import CollectorRegistry

    metrics = []
    for module_name, class_name in metric_classes():
        cls = getattr(importlib.import_module(module_name), class_name)
        if 'registry' not in inspect.signature(cls).parameters:
            continue
        registry = CollectorRegistry()
        cls(registry=registry)
        for collector in registry._collector_to_names:  # prometheus_client's own record of what it holds
            metrics.append(
                Metric(
                    collector._name,
                    collector._type,
                    tuple(collector._labelnames),
                    collector._documentation,
                    module_name,
                    class_name,
                )
            )
    return sorted(metrics, key=lambda m: (m.module, m.name))


INTRO = """With `monitoring: true` on an executor or the gateway (see `flows/monitoring.yml`), Jina serves Prometheus
metrics on its `port_monitoring`: Jina's own request metrics (counts and latencies per endpoint) and the ones
below. Every executor metric carries the labels `runtime_name` (the executor) and `model`.

```bash
curl -s http://127.0.0.1:9091/ | grep clipserve_     # flows/monitoring.yml: the encoder on 9091, the gateway on 9090
```
"""


def metrics_page() -> str:
    rows = [
        (
            ' '.join(f'`{n}`' for n in m.exposed),
            m.kind,
            ', '.join(f'`{label}`' for label in m.labels) or '-',
            WHERE.get(m.module, m.module),
            m.help,
        )
        for m in collect()
    ]
    source = ', '.join(f'{m}.{c}' for m, c in metric_classes())
    return page('Metrics', source, INTRO, table(('metric', 'type', 'labels', 'where', 'description'), rows))
