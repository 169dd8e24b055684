"""`python -m bench.engine.window_capacity`: what giving back the blocks behind a sliding window buys. A model with
seeded random weights, Mistral-shaped (every layer slides) or Gemma-3-shaped (`--model gemma3`: five windowed
layers to one global, the pool in layer groups, engine.sched.kv_groups), serves `--chats` long chats sent at once
from one fixed pool, first as the engine does it (blocks wholly behind the window given back as a chat advances),
then holding every chat's whole context; for each, the most chats decoding at once, the preemptions, the output
tokens per second, and the console's "room for about N more chats" over the empty pool."""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, Gemma3TextConfig, MistralConfig, PretrainedConfig

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
    p.add_argument(
        "--blocks", type=int, default=544, help="the pool, in 16-token blocks of every layer (default: 8 whole chats)"
    )
    p.add_argument("--model", choices=["mistral", "gemma3"], default="mistral")
    return p.parse_args(argv)


@dataclass
class Run:
    most_decoding: int = 0
    preemptions: int = 0
    seconds: float = 0.0
    output_tokens: int = 0
    room: str = ""


KV_HEADS, HEAD_DIM = 2, 64


def write_model(folder: Path, model: str, window: int, context: int) -> int:
    """The model's layer count."""
    tokenizer = AutoTokenizer.from_pretrained(random_model_dir("tiny", EngineConfig().model_cache_dir))
    shape = dict(
        vocab_size=len(tokenizer), hidden_size=256, intermediate_size=512, num_attention_heads=4,
        num_key_value_heads=KV_HEADS, head_dim=HEAD_DIM, sliding_window=window, max_position_embeddings=context,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
    )  # fmt: skip
    config: PretrainedConfig
    if model == "gemma3":
        kinds = ["sliding_attention"] * 5 + ["full_attention"]
        config = Gemma3TextConfig(**shape, num_hidden_layers=6, layer_types=kinds, query_pre_attn_scalar=HEAD_DIM)
    else:
        config = MistralConfig(**shape, num_hidden_layers=2)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return int(config.num_hidden_layers)


def serve(folder: Path, args: argparse.Namespace, layers: int, reclaim: bool) -> Run:
    whole_block = 2 * layers * 16 * KV_HEADS * HEAD_DIM * 4  # keys and values of every layer, float32
    config = EngineConfig(
        model=str(folder), quantization="none", dtype="float32", device="cpu", kv_cache_bytes=args.blocks * whole_block,
        max_num_seqs=args.chats, max_num_batched_tokens=512, enable_prefix_caching=False,
    )  # fmt: skip
    core = EngineCore(config)
    if not reclaim:
        core.reclaims = False  # every chat keeps its whole context
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
        layers = write_model(Path(tmp), args.model, args.window, args.prompt + args.output)
        runs = {"blocks behind the window given back": serve(Path(tmp), args, layers, True)}
        runs["whole context kept"] = serve(Path(tmp), args, layers, False)
    print(
        f"{args.model}, window {args.window}, {args.chats} chats of {args.prompt} + {args.output} tokens, "
        f"a pool of {args.blocks} blocks of 16 tokens of every layer"
    )
    print(f"{'':>36} | most decoding at once | preemptions | output tok/s | console")
    for name, r in runs.items():
        rate = r.output_tokens / r.seconds if r.seconds else 0.0
        print(f"{name:>36} | {r.most_decoding:>21} | {r.preemptions:>11} | {rate:>12.1f} | {r.room}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
