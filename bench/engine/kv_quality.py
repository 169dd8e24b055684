"""`python -m bench.engine.kv_quality`: what an 8-bit KV cache costs in fidelity on a model, against its exact pool:
greedy agreement over many chat prompts of mixed lengths, and the perplexity of a fixed text, each pool dtype in
turn on one copy of the weights. tests/engine/test_kv_quality.py holds a smaller sample to the bound measured here.
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import time
from dataclasses import dataclass, replace

from engine.config import EngineConfig
from engine.llm import LLM
from engine.model.attention import ATTENTION_NAME
from engine.model.loader import LoadedModel, load_model
from engine.sampling_params import SamplingParams

# A fixed text: prompts are cut from it, and its perplexity is measured.
TEXT = (
    "The harbour town woke slowly. Fishermen carried nets down to the boats while the baker opened his shutters "
    "and the smell of bread drifted over the square. Anna, who kept the lighthouse, walked along the sea wall and "
    "counted the gulls as she did every morning. The weather had turned in the night: a cold wind came from the "
    "north, and the water in the bay was grey and restless. At the school on the hill the children learned about "
    "the tides, about the moon that pulls the sea towards it twice a day, and about the sailors who once crossed "
    "the ocean with nothing but the stars to guide them. In the afternoon a stranger arrived on the bus from the "
    "city. He carried a leather case and asked at the inn for a room facing the water. Nobody knew what he did, "
    "and the town, which liked to know everything, talked of little else for a week. Some said he was a painter, "
    "others a surveyor sent to measure the old pier before it was pulled down. Anna thought he looked like a man "
    "who had lost something and come back to the place where he had last seen it. Water boils at one hundred "
    "degrees Celsius at sea level, and at a lower temperature on a mountain, because the air presses less on it. "
    "A computer stores numbers in binary, as sequences of ones and zeros, and a byte holds eight of them. "
    "Photosynthesis turns light, water and carbon dioxide into sugar and oxygen inside the leaves of plants."
)
QUESTIONS = (
    "Summarise this in one sentence.",
    "What happens next? Continue the story.",
    "List three facts from the text.",
    "Who is the main character, and why?",
    "Explain the science mentioned here to a child.",
    "Write a short title for this.",
    "What is the weather like?",
    "Translate the first sentence into French.",
)


@dataclass(frozen=True, slots=True)
class Agreement:
    prompts: int
    identical: int  # prompts whose greedy tokens are all the exact pool's
    matched_tokens: int  # tokens before each prompt's first difference, summed
    tokens: int  # the exact pool's tokens, summed

    @property
    def identical_share(self) -> float:
        return self.identical / self.prompts

    @property
    def token_share(self) -> float:
        """The share of the exact pool's tokens produced before the first difference."""
        return self.matched_tokens / self.tokens


def chat_prompts(llm: LLM, count: int, seed: int = 0) -> list[list[int]]:
    """count chat prompts of mixed lengths (a slice of TEXT of 4 to all of its words, and a question)."""
    rng = random.Random(seed)
    words = TEXT.split()
    prompts = []
    for _ in range(count):
        n = min(len(words), max(4, round(math.exp(rng.uniform(math.log(4), math.log(len(words)))))))
        start = rng.randrange(0, len(words) - n + 1)
        content = " ".join(words[start : start + n]) + "\n\n" + rng.choice(QUESTIONS)
        prompts.append(llm.chat_prompt([{"role": "user", "content": content}]))
    return prompts


def greedy(llm: LLM, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    return [r.token_ids for r in llm.generate(prompts, params)]


def agreement(exact: list[list[int]], other: list[list[int]]) -> Agreement:
    matched = [
        next((i for i, (a, b) in enumerate(zip(x, y, strict=False)) if a != b), min(len(x), len(y)))
        for x, y in zip(exact, other, strict=True)
    ]
    identical = sum(x == y for x, y in zip(exact, other, strict=True))
    return Agreement(len(exact), identical, sum(matched), sum(len(x) for x in exact))


def perplexity(llm: LLM, token_ids: list[int], start: int = 16) -> float:
    """exp of the mean negative log-likelihood of token_ids[start:], each given all before it, read through the
    pool: a request per position, forced to that token (logit_bias; logprobs come from the raw logits), whose
    context is the prefix cache's blocks (filled by one request over the whole text first), attended as every
    decode attends its own."""
    llm.generate([token_ids], SamplingParams(max_tokens=1, temperature=0.0))
    params = [
        SamplingParams(max_tokens=1, temperature=0.0, logprobs=0, logit_bias=((token_ids[t], 100.0),))
        for t in range(start, len(token_ids))
    ]
    results = llm.generate([token_ids[:t] for t in range(start, len(token_ids))], params)
    nll = [-r.logprobs[0].logprob for r in results]
    return math.exp(sum(nll) / len(nll))


def engine(config: EngineConfig, loaded: LoadedModel, kv_cache_dtype: str) -> LLM:
    """An offline engine on already loaded weights, with a pool of kv_cache_dtype."""
    return LLM(replace(config, kv_cache_dtype=kv_cache_dtype), loaded=loaded)  # type: ignore[arg-type]


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.engine.kv_quality", description=__doc__)
    p.add_argument("--model", default="default")
    p.add_argument("--dtype", default="float32", help="the model's compute dtype (the exact pool's)")
    p.add_argument("--kv-cache-dtypes", default="bf16,int8,fp8", help="pools compared with the exact one (auto)")
    p.add_argument("--prompts", type=int, default=200)
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--cpu-threads", type=int, default=1)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    config = EngineConfig(
        model=args.model, dtype=args.dtype, device="cpu", cpu_threads=args.cpu_threads, num_kv_blocks=4096,
        max_num_seqs=64, max_num_batched_tokens=1024,
    )  # fmt: skip
    loaded = load_model(config, attn_implementation=ATTENTION_NAME)
    exact = engine(config, loaded, "auto")
    prompts = chat_prompts(exact, args.prompts)
    text = exact.encode(TEXT)
    lengths = sorted(len(p) for p in prompts)
    median = lengths[len(lengths) // 2]
    print(f"{args.prompts} prompts of {lengths[0]}-{lengths[-1]} tokens (median {median}), {args.max_tokens} "
          f"greedy tokens each; perplexity over {len(text) - 16} tokens", file=sys.stderr)  # fmt: skip
    t0 = time.perf_counter()
    reference = greedy(exact, prompts, args.max_tokens)
    print(f"{'pool':>6} | identical prompts | tokens before a difference | perplexity | seconds")
    print(f"{'auto':>6} | {'-':>17} | {'-':>26} | {perplexity(exact, text):10.4f} | {time.perf_counter() - t0:7.1f}")
    for kv in args.kv_cache_dtypes.split(","):
        t0 = time.perf_counter()
        llm = engine(config, loaded, kv)
        a = agreement(reference, greedy(llm, prompts, args.max_tokens))
        ppl = perplexity(llm, text)
        print(f"{kv:>6} | {a.identical:>4}/{a.prompts} ({a.identical_share:6.1%}) | "
              f"{a.matched_tokens:>6}/{a.tokens} ({a.token_share:6.1%}) | {ppl:10.4f} | "
              f"{time.perf_counter() - t0:7.1f}", flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
