"""EngineCore: the step machine (schedule -> run -> update) plus detokenizing and stats, in one process.

The offline LLM drives it directly; engine.process runs it in its own process behind the async client.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, wait
from typing import TYPE_CHECKING

import torch

from engine.config import EngineConfig
from engine.cpu.decode_kernel import attention_kernel
from engine.errors import ConfigError
from engine.hf import tokenizer_class_name
from engine.messages import (
    QUEUE_SNAPSHOT,
    EngineStats,
    Logprob,
    ModelInfo,
    Rejected,
    RequestOutput,
    Timings,
    Usage,
)
from engine.model.attention import ATTENTION_NAME
from engine.model.fidelity import check_fidelity
from engine.model.forward import cpu_forward
from engine.model.kv_cache import STORAGE, KVCache, allocate_kv_cache, bytes_per_block
from engine.model.loader import LoadedModel, load_model
from engine.model.rope import install_request_rope
from engine.model.runner import ModelRunner
from engine.sample.detokenizer import IncrementalDetokenizer
from engine.sample.guided import GrammarCache, refusal
from engine.sample.guided_batch import GuidedBatch
from engine.sample.sampler import TopLogprobs
from engine.sampling_params import SamplingParams
from engine.sched.kv_groups import GroupedBlockManager, KVGroups
from engine.sched.limits import check_prompt
from engine.sched.request import Request, RequestStatus
from engine.sched.scheduler import ScheduledRequest, Scheduler, SchedulerLimits
from engine.sched.tenant import DEFAULT_TENANT, Tenant
from engine.stats import StatsTracker, device_memory

if TYPE_CHECKING:
    import xgrammar

GRAMMAR_WAIT_S = 0.01  # how long an idle step sleeps on compiling grammars rather than spin the loop

log = logging.getLogger("engine.core")


class EngineCore:
    def __init__(
        self,
        config: EngineConfig,
        progress: Callable[[str], None] | None = None,
        loaded: LoadedModel | None = None,
    ) -> None:
        """loaded: an already loaded model to serve (benchmarks compare policies on one copy of the weights); its
        CPU plan, made from the config it was loaded with, is the one this engine follows."""
        self.config = config
        self.loaded = loaded or load_model(config, progress, attn_implementation=ATTENTION_NAME)
        self.loaded.cpu_plan.apply()
        self.tokenizer = self.loaded.tokenizer
        self.features = check_fidelity(self.loaded.model)
        log.info("model features: %s", self.features.describe())
        self.rope = install_request_rope(self.loaded.model, self.features.rope_types)
        self.forward, plan = cpu_forward(self.loaded.model, self.loaded.cpu_plan, self.features)
        if progress:
            progress("sizing the KV cache")
        # Layers that slide give back the blocks behind their window as requests advance, in groups of their own
        # where others attend fully (engine.sched.kv_groups); not with longrope, whose recompute rewrites a
        # request's whole context.
        windows = [f.window if self.rope is None else None for f in self.features.layers]
        if len(windows) != self.loaded.num_layers:  # the probe saw other layers than the pool holds: no groups
            windows = [None] * self.loaded.num_layers
        self.kv_groups = KVGroups.plan(windows)
        log.info("KV pool: %s", self.kv_groups.describe())
        self.kv = self._allocate_kv()
        # A longrope token's keys depend on its request's prompt length, which a shared prefix does not carry.
        caching = config.enable_prefix_caching and self.rope is None
        self.blocks = GroupedBlockManager(self.kv.num_blocks, config.block_size, caching, self.kv_groups.windows)
        self.reclaims = self.kv_groups.reclaims  # benchmarks turn it off to measure what it buys
        limits = SchedulerLimits(
            max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=config.max_num_batched_tokens,
            max_queue=config.max_queue,
            max_model_len=self.loaded.max_model_len,
            policy=config.policy,
        )
        self.scheduler = Scheduler(limits, self.blocks)
        self.eos_token_ids = frozenset(self.loaded.eos_token_ids)
        # The bitmask spans the logits, which can be wider than the tokenizer (padded embeddings).
        logits_width = self.loaded.model.config.get_text_config().vocab_size
        self.grammars = GrammarCache(self.tokenizer, logits_width, sorted(self.eos_token_ids))
        self.guided = GuidedBatch(self.grammars, config.max_num_seqs, self.loaded.device)
        text = self.loaded.model.config.get_text_config()
        kernel, self.cpu_plan = attention_kernel(
            plan, self.loaded.dtype, self.loaded.head_dim, text.num_attention_heads, self.loaded.num_kv_heads,
            self.kv.dtype,
        )  # fmt: skip
        for line in self.cpu_plan.lines():
            log.info(line)
        self.runner = ModelRunner(
            self.loaded.model, self.kv, self.loaded.device, self.guided, kernel, self.forward, self.rope,
            self.kv_groups.layer_group if self.kv_groups.count > 1 else (),
        )  # fmt: skip
        self._compiling: dict[str, Future[xgrammar.CompiledGrammar]] = {}
        self._rejected: list[Rejected] = []
        self.vocab_size = len(self.tokenizer)
        self._detokenizers: dict[str, IncrementalDetokenizer] = {}
        self.tracker = StatsTracker()
        self._memory = device_memory(self.loaded.device)
        self._memory_time = 0.0

    # -- sizing ----------------------------------------------------------------------------------------

    @property
    def kv_dtype(self) -> torch.dtype:
        """The pool's element type: kv_cache_dtype resolved against the model's compute dtype."""
        return STORAGE[self.config.kv_storage(str(self.loaded.dtype).removeprefix("torch."))]

    def _allocate_kv(self) -> KVCache:
        cfg, m = self.config, self.loaded
        per_block = bytes_per_block(self.kv_groups.size, m.num_kv_heads, m.head_dim, cfg.block_size, self.kv_dtype)
        if cfg.num_kv_blocks is not None:
            num_blocks = cfg.num_kv_blocks
        elif m.device.type == "cuda":
            num_blocks = self._cuda_num_blocks(per_block)
        else:
            num_blocks = cfg.kv_cache_bytes // per_block
        if num_blocks < 1:
            raise ConfigError(f"the KV budget holds no block of {per_block} bytes; raise it")
        return self._kv_cache(num_blocks)

    def _kv_cache(self, num_blocks: int) -> KVCache:
        """A pool of num_blocks blocks, each one KV group's layers for block_size tokens."""
        cfg, m, groups = self.config, self.loaded, self.kv_groups
        slots = groups.layer_slot if groups.count > 1 else None
        return allocate_kv_cache(
            num_blocks, cfg.block_size, groups.size, m.num_kv_heads, m.head_dim, self.kv_dtype, m.device, slots
        )

    def _cuda_num_blocks(self, per_block: int) -> int:
        """Blocks that fit in gpu_memory_utilization of the card after the weights and a worst-case forward."""
        cfg, m = self.config, self.loaded
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(m.device)
        warm_blocks = -(-cfg.max_num_batched_tokens // cfg.block_size) * self.kv_groups.count
        probe = self._kv_cache(warm_blocks)
        self._warm_up(probe, cfg.max_num_batched_tokens)
        peak = torch.cuda.max_memory_allocated(m.device) - probe.total_bytes
        del probe
        torch.cuda.empty_cache()
        free, total = torch.cuda.mem_get_info(m.device)
        others = (total - free) - torch.cuda.memory_reserved(m.device)
        budget = cuda_kv_budget(total, others, peak, cfg.gpu_memory_utilization, cfg.gpu_memory_cap_bytes)
        return max(budget // per_block, 0)

    def _warm_up(self, kv: KVCache, num_tokens: int) -> None:
        groups = self.kv_groups
        blocks = GroupedBlockManager(kv.num_blocks, kv.block_size, False, groups.windows)
        num_tokens = min(num_tokens, blocks.capacity_tokens)
        runner = ModelRunner(
            self.loaded.model, kv, self.loaded.device, forward=self.forward, rope=self.rope,
            layer_group=groups.layer_group if groups.count > 1 else (),
        )  # fmt: skip
        warm = Request("warm-up", [0] * num_tokens, SamplingParams(max_tokens=1), arrival_time=0.0)
        blocks.allocate_slots(warm.request_id, num_tokens)
        runner.execute([ScheduledRequest(warm, num_tokens)], {warm.request_id: blocks.tables("warm-up")})
        runner.release(warm.request_id)

    def warm_up(self) -> None:
        """One full-budget forward through the real pool, so the first user request does not pay for it."""
        self._warm_up(self.kv, self.config.max_num_batched_tokens)

    # -- requests --------------------------------------------------------------------------------------

    def add_request(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        params: SamplingParams,
        arrival_time: float | None = None,
        tenant: Tenant | None = None,
    ) -> None:
        """Queue a request for tenant (None: the one anonymous default tenant); raises InvalidRequestError
        (ContextLengthError) or QueueFullError."""
        check_prompt(prompt_token_ids, (t for t, _ in params.logit_bias), self.vocab_size)
        req = Request(
            request_id=request_id,
            prompt_token_ids=list(prompt_token_ids),
            params=params,
            arrival_time=time.monotonic() if arrival_time is None else arrival_time,
            eos_token_ids=self.eos_token_ids,
            tenant=tenant or DEFAULT_TENANT,
        )
        grammar = self.grammars.get(params.guided) if params.guided is not None else None
        error = refusal(grammar) if grammar is not None and grammar.done() else None
        if error is not None:
            raise error
        # A grammar still compiling holds its request out of the queue; every other request keeps stepping.
        held = grammar is not None and not grammar.done()
        self.scheduler.add_request(req, held=held)
        if held:
            self._compiling[request_id] = grammar  # type: ignore[assignment]
        elif grammar is not None:
            self.guided.start(request_id, grammar.result())
        self._detokenizers[request_id] = IncrementalDetokenizer(self.tokenizer, req.prompt_token_ids, params.stop)

    def abort(self, request_ids: Sequence[str]) -> list[RequestOutput]:
        for rid in request_ids:
            self._compiling.pop(rid, None)
        return [self._final(req, "") for req in self.scheduler.abort_requests(request_ids)]

    def has_work(self) -> bool:
        return self.scheduler.has_work()

    def take_rejected(self) -> list[Rejected]:
        """Requests refused after they were accepted (their grammar failed to compile), since the last call."""
        rejected, self._rejected = self._rejected, []
        return rejected

    def _queue_compiled(self) -> None:
        """Queue the held requests whose grammar is ready; refuse those whose grammar failed."""
        if not self.scheduler.waiting and not self.scheduler.running:
            wait(self._compiling.values(), timeout=GRAMMAR_WAIT_S, return_when=FIRST_COMPLETED)
        for rid, grammar in list(self._compiling.items()):
            if not grammar.done():
                continue
            del self._compiling[rid]
            error = refusal(grammar)
            if error is None:
                self.guided.start(rid, grammar.result())
                self.scheduler.release_held(rid)
            else:
                self.scheduler.finish_request(rid, RequestStatus.FINISHED_ABORTED)
                del self._detokenizers[rid]
                self._rejected.append(Rejected(rid, "invalid", str(error), error.param))

    def step(self) -> list[RequestOutput]:
        if self._compiling:
            self._queue_compiled()
        out = self.scheduler.schedule()
        if out.empty:
            return []
        tables = {s.request.request_id: self.blocks.tables(s.request.request_id) for s in out.scheduled}
        result = self.runner.execute(out.scheduled, tables)
        advanced = self.scheduler.update(out, result.sampled)
        if self.reclaims:
            for s in out.scheduled:
                self.blocks.release_behind(s.request.request_id, s.request.num_computed_tokens)
        self.tracker.steps_total += 1
        outputs = []
        for req in advanced:
            token = req.output_token_ids[-1]
            self.tracker.generation_tokens_total += 1
            if len(req.output_token_ids) == 1:  # its prefill just ended: prompt tokens count now, as vLLM's do
                self.tracker.prompt_tokens_total += req.num_prompt_tokens
            detok = self._detokenizers[req.request_id]
            delta, stopped = detok.add_tokens([token])
            if stopped:
                self.scheduler.finish_request(req.request_id, RequestStatus.FINISHED_STOPPED, detok.stop_string)
            if self.guided.active and self.guided.accept(req.request_id, token):
                # The grammar is complete (it took a stop token) or, never expected, refused the token.
                self.scheduler.finish_request(req.request_id, RequestStatus.FINISHED_STOPPED)
            logprobs = self._logprobs(token, result.logprobs.get(req.request_id))
            if req.status.finished:
                outputs.append(self._final(req, delta, logprobs, [token]))
            else:
                output = RequestOutput(req.request_id, [token], delta, logprobs=logprobs)
                if len(req.output_token_ids) == 1:  # a request cut short later still knows when it was scheduled
                    output.timings = self._timings(req)
                outputs.append(output)
        return outputs

    def _timings(self, req: Request) -> Timings:
        return Timings(req.arrival_time, req.scheduled_time, req.first_token_time, req.finished_time)

    def _final(
        self,
        req: Request,
        delta: str,
        logprobs: list[Logprob] | None = None,
        token_ids: list[int] | None = None,
    ) -> RequestOutput:
        detok = self._detokenizers.pop(req.request_id)
        if detok.stop_string is None:
            delta += detok.flush()
        self.runner.release(req.request_id)
        self.tracker.record_finished(req)
        return RequestOutput(
            request_id=req.request_id,
            token_ids=token_ids or [],
            text=delta,
            finished=True,
            finish_reason=req.finish_reason,
            stop_reason=req.stop_reason,
            logprobs=logprobs,
            usage=Usage(req.num_prompt_tokens, len(req.output_token_ids), req.num_cached_prompt_tokens),
            timings=self._timings(req),
        )

    def _logprobs(self, token: int, top: TopLogprobs | None) -> list[Logprob] | None:
        if top is None:
            return None

        def decode(token_id: int) -> str:
            return str(self.tokenizer.decode([token_id]))

        alternatives = [(i, decode(i), lp) for i, lp in zip(top.top_ids, top.top_logprobs, strict=True)]
        return [Logprob(token, decode(token), top.token_logprob, alternatives)]

    # -- reporting -------------------------------------------------------------------------------------

    def model_info(self) -> ModelInfo:
        m = self.loaded
        return ModelInfo(
            name=m.name,
            max_model_len=m.max_model_len,
            tokenizer_dir=str(m.source_dir),
            eos_token_ids=sorted(m.eos_token_ids),
            device=str(m.device),
            dtype=str(m.dtype).removeprefix("torch."),
            quantization=m.quantization,
            num_kv_blocks=self.kv.num_blocks,
            block_size=self.kv.block_size,
            kv_bytes_per_block=self.kv.bytes_per_block,
            kv_cache_dtype=self.config.kv_cache_dtype,
            kv_groups=self.kv_groups.count,
            tokenizer_class=tokenizer_class_name(self.tokenizer),
        )

    def stats(self) -> EngineStats:
        now = time.monotonic()
        if now - self._memory_time > 1.0:  # reading free memory costs more than a step's bookkeeping
            self._memory = device_memory(self.loaded.device)
            self._memory_time = now
        kind, total, free = self._memory
        t = self.tracker
        return EngineStats(
            running=len(self.scheduler.running),
            waiting=len(self.scheduler.waiting) + len(self.scheduler.held),
            kv_blocks_total=self.blocks.num_blocks,
            kv_groups=list(self.kv_groups.windows) if self.reclaims else [None] * self.kv_groups.count,
            kv_blocks_used=self.blocks.num_used_blocks,
            kv_blocks_cached=self.blocks.num_cached_blocks,
            block_size=self.blocks.block_size,
            memory_kind=kind,
            weights_bytes=self.loaded.weights_bytes,
            kv_pool_bytes=self.kv.total_bytes,
            device_memory_total=total,
            device_memory_free=free,
            preemptions_total=self.scheduler.num_preemptions,
            prefix_cache_queries=self.blocks.prefix_queries,
            prefix_cache_hits=self.blocks.prefix_hits,
            prompt_tokens_total=t.prompt_tokens_total,
            generation_tokens_total=t.generation_tokens_total,
            requests_finished_total=t.requests_finished_total,
            steps_total=t.steps_total,
            recent_queue_wait=list(t.recent_queue_wait),
            recent_ttft=list(t.recent_ttft),
            recent_tpot=list(t.recent_tpot),
            time=now,
            tenants=self.scheduler.book.snapshot(now),
            queue=[r.request_id for r in self.scheduler.waiting.ordered(QUEUE_SNAPSHOT)],
            admission_rate=self.scheduler.book.admission_rate,
            kv_cache_dtype=self.config.kv_cache_dtype,
        )


def cuda_kv_budget(total: int, others: int, peak: int, utilization: float, cap: int | None) -> int:
    """Bytes left for the KV pool on a card of `total` bytes: the usable share of the card (capped, so a 24 GB
    card can be emulated on a larger one) minus other processes' memory and this process's peak (weights plus
    the worst-case forward's activations)."""
    usable = int(total * utilization)
    if cap is not None:
        usable = min(usable, cap)
    return max(usable - others - peak, 0)
