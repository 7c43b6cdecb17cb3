"""The mini server's ``/metrics``: its queue, its requests and tokens, its latencies and its KV
pool, in a private :class:`CollectorRegistry` (one per server; the global registry is never
touched).

Every series vLLM also exports has vLLM's name and its ``model_name`` label, so a vLLM dashboard
reads this server as it is: ``vllm:num_requests_running``, ``vllm:num_requests_waiting``,
``vllm:prompt_tokens_total``, ``vllm:generation_tokens_total``, ``vllm:kv_cache_usage_perc``
(a fraction, 1 = full, as vLLM's), ``vllm:num_preemptions_total``,
``vllm:request_success_total{finished_reason}``, ``vllm:prefix_cache_queries_total`` /
``vllm:prefix_cache_hits_total`` (tokens) and the latency histograms
``vllm:time_to_first_token_seconds``, ``vllm:time_per_output_token_seconds``,
``vllm:inter_token_latency_seconds`` and ``vllm:e2e_request_latency_seconds``. What vLLM has
no name for stays ``workbench_*``: ``workbench_server_admitted_requests``,
``workbench_server_queue_capacity``, ``workbench_server_rejected_total``,
``workbench_server_responses_total{code}`` and the pool's ``workbench_kv_*_bytes{pool}``
(docs/server.md lists them). No ``_created`` series.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CONTENT_TYPE_LATEST, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import CollectorRegistry

from workbench.observe.metrics import CallbackCollector, kv_families

# seconds; the tiny model on a CPU answers in milliseconds, an 8B model's long prompt in seconds
TTFT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
                30.0, 60.0)
TPOT_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
E2E_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


class _NoCreated:
    """A registry's families without the ``_created`` samples (a timestamp per series that
    dashboards never read and vLLM does not export)."""

    def __init__(self, registry: CollectorRegistry):
        self.registry = registry

    def collect(self) -> Iterator[Metric]:
        for fam in self.registry.collect():
            fam.samples = [s for s in fam.samples if not s.name.endswith("_created")]
            yield fam


class ServerMetrics:
    def __init__(self, gauges: Callable, admitted: Callable[[], int], capacity: int,
                 model: str = "model"):
        """``gauges()``: the engine loop's latest LoopGauges; ``admitted()``: requests in
        flight; ``model``: the ``model_name`` label of vLLM's series."""
        self.registry = reg = CollectorRegistry(auto_describe=False)
        self.gauges, self.admitted, self.capacity, self.model = gauges, admitted, capacity, model
        by_model = ["model_name"]
        self._prompted = Counter("vllm:prompt_tokens", "Prompt tokens admitted.", by_model,
                                 registry=reg)
        self._generated = Counter("vllm:generation_tokens", "Tokens generated.", by_model,
                                  registry=reg)
        self.prompted, self.generated = (self._prompted.labels(model),
                                         self._generated.labels(model))
        self.success = Counter("vllm:request_success", "Requests finished, by why they ended.",
                               ["model_name", "finished_reason"], registry=reg)
        self.rejected = Counter("workbench_server_rejected",
                                "Requests refused with 503 because the queue was full.",
                                registry=reg)
        self.responses = Counter("workbench_server_responses", "Responses by HTTP status.",
                                 ["code"], registry=reg)
        self.ttft = Histogram("vllm:time_to_first_token_seconds",
                              "Time from a request's arrival to its first output token.",
                              by_model, buckets=TTFT_BUCKETS, registry=reg)
        self.tpot = Histogram("vllm:time_per_output_token_seconds",
                              "Mean time between output tokens after the first, per request.",
                              by_model, buckets=TPOT_BUCKETS, registry=reg)
        self.itl = Histogram("vllm:inter_token_latency_seconds",
                             "The same per-request mean, under vLLM's newer name.",
                             by_model, buckets=TPOT_BUCKETS, registry=reg)
        self.e2e = Histogram("vllm:e2e_request_latency_seconds",
                             "Time from a request's arrival to its last output token.",
                             by_model, buckets=E2E_BUCKETS, registry=reg)
        reg.register(CallbackCollector(self._live))
        self.content_type = CONTENT_TYPE_LATEST

    def _gauge(self, name: str, doc: str, value: float) -> GaugeMetricFamily:
        fam = GaugeMetricFamily(name, doc, labels=["model_name"])
        fam.add_metric([self.model], float(value))
        return fam

    def _counter(self, name: str, doc: str, value: float) -> CounterMetricFamily:
        fam = CounterMetricFamily(name, doc, labels=["model_name"])
        fam.add_metric([self.model], float(value))
        return fam

    def _live(self) -> Iterator[Metric]:
        g = self.gauges()
        yield self._gauge("vllm:num_requests_running", "Requests in the running batch.",
                          g.running)
        yield self._gauge("vllm:num_requests_waiting", "Requests waiting for the engine.",
                          g.waiting)
        yield self._gauge("vllm:kv_cache_usage_perc", "KV-cache usage: blocks held over "
                          "blocks in the pool (1 = full).", g.kv_usage)
        yield self._counter("vllm:num_preemptions", "Requests preempted (recomputed later).",
                            g.preemptions)
        yield self._counter("vllm:prefix_cache_queries", "Prompt tokens looked up in the "
                            "prefix cache.", g.prefix_queries)
        yield self._counter("vllm:prefix_cache_hits", "Prompt tokens found in the prefix "
                            "cache.", g.prefix_hits)
        for name, doc, value in (
            ("workbench_server_admitted_requests", "Requests admitted and not yet finished.",
             self.admitted()),
            ("workbench_server_queue_capacity", "Most requests admitted at once.",
             self.capacity),
        ):
            yield GaugeMetricFamily(name, doc, value=float(value))
        yield from kv_families([g.pool] if g.pool is not None else [])

    def answered(self, code: int) -> None:
        self.responses.labels(code=str(code)).inc()

    def finished(self, ttft_s: float, e2e_s: float, tokens: int, reason: str) -> None:
        """A completed request's latencies (TPOT only with a second token to time) and why it
        ended (``stop``, ``length``)."""
        self.success.labels(self.model, reason).inc()
        self.ttft.labels(self.model).observe(ttft_s)
        self.e2e.labels(self.model).observe(e2e_s)
        if tokens > 1:
            mean = (e2e_s - ttft_s) / (tokens - 1)
            self.tpot.labels(self.model).observe(mean)
            self.itl.labels(self.model).observe(mean)

    def render(self) -> bytes:
        return generate_latest(_NoCreated(self.registry))
