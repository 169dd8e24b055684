"""Prometheus metrics with vLLM's names where they exist, so a stock vLLM Grafana dashboard reads them: request
latency and length histograms observed here, engine gauges and counters read from the engine's latest stats at
scrape time, cache_config_info, the process collector; the appliance's own metrics (memory split, quota per key,
refusals, database errors) are named appliance_* (a colon is reserved for recording rules)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Histogram, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from engine import EngineStats
from web.history.record import RequestLog, Status

# vLLM's buckets, so dashboards built for vLLM read these unchanged.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0, 160.0, 640.0, 2560.0)  # fmt: skip
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
               80.0)  # fmt: skip
REQUEST_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
                   480.0, 960.0, 1920.0, 7680.0)  # fmt: skip
# vLLM's 1-2-5 series for token counts (it stops at max_model_len; the model is not known when these are made).
TOKEN_BUCKETS = tuple(float(m * 10**e) for e in range(6) for m in (1, 2, 5))[:-2]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
DB_OPERATIONS = ("admission", "history_write", "history_dropped")


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


@dataclass(frozen=True, slots=True)
class KeyQuota:
    key_id: int
    name: str
    used: int
    reserved: int
    limit: int | None


RELAY_BUCKETS = (0.0002, 0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0)


class Metrics:
    def __init__(self, stats: Callable[[], EngineStats | None], model_name: Callable[[], str | None]) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._model_name = model_name
        self.key_quotas: list[KeyQuota] = []
        self.engine_restarts = 0  # the engine client's count, set before each scrape like key_quotas
        self._window_queue_waits: list[float] = []  # since the sampler last took them
        labels = ["model_name"]
        self.queue_time = Histogram(
            "vllm:request_queue_time_seconds", "Time requests waited in the queue.", labels,
            buckets=REQUEST_BUCKETS, registry=self.registry,
        )  # fmt: skip
        self.ttft = Histogram(
            "vllm:time_to_first_token_seconds", "Time to first token.", labels,
            buckets=TTFT_BUCKETS, registry=self.registry,
        )  # fmt: skip
        self.itl = Histogram(
            "vllm:inter_token_latency_seconds", "Latency between streamed tokens as the server saw it.", labels,
            buckets=ITL_BUCKETS, registry=self.registry,
        )  # fmt: skip
        self.e2e = Histogram(
            "vllm:e2e_request_latency_seconds", "End-to-end request latency.", labels,
            buckets=REQUEST_BUCKETS, registry=self.registry,
        )  # fmt: skip
        self.prompt_len = Histogram(
            "vllm:request_prompt_tokens", "Number of prefill tokens processed.", labels,
            buckets=TOKEN_BUCKETS, registry=self.registry,
        )  # fmt: skip
        self.generation_len = Histogram(
            "vllm:request_generation_tokens", "Number of generation tokens processed.", labels,
            buckets=TOKEN_BUCKETS, registry=self.registry,
        )  # fmt: skip
        self.max_generation = Histogram(
            "vllm:request_max_num_generation_tokens", "Generated tokens of the request's longest choice.", labels,
            buckets=TOKEN_BUCKETS, registry=self.registry,
        )  # fmt: skip
        self.prefill_time = Histogram(
            "vllm:request_prefill_time_seconds", "From being scheduled to the first token.", labels,
            buckets=REQUEST_BUCKETS, registry=self.registry,
        )  # fmt: skip
        self.decode_time = Histogram(
            "vllm:request_decode_time_seconds", "From the first token to the last.", labels,
            buckets=REQUEST_BUCKETS, registry=self.registry,
        )  # fmt: skip
        self.inference_time = Histogram(
            "vllm:request_inference_time_seconds", "From being scheduled to the last token.", labels,
            buckets=REQUEST_BUCKETS, registry=self.registry,
        )  # fmt: skip
        self.tpot = Histogram(
            "vllm:request_time_per_output_token_seconds", "Mean time per output token after the first, per request.",
            labels, buckets=ITL_BUCKETS, registry=self.registry,
        )  # fmt: skip
        self.relay = Histogram(
            "appliance_backend_relay_seconds", "Time a remote backend's delta spends in this gateway: from reading "
            "its SSE line to writing its frame to the client.", ["backend"], buckets=RELAY_BUCKETS,
            registry=self.registry,
        )  # fmt: skip
        self.success = Counter(
            "vllm:request_success", "Requests that finished, by finish reason.", ["model_name", "finished_reason"],
            registry=self.registry,
        )  # fmt: skip
        self.rejected = Counter(
            "appliance_requests_rejected", "Requests refused after authentication, by reason.", ["reason"],
            registry=self.registry,
        )  # fmt: skip
        self.statuses = Counter(
            "appliance_requests", "Requests by terminal status.", ["status"], registry=self.registry
        )
        self.refusals = Counter(
            "appliance_http_refusals",
            "HTTP answers of 4xx and 5xx by status and error code (an unknown route: not_found; a missing or wrong "
            "key: missing_api_key, invalid_api_key), whether or not they reached a route.",
            ["status", "code"],
            registry=self.registry,
        )
        self.db_errors = Counter(
            "appliance_db_errors", "Database errors by operation: admission (the request was refused 503), "
            "history_write (kept and retried), history_dropped (lost).", ["operation"], registry=self.registry,
        )  # fmt: skip
        for operation in DB_OPERATIONS:  # at 0 from the start, so rate() and alerts see the first error
            self.db_errors.labels(operation)
        self.registry.register(_EngineCollector(stats, self))
        ProcessCollector(registry=self.registry)  # process_cpu_seconds_total, process_resident_memory_bytes, ...

    @property
    def model(self) -> str:
        return self._model_name() or "unknown"

    def inter_token_observer(self) -> Callable[[float, int], None]:
        """For one request: record that a delta of n tokens came `seconds` after the previous one (a merged
        delta counts as n even gaps). The labelled child is looked up once, not per token."""
        child = self.itl.labels(self.model)

        def observe(seconds: float, tokens: int) -> None:
            each = seconds / tokens
            for _ in range(tokens):
                child.observe(each)

        return observe

    def observe_request(self, log: RequestLog) -> None:
        model = self.model
        if log.status != Status.REJECTED:  # observe_rejected counts those, with their reason
            self.statuses.labels(log.status).inc()
        if log.scheduled_mono is not None:
            wait = log.scheduled_mono - log.arrival_mono
            self.queue_time.labels(model).observe(wait)
            self._window_queue_waits.append(wait)
        if log.first_token_mono is not None:
            self.ttft.labels(model).observe(log.first_token_mono - log.arrival_mono)
        if log.finished_mono is not None:
            self.e2e.labels(model).observe(log.finished_mono - log.arrival_mono)
        if log.status == Status.FINISHED:
            self._observe_phases(model, log)
        if log.status == Status.FINISHED and log.finish_reason:
            self.success.labels(model, log.finish_reason).inc()

    def _observe_phases(self, model: str, log: RequestLog) -> None:
        """vLLM's per-request lengths and phases, for the requests that ran to their end."""
        self.prompt_len.labels(model).observe(log.prompt_tokens)
        self.generation_len.labels(model).observe(log.completion_tokens)
        self.max_generation.labels(model).observe(log.completion_tokens)
        scheduled, first, last = log.scheduled_mono, log.first_token_mono, log.finished_mono
        if scheduled is None or first is None or last is None:
            return
        self.prefill_time.labels(model).observe(first - scheduled)
        self.decode_time.labels(model).observe(last - first)
        self.inference_time.labels(model).observe(last - scheduled)
        if log.completion_tokens > 1:
            self.tpot.labels(model).observe((last - first) / (log.completion_tokens - 1))

    def take_queue_waits(self) -> list[float]:
        """Queue waits of the requests that ended since the last call (the sampler's window)."""
        waits, self._window_queue_waits = self._window_queue_waits, []
        return waits

    def observe_refusal(self, status: int, code: str) -> None:
        self.refusals.labels(str(status), code or "none").inc()

    def observe_rejected(self, reason: str) -> None:
        self.rejected.labels(reason).inc()
        self.statuses.labels(Status.REJECTED).inc()

    def observe_db_error(self, operation: str) -> None:
        self.db_errors.labels(operation).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _EngineCollector(Collector):
    """Reads the engine's snapshot at scrape time: gauges and the engine's own counters."""

    def __init__(self, stats: Callable[[], EngineStats | None], metrics: Metrics) -> None:
        self._stats = stats
        self._metrics = metrics

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        model = self._metrics.model
        s = self._stats()
        up = GaugeMetricFamily("appliance_engine_up", "1 when the engine has reported stats.")
        up.add_metric([], 1.0 if s is not None else 0.0)
        yield up
        # Here, not among the engine's counters: the engine's own counters start again with each new process.
        yield _counter("appliance_engine_restarts", "Engine restarts after a crash.", self._metrics.engine_restarts, {})
        if s is not None:
            yield from _engine_metrics(s, model)
        yield from _quota_metrics(self._metrics.key_quotas)


