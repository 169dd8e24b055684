"""`python -m bench.engine.fair_overhead`: the scheduler's cost per step (schedule + update, no model) under fair
and fcfs with R running and W waiting requests of T tenants, and the cost of one stats snapshot's tenant part."""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time

from engine.messages import QUEUE_SNAPSHOT
from engine.sampling_params import SamplingParams
from engine.sched.block_manager import BlockManager
from engine.sched.policy import Policy
from engine.sched.request import Request
from engine.sched.scheduler import Scheduler, SchedulerLimits
from engine.sched.tenant import Tenant


class Run:
    """One policy's scheduler over a queue kept at `waiting` requests of `tenants` tenants, stepped with a
    stand-in for the runner (every sampling row gets a token)."""

    def __init__(self, policy: Policy, running: int, waiting: int, tenants: int, seed: int) -> None:
        self.rng = random.Random(seed)
        self.running, self.waiting = running, waiting
        limits = SchedulerLimits(running, 4096, waiting + running + 64, 4096, policy)
        self.sched = Scheduler(limits, BlockManager(64 * (running + waiting), 16, enable_prefix_caching=False))
        self.people = [Tenant(f"key-{i}", weight=self.rng.choice([0.5, 1.0, 2.0])) for i in range(tenants)]
        self.next_id = 0
        self.times: list[float] = []
        self.refill()

    def refill(self) -> None:
        rng, sched = self.rng, self.sched
        while len(sched.waiting) < self.waiting:
            prompt = [rng.randrange(100, 30000) for _ in range(rng.randint(8, 64))]
            params = SamplingParams(max_tokens=rng.randint(4, 128), ignore_eos=True)
            sched.add_request(
                Request(f"r{self.next_id}", prompt, params, time.monotonic(), tenant=rng.choice(self.people))
            )
            self.next_id += 1

    def step(self, measured: bool) -> None:
        sched = self.sched
        t0 = time.perf_counter()
        out = sched.schedule()
        t1 = time.perf_counter()
        assert not measured or len(out.scheduled) == self.running, "the batch is not full: raise the waiting count"
        sampled = {s.request.request_id: 100 for s in out.scheduled if s.samples}  # the runner's part
        t2 = time.perf_counter()
        sched.update(out, sampled)
        t3 = time.perf_counter()
        if measured:
            self.times.append(((t1 - t0) + (t3 - t2)) * 1000)
        self.refill()

    def snapshot_ms(self) -> float:
        t0 = time.perf_counter()
        for _ in range(20):
            self.sched.book.snapshot(time.monotonic())
            [r.request_id for r in self.sched.waiting.ordered(QUEUE_SNAPSHOT)]
        return (time.perf_counter() - t0) / 20 * 1000


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.engine.fair_overhead", description=__doc__)
    p.add_argument("--running", type=int, default=64)
    p.add_argument("--waiting", type=int, default=1000)
    p.add_argument("--tenants", type=int, default=100)
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    print(f"{args.running} running, {args.waiting} waiting, {args.tenants} tenants, {args.steps} steps")
    runs = {
        policy: Run(policy, args.running, args.waiting, args.tenants, args.seed)
        for policy in (Policy.FCFS, Policy.FAIR)
    }
    for step in range(args.steps + 50):  # the first 50 fill the batch; then the policies take turns, step by step
        for run in runs.values():
            run.step(measured=step >= 50)
    for policy, run in runs.items():
        ms = sorted(run.times)
        print(
            f"{policy:>5}: schedule+update {statistics.fmean(ms):.3f} ms per step (p50 {ms[len(ms) // 2]:.3f}, p99 "
            f"{ms[int(len(ms) * 0.99)]:.3f}); stats snapshot (tenants + queue of {QUEUE_SNAPSHOT}) "
            f"{run.snapshot_ms():.3f} ms; {run.sched.num_preemptions} preemptions"
        )
    extra = statistics.fmean(runs[Policy.FAIR].times) - statistics.fmean(runs[Policy.FCFS].times)
    print(f"fair costs {extra:+.3f} ms per step over fcfs (bar: fair <= 0.1 ms per step)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
