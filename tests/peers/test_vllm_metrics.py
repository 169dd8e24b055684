"""The managed vLLM's /metrics as the engine snapshot the console and the gateway's /metrics show: its load, its
pool from vllm:cache_config_info and its counters summed over label sets (lines as vLLM 0.32 writes them)."""

from __future__ import annotations

from appliance.vllm.metrics import Scrape, stats_of
from appliance.vllm.process import Launch
from engine import ModelInfo

METRICS = """\
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="smol"} 3.0
vllm:num_requests_waiting{engine="0",model_name="smol"} 2.0
vllm:kv_cache_usage_perc{engine="0",model_name="smol"} 0.25
vllm:prompt_tokens_total{engine="0",model_name="smol"} 120.0
vllm:prompt_tokens_created{engine="0",model_name="smol"} 1.7961420755342035e+09
vllm:generation_tokens_total{engine="0",model_name="smol"} 480.0
vllm:request_success_total{engine="0",finished_reason="stop",model_name="smol"} 4.0
vllm:request_success_total{engine="0",finished_reason="length",model_name="smol"} 2.0
vllm:iteration_tokens_total_bucket{engine="0",le="1.0",model_name="smol"} 7.0
vllm:cache_config_info{block_size="128",engine="0",kv_cache_memory_bytes="1073741824",num_cpu_blocks="None",\
num_gpu_blocks="182"} 1.0
"""


def test_a_scrape_is_the_engine_snapshot() -> None:
    read = Scrape(METRICS)
    assert read.blocks == (182, 128, 1 << 30)
    info = ModelInfo("smol", 2048, "/m", [2], "cpu", "float32", "none", 182, 128, (1 << 30) // 182)
    s = stats_of(read, Launch([], {}, "cpu", "float32", "none"), info, 540_000_000, (8 << 30, 4 << 30))
    assert (s.running, s.waiting, s.kv_blocks_total, s.kv_blocks_used) == (3, 2, 182, 46)
    assert (s.prompt_tokens_total, s.generation_tokens_total, s.requests_finished_total) == (120, 480, 6)
    assert s.memory_kind == "RAM" and s.device_memory_total == 8 << 30 and s.weights_bytes == 540_000_000
    assert abs(s.kv_usage - 0.25) < 0.01


def test_a_broken_or_foreign_scrape_leaves_zeros() -> None:
    for text in ("", 'vllm:cache_config_info{block_size="1 1\nnot metrics at all', "# only comments\n"):
        read = Scrape(text)
        assert read.blocks == (0, 0, 0) and set(read.counters.values()) == {0}
