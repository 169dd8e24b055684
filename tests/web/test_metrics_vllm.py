"""/metrics speaks what a stock vLLM Grafana dashboard queries (issue 16): every series of vLLM's example dashboard
(examples/observability/prometheus_grafana/grafana.json), cache_config_info, the process collector, and the
appliance's own metrics named appliance_* (no colon: Prometheus reserves it for recording rules)."""

from __future__ import annotations

import re
from typing import Any

from tests.web.conftest import METRICS_TOKEN, MODEL, bearer, new_key
from tests.web.test_lifecycle import CHAT
from tests.web.test_system import samples

# The series vLLM's example dashboard's panels query, as its PromQL names them.
STOCK_DASHBOARD = (
    "vllm:e2e_request_latency_seconds_bucket",
    "vllm:e2e_request_latency_seconds_sum",
    "vllm:e2e_request_latency_seconds_count",
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
    "vllm:inter_token_latency_seconds_bucket",
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:time_to_first_token_seconds_bucket",
    "vllm:kv_cache_usage_perc",
    "vllm:request_prompt_tokens_bucket",
    "vllm:request_generation_tokens_bucket",
    "vllm:request_success_total",
    "vllm:request_queue_time_seconds_sum",
    "vllm:request_prefill_time_seconds_sum",
    "vllm:request_decode_time_seconds_sum",
    "vllm:request_max_num_generation_tokens_sum",
)


async def test_the_stock_vllm_dashboards_series_are_all_there(client: Any) -> None:
    key = await new_key(client)
    for stream in (False, True):
        response = await client.post("/v1/chat/completions", json={**CHAT, "stream": stream}, headers=bearer(key))
        assert response.status_code == 200, response.text
    scraped = await client.get("/metrics", headers=bearer(METRICS_TOKEN))
    found = samples(scraped.text)
    missing = [name for name in STOCK_DASHBOARD if name not in found]
    assert not missing, missing
    for name in STOCK_DASHBOARD:  # the dashboard filters every series by model_name
        assert all(s.labels.get("model_name") == MODEL for s in found[name]), name

    # The fake engine answers 5 tokens to a 19-token prompt: the length histograms land in vLLM's 1-2-5 buckets.
    prompt = {s.labels["le"]: s.value for s in found["vllm:request_prompt_tokens_bucket"]}
    assert prompt["10.0"] == 0 and prompt["20.0"] == 2
    generated = {s.labels["le"]: s.value for s in found["vllm:request_generation_tokens_bucket"]}
    assert generated["2.0"] == 0 and generated["5.0"] == 2
    assert found["vllm:request_time_per_output_token_seconds_count"][0].value == 2
    assert found["vllm:request_inference_time_seconds_count"][0].value == 2

    (info,) = found["vllm:cache_config_info"]
    assert info.value == 1 and info.labels["block_size"] == "16" and info.labels["num_gpu_blocks"] == "64"
    assert info.labels["cache_dtype"] == "auto", "vLLM's name for the pool's element type (auto: the model's)"
    assert "process_resident_memory_bytes" in found or "process_cpu_seconds_total" in found
    assert found["vllm:prefix_cache_queries_total"] and "queried tokens" in scraped.text


async def test_no_metric_name_has_a_colon_but_vllms_own(client: Any) -> None:
    scraped = await client.get("/metrics", headers=bearer(METRICS_TOKEN))
    names = set(re.findall(r"^# TYPE (\S+)", scraped.text, re.M))
    assert "appliance_engine_up" in names and "appliance_db_errors_total" in names
    assert all(name.startswith("vllm:") or ":" not in name for name in names), sorted(names)
