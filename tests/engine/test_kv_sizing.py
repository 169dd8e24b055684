"""KV pool sizing: bytes per block from the model's shape, and the CUDA budget arithmetic (with the memory cap
that emulates a 24 GB card on a larger one). The arithmetic is plain Python, so it is tested without a GPU."""

from __future__ import annotations

import pytest
import torch

from engine import ConfigError, EngineConfig
from engine.core import cuda_kv_budget
from engine.model.kv_cache import bytes_per_block

GIB = 1 << 30


def test_bytes_per_block_counts_keys_and_values_of_every_layer() -> None:
    # Llama-3.1-8B: 32 layers, 8 KV heads of 128 dims, bf16: 128 KiB per token, 2 MiB per 16-token block.
    assert bytes_per_block(32, 8, 128, 16, torch.bfloat16) == 2 * 32 * 16 * 8 * 128 * 2 == 2 * 2**20
    assert bytes_per_block(30, 3, 64, 16, torch.float32) == 2 * 30 * 16 * 3 * 64 * 4


def test_budget_is_the_usable_share_minus_others_and_the_peak() -> None:
    assert (
        cuda_kv_budget(total=24 * GIB, others=GIB, peak=6 * GIB, utilization=0.9, cap=None)
        == int(24 * GIB * 0.9) - 7 * GIB
    )


def test_cap_emulates_a_smaller_card() -> None:
    h200 = 141 * GIB
    capped = cuda_kv_budget(total=h200, others=0, peak=6 * GIB, utilization=0.9, cap=24 * GIB)
    assert capped == 18 * GIB
    assert cuda_kv_budget(total=h200, others=0, peak=6 * GIB, utilization=0.9, cap=None) > 100 * GIB


def test_budget_never_negative() -> None:
    assert cuda_kv_budget(total=8 * GIB, others=4 * GIB, peak=6 * GIB, utilization=0.9, cap=None) == 0


def test_cap_must_be_positive() -> None:
    with pytest.raises(ConfigError, match="gpu_memory_cap_bytes"):
        EngineConfig(gpu_memory_cap_bytes=0)
