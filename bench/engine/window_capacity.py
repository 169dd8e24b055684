"""`python -m bench.engine.window_capacity`: what giving back the blocks behind a sliding window buys. A
Mistral-shaped model with seeded random weights (every layer slides) serves `--chats` long chats sent at once from
one fixed pool, first as the engine does it (blocks wholly behind the window given back as a chat advances), then
holding every chat's whole context; for each, the most chats decoding at once, the preemptions, the output tokens
per second, and the console's "room for about N more chats" over the empty pool."""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, MistralConfig

from engine.config import EngineConfig
from engine.core import EngineCore
from engine.model.loader import random_model_dir
from engine.sampling_params import SamplingParams
from web.console.capacity import capacity


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.engine.window_capacity", description=__doc__.split("\n\n")[0])
    p.add_argument("--window", type=int, default=256, help="the model's sliding window, in tokens")
    p.add_argument("--prompt", type=int, default=1024, help="prompt tokens of every chat")
    p.add_argument("--output", type=int, default=64, help="tokens every chat generates")
    p.add_argument("--chats", type=int, default=32, help="chats sent at once")
    p.add_argument("--blocks", type=int, default=544, help="the pool, in 16-token blocks (default: 8 whole chats)")
    return p.parse_args(argv)


@dataclass
class Run:
    most_decoding: int = 0
    preemptions: int = 0
    seconds: float = 0.0
    output_tokens: int = 0
    room: str = ""


def write_model(folder: Path, window: int, context: int) -> None:
    tokenizer = AutoTokenizer.from_pretrained(random_model_dir("tiny", EngineConfig().model_cache_dir))
    config = MistralConfig(
        vocab_size=len(tokenizer), hidden_size=256, intermediate_size=512, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, sliding_window=window, max_position_embeddings=context,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
    )  # fmt: skip
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def serve(folder: Path, args: argparse.Namespace, reclaim: bool) -> Run:
    config = EngineConfig(
        model=str(folder), quantization="none", dtype="float32", device="cpu", num_kv_blocks=args.blocks,
        max_num_seqs=args.chats, max_num_batched_tokens=512, enable_prefix_caching=False,
    )  # fmt: skip
    core = EngineCore(config)
    if not reclaim:
        core.reclaim_window = None  # every chat keeps its whole context
    room = capacity(core.stats(), args.prompt + args.output)
    run = Run(room=room.words if room else "")
    params = SamplingParams(max_tokens=args.output, temperature=0.0, ignore_eos=True)
    for i in range(args.chats):
        core.add_request(f"c{i}", [1000 + (i * 131 + j * 7) % 20000 for j in range(args.prompt)], params)
    started = time.perf_counter()
    while core.scheduler.waiting or core.scheduler.running:
        core.step()
        decoding = sum(r.num_computed_tokens >= r.num_prompt_tokens for r in core.scheduler.running)
        run.most_decoding = max(run.most_decoding, decoding)
    run.seconds = time.perf_counter() - started
    run.output_tokens = args.chats * args.output  # ignore_eos: every chat runs to its length
    run.preemptions = core.scheduler.num_preemptions
    return run


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    with tempfile.TemporaryDirectory(prefix="bench-window-") as tmp:
        write_model(Path(tmp), args.window, args.prompt + args.output)
        runs = {"blocks behind the window given back": serve(Path(tmp), args, True)}
        runs["whole context kept"] = serve(Path(tmp), args, False)
    print(
        f"window {args.window}, {args.chats} chats of {args.prompt} + {args.output} tokens, "
        f"{args.blocks} blocks of 16 tokens"
    )
    print(f"{'':>36} | most decoding at once | preemptions | output tok/s | console")
    for name, r in runs.items():
        rate = r.output_tokens / r.seconds if r.seconds else 0.0
        print(f"{name:>36} | {r.most_decoding:>21} | {r.preemptions:>11} | {rate:>12.1f} | {r.room}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
