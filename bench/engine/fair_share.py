"""`python -m bench.engine.fair_share`: issue 12's light-keys-beside-a-heavy-key run, in process on the real
engine (no web side): four light tenants each send a short request (16 tokens) about every 1.5 s, first alone,
then beside a heavy tenant that keeps 24 long requests (256 tokens, ignore_eos) in flight, under fair and fcfs.
Prints the light tenants' TTFT p50/p95 alone and beside the heavy one, the heavy tenant's tok/s and the total.
The policies take turns in short rounds, so a machine whose load drifts (shared cores) weighs on both alike."""

from __future__ import annotations

import argparse
import random
import sys
import time
from dataclasses import dataclass, field, replace

from bench.engine.runs import percentile
from bench.variant import engine_config
from engine.config import EngineConfig
from engine.core import EngineCore
from engine.model.attention import ATTENTION_NAME
from engine.model.loader import LoadedModel, load_model
from engine.sampling_params import SamplingParams
from engine.sched.policy import Policy
from engine.sched.tenant import Tenant

HEAVY = Tenant("heavy")
LIGHT = [Tenant(f"light-{i}") for i in range(4)]


@dataclass(slots=True)
class Phase:
    light_ttft: list[float] = field(default_factory=list)
    tokens: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    reclaims: int = 0


def run_phase(
    loaded: LoadedModel, config: EngineConfig, policy: Policy, seconds: float, heavy: bool, args: argparse.Namespace
) -> Phase:
    core = EngineCore(replace(config, policy=policy), loaded=loaded)
    core.warm_up()
    rng = random.Random(args.seed)
    vocab = len(loaded.tokenizer)

    def prompt(n: int) -> list[int]:
        return [rng.randrange(100, vocab) for _ in range(n)]

    light_params = SamplingParams(max_tokens=args.light_tokens, temperature=0.0, ignore_eos=True)
    heavy_params = SamplingParams(max_tokens=args.heavy_tokens, temperature=0.0, ignore_eos=True)
    phase = Phase(tokens={t.id: 0 for t in (HEAVY, *LIGHT)})
    tenant_of: dict[str, Tenant] = {}
    next_id = 0

    def add(tenant: Tenant, params: SamplingParams) -> None:
        nonlocal next_id
        rid = f"{tenant.id}-{next_id}"
        next_id += 1
        tenant_of[rid] = tenant
        core.add_request(rid, prompt(args.prompt_tokens), params, tenant=tenant)

    start = time.monotonic()
    # Each light tenant's next send time: about every `interval` seconds, jittered so they do not line up.
    next_light = [start + rng.uniform(0, args.interval) for _ in LIGHT]
    heavy_in_flight = 0
    while (now := time.monotonic()) < start + seconds:
        while heavy and heavy_in_flight < args.heavy_streams:
            add(HEAVY, heavy_params)
            heavy_in_flight += 1
        for i, tenant in enumerate(LIGHT):
            if now >= next_light[i]:
                add(tenant, light_params)
                next_light[i] = now + rng.uniform(0.5, 1.5) * args.interval
        if not core.has_work():
            time.sleep(0.001)
            continue
        before = core.scheduler.num_preemptions
        for out in core.step():
            tenant = tenant_of[out.request_id]
            phase.tokens[tenant.id] += len(out.token_ids)
            if out.finished:
                if tenant is HEAVY:
                    heavy_in_flight -= 1
                elif out.timings is not None and out.timings.first_token is not None:
                    phase.light_ttft.append(out.timings.first_token - out.timings.arrival)
        phase.reclaims += core.scheduler.num_preemptions - before
    phase.seconds = time.monotonic() - start
    return phase


def merged(phases: list[Phase]) -> Phase:
    out = Phase(tokens={t.id: 0 for t in (HEAVY, *LIGHT)})
    for ph in phases:
        out.light_ttft += ph.light_ttft
        out.seconds += ph.seconds
        out.reclaims += ph.reclaims
        for tid, n in ph.tokens.items():
            out.tokens[tid] += n
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.engine.fair_share", description=__doc__)
    p.add_argument("--model", default="random:tiny")
    p.add_argument("--max-num-seqs", type=int, default=16)
    p.add_argument("--alone", type=float, default=30.0, help="seconds of light traffic alone")
    p.add_argument("--beside", type=float, default=30.0, help="seconds beside the heavy tenant, per policy")
    p.add_argument("--interval", type=float, default=1.5, help="seconds between one light tenant's requests")
    p.add_argument("--light-tokens", type=int, default=16)
    p.add_argument("--heavy-tokens", type=int, default=256)
    p.add_argument("--heavy-streams", type=int, default=24)
    p.add_argument("--prompt-tokens", type=int, default=32)
    p.add_argument("--policies", default="fair,fcfs")
    p.add_argument("--rounds", type=int, default=3, help="turns each policy takes, alone then beside")
    p.add_argument("--cpu-threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    config = engine_config(args, quantization="none")
    loaded = load_model(config, attn_implementation=ATTENTION_NAME)
    print(
        f"{loaded.name} on {loaded.device}, {args.max_num_seqs} seats: 4 light tenants ({args.light_tokens} tokens "
        f"every ~{args.interval} s each), heavy tenant {args.heavy_streams} x {args.heavy_tokens} tokens in flight"
    )
    policies = [Policy(s.strip()) for s in args.policies.split(",") if s.strip()]
    runs: dict[str, tuple[list[Phase], list[Phase]]] = {p: ([], []) for p in policies}
    for _ in range(args.rounds):
        for policy in policies:
            runs[policy][0].append(run_phase(loaded, config, policy, args.alone / args.rounds, False, args))
            runs[policy][1].append(run_phase(loaded, config, policy, args.beside / args.rounds, True, args))
    rows = []
    for name, (alone_phases, beside_phases) in runs.items():
        alone, beside = merged(alone_phases), merged(beside_phases)
        total = sum(beside.tokens.values()) / beside.seconds
        rows.append((name, alone, beside, beside.tokens[HEAVY.id] / beside.seconds, total))
    print(
        f"{'policy':>6} | {'light TTFT alone p50/p95':>24} | {'beside heavy p50/p95':>20} | {'p95 ratio':>9} | "
        f"{'heavy tok/s':>11} | {'total tok/s':>11} | preempt"
    )
    for name, alone, beside, heavy_rate, total in rows:
        a50, a95 = percentile(alone.light_ttft, 50), percentile(alone.light_ttft, 95)
        b50, b95 = percentile(beside.light_ttft, 50), percentile(beside.light_ttft, 95)
        print(
            f"{name:>6} | {a50 * 1000:>9.0f} / {a95 * 1000:>6.0f} ms   | {b50 * 1000:>7.0f} / {b95 * 1000:>6.0f} ms "
            f"| {b95 / a95:>8.1f}x | {heavy_rate:>11.1f} | {total:>11.1f} | {beside.reclaims}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