def _gauge(name: str, doc: str, value: float, labels: dict[str, str]) -> GaugeMetricFamily:
    g = GaugeMetricFamily(name, doc, labels=list(labels))
    g.add_metric(list(labels.values()), value)
    return g


def _counter(name: str, doc: str, value: float, labels: dict[str, str]) -> CounterMetricFamily:
    c = CounterMetricFamily(name, doc, labels=list(labels))
    c.add_metric(list(labels.values()), value)
    return c


def _engine_metrics(s: EngineStats, model: str) -> Iterator[Metric]:
    m = {"model_name": model}
    kind = {"kind": s.memory_kind}
    yield _gauge("vllm:num_requests_running", "Requests in the running batch.", s.running, m)
    yield _gauge("vllm:num_requests_waiting", "Requests waiting for a seat.", s.waiting, m)
    yield _gauge("vllm:kv_cache_usage_perc", "KV-cache usage (1 = full).", s.kv_usage, m)
    yield _counter("vllm:num_preemptions", "Preemptions (recompute).", s.preemptions_total, m)
    yield _counter("vllm:prompt_tokens", "Prompt tokens processed.", s.prompt_tokens_total, m)
    yield _counter("vllm:generation_tokens", "Tokens generated.", s.generation_tokens_total, m)
    yield _counter("vllm:prefix_cache_queries", "Prefix cache queries, in queried tokens.", s.prefix_cache_queries, m)
    yield _counter("vllm:prefix_cache_hits", "Prefix cache hits, in cached tokens.", s.prefix_cache_hits, m)
    yield _cache_config_info(s)
    yield _gauge("appliance_kv_cache_blocks_total", "KV blocks in the pool.", s.kv_blocks_total, m)
    yield _gauge("appliance_kv_cache_blocks_used", "KV blocks in use.", s.kv_blocks_used, m)
    yield _gauge("appliance_model_weights_bytes", "Bytes the model weights take.", s.weights_bytes, kind)
    yield _gauge("appliance_kv_pool_bytes", "Bytes the KV-cache pool takes.", s.kv_pool_bytes, kind)
    yield _gauge("appliance_device_memory_free_bytes", "Free VRAM (GPU) or RAM (CPU).", s.device_memory_free, kind)
    yield _gauge("appliance_device_memory_total_bytes", "Total VRAM or RAM.", s.device_memory_total, kind)


