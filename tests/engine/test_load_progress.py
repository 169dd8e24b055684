"""A first start's log (issue 17, L1): the GGUF conversion reports progress as whole lines, never a silence of
many seconds, no progress bar redrawn with carriage returns, and a ready line a person can read."""

from __future__ import annotations

import itertools
import time
from pathlib import Path

import pytest

from engine.messages import ModelInfo
from engine.model import gguf_source, loader
from engine.model.load_progress import HEARTBEAT_S
from engine.process import describe

# The longest quiet stretch allowed: one heartbeat, plus room for a busy 2-core machine.
MAX_SILENCE_S = HEARTBEAT_S + 3


def test_converting_the_gguf_reports_lines_without_long_silences(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    lines: list[tuple[float, str]] = []
    started = time.monotonic()
    gguf_source.converted_gguf(
        loader.default_model_path(), tmp_path, lambda line: lines.append((time.monotonic(), line))
    )
    finished = time.monotonic()

    said = [line for _, line in lines]
    assert any("%" in line and "GGUF tensors" in line for line in said), said
    assert any("tokenizer" in line and "done" in line for line in said), said
    assert not any("\r" in line for line in said)
    moments = [started, *(at for at, _ in lines), finished]
    silences = [later - earlier for earlier, later in itertools.pairwise(moments)]
    assert max(silences) <= MAX_SILENCE_S, list(zip(silences, [*said, "(end)"], strict=True))
    # stderr is not a terminal here: the bars went to the report, not to stderr as one long redrawn line.
    assert "\r" not in capfd.readouterr().err


def test_the_ready_line_describes_the_model_in_words() -> None:
    info = ModelInfo(
        name="SmolLM2-135M-Instruct",
        max_model_len=8192,
        tokenizer_dir="/var/lib/llm-appliance/models/x",
        eos_token_ids=[2],
        device="cpu",
        dtype="float32",
        quantization="none",
        num_kv_blocks=1456,
        block_size=16,
        kv_bytes_per_block=737280,
    )
    line = describe(info)
    assert line == (
        "SmolLM2-135M-Instruct on cpu (float32, unquantized), context 8192 tokens, "
        "KV cache 23296 tokens (1456 blocks, 1024 MiB)"
    )
