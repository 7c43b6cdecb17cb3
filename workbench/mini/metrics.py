"""The mini server's ``/metrics``: its queue, its requests and tokens, and its KV pool, in a
private :class:`CollectorRegistry` (one per server; the global registry is never touched).

Names (docs/server.md lists them): ``workbench_server_queue_depth``,
``workbench_server_running_requests``, ``workbench_server_admitted_requests``,
``workbench_server_queue_capacity``, ``workbench_server_prompt_tokens_total``,
``workbench_server_generation_tokens_total``, ``workbench_server_rejected_total``,
``workbench_server_responses_total{code}`` and the pool's ``workbench_kv_*_bytes{pool}``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CONTENT_TYPE_LATEST, Counter, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import CollectorRegistry

from workbench.observe.metrics import CallbackCollector, kv_families


class ServerMetrics:
    def __init__(self, gauges: Callable, admitted: Callable[[], int], capacity: int):
        """``gauges()``: the engine loop's latest LoopGauges; ``admitted()``: requests in
        flight."""
        self.registry = reg = CollectorRegistry(auto_describe=False)
        self.gauges, self.admitted, self.capacity = gauges, admitted, capacity
        self.prompted = Counter("workbench_server_prompt_tokens", "Prompt tokens admitted.",
                                registry=reg)
        self.generated = Counter("workbench_server_generation_tokens", "Tokens generated.",
                                 registry=reg)
        self.rejected = Counter("workbench_server_rejected",
                                "Requests refused with 503 because the queue was full.",
                                registry=reg)
        self.responses = Counter("workbench_server_responses", "Responses by HTTP status.",
                                 ["code"], registry=reg)
        reg.register(CallbackCollector(self._live))
        self.content_type = CONTENT_TYPE_LATEST

    def _live(self) -> Iterator[Metric]:
        g = self.gauges()
        for name, doc, value in (
            ("workbench_server_queue_depth", "Requests waiting for the engine.", g.waiting),
            ("workbench_server_running_requests", "Requests in the running batch.", g.running),
            ("workbench_server_admitted_requests", "Requests admitted and not yet finished.",
             self.admitted()),
            ("workbench_server_queue_capacity", "Most requests admitted at once.",
             self.capacity),
        ):
            yield GaugeMetricFamily(name, doc, value=float(value))
        yield from kv_families([g.pool] if g.pool is not None else [])

    def answered(self, code: int) -> None:
        self.responses.labels(code=str(code)).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