def _cache_config_info(s: EngineStats) -> GaugeMetricFamily:
    """vLLM's info-style gauge (always 1) whose labels describe the KV cache; dashboards read num_gpu_blocks."""
    labels = {
        "block_size": str(s.block_size),
        "num_gpu_blocks": str(s.kv_blocks_total),
        "enable_prefix_caching": "True",
        "cache_dtype": s.kv_cache_dtype,
        "memory_kind": s.memory_kind,
    }
    return _gauge("vllm:cache_config_info", "Information of the engine's KV cache configuration.", 1.0, labels)


def _quota_metrics(quotas: list[KeyQuota]) -> Iterator[Metric]:
    labels = ["key_id", "key_name"]
    used = GaugeMetricFamily("appliance_key_quota_used_tokens", "Tokens used in the key's period.", labels=labels)
    reserved = GaugeMetricFamily("appliance_key_quota_reserved_tokens", "Tokens reserved in flight.", labels=labels)
    limit = GaugeMetricFamily("appliance_key_quota_limit_tokens", "The key's quota per period.", labels=labels)
    for q in quotas:
        ident = [str(q.key_id), q.name]
        used.add_metric(ident, q.used)
        reserved.add_metric(ident, q.reserved)
        if q.limit is not None:
            limit.add_metric(ident, q.limit)
    yield used
    yield reserved
    yield limit
