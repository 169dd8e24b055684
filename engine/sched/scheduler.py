"""Iteration-level scheduler: waiting queue, token budget with chunked prefill, admission by free KV blocks,
preemption by recompute, and the fair / fcfs / static / sequential policies. Pure Python, no torch.

fair admits the tenant with the smallest fair-share counter first and takes a seat back for a tenant below its
share (engine.sched.fair); fcfs ("continuous") admits in arrival order. Both refill seats at every step.

It is the only place that changes a request's status and computed-token count.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from engine.errors import QueueFullError
from engine.sched.block_manager import BlockManager
from engine.sched.fair import TenantBook
from engine.sched.limits import check_fits
from engine.sched.policy import Policy
from engine.sched.queues import FairQueue, FcfsQueue, WaitingQueue
from engine.sched.request import Request, RequestStatus


@dataclass(slots=True)
class ScheduledRequest:
    request: Request
    num_new_tokens: int

    @property
    def samples(self) -> bool:
        """True when this step computes the request's last known token, so its logits give the next one."""
        return self.request.num_computed_tokens + self.num_new_tokens == self.request.num_tokens


@dataclass(slots=True)
class SchedulerOutput:
    scheduled: list[ScheduledRequest] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)  # for KV blocks
    reclaimed: list[Request] = field(default_factory=list)  # seats taken back for a tenant below its share
    num_batched_tokens: int = 0

    @property
    def empty(self) -> bool:
        return not self.scheduled


@dataclass(slots=True)
class SchedulerLimits:
    max_num_seqs: int
    max_num_batched_tokens: int
    max_queue: int
    max_model_len: int
    policy: Policy = Policy.FAIR

    def __post_init__(self) -> None:
        self.policy = Policy(self.policy)  # a name (a test's, a benchmark's) becomes the member compared below


class Scheduler:
    def __init__(
        self,
        limits: SchedulerLimits,
        block_manager: BlockManager,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limits = limits
        self.blocks = block_manager
        self.clock = clock
        self.book = TenantBook()  # kept under every policy: the per-tenant stats come from it
        self.waiting: WaitingQueue = FairQueue(self.book) if limits.policy is Policy.FAIR else FcfsQueue()
        self.running: list[Request] = []  # in admission order: the last is the newest
        self.requests: dict[str, Request] = {}
        # Accepted but not yet queued: a guided request whose grammar is still compiling (engine.sample.guided).
        self.held: dict[str, Request] = {}
        self.num_preemptions = 0

    # -- queue -----------------------------------------------------------------------------------------

    def check_fits(self, num_prompt_tokens: int, max_tokens: int) -> None:
        """Reject a request that could never run: beyond the model's context or the whole KV pool."""
        check_fits(num_prompt_tokens, max_tokens, self.limits.max_model_len, self.blocks.capacity_tokens)

    def add_request(self, request: Request, held: bool = False) -> None:
        """held: accept it now but queue it only at release_held, so it takes no seat before it can run."""
        if len(self.waiting) + len(self.held) >= self.limits.max_queue:
            raise QueueFullError(f"the waiting queue is full ({self.limits.max_queue} requests)")
        if request.request_id in self.requests:
            raise ValueError(f"request id {request.request_id!r} is already in use")
        self.check_fits(request.num_prompt_tokens, request.params.max_tokens)
        self.book.arrive(request)
        if held:
            self.held[request.request_id] = request
        else:
            self.waiting.push(request)
        self.requests[request.request_id] = request

    def release_held(self, request_id: str) -> None:
        """Queue a held request (unknown or finished ids are ignored)."""
        req = self.held.pop(request_id, None)
        if req is not None:
            self.waiting.push(req)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.held)

    # -- one step --------------------------------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.limits.max_num_batched_tokens
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            # Once per running request per step: no property, no builtin call it can do without.
            n = len(req.prompt_token_ids) + len(req.output_token_ids) - req.num_computed_tokens
            if n > budget:
                n = budget
            if req.num_computed_tokens + n <= req.num_kv_slots or self._grow(req, req.num_computed_tokens + n):
                out.scheduled.append(ScheduledRequest(req, n))
                budget -= n
                i += 1
                continue
            # No free block: preempt the newest request of the tenant that received the most (req itself
            # perhaps); one already scheduled this step gives its tokens back.
            v = self.book.kv_victim(self.running) if self.limits.policy is Policy.FAIR else len(self.running) - 1
            victim = self.running.pop(v)
            out.preempted.append(victim)
            if v < i:
                budget += self._unschedule(victim, out)
                i -= 1
            self._preempt(victim)
        if not out.preempted and self._may_admit():
            budget = self._admit(budget, out)
        out.num_batched_tokens = self.limits.max_num_batched_tokens - budget
        return out

    def _grow(self, req: Request, num_tokens: int) -> bool:
        if not self.blocks.allocate_slots(req.request_id, num_tokens):
            return False
        req.num_kv_slots = self.blocks.num_slots(req.request_id)
        return True

    def _unschedule(self, req: Request, out: SchedulerOutput) -> int:
        """Drop req from this step's batch; returns the tokens it had been given."""
        for k, s in enumerate(out.scheduled):
            if s.request is req:
                del out.scheduled[k]
                return s.num_new_tokens
        return 0

    def _preempt(self, req: Request) -> None:
        self.blocks.free(req.request_id)
        req.num_kv_slots = 0
        req.status = RequestStatus.PREEMPTED
        req.num_computed_tokens = 0
        req.num_preemptions += 1
        self.num_preemptions += 1
        self.book.preempted(req)
        self.waiting.push_front(req)

    def _may_admit(self) -> bool:
        # static and sequential admit a new batch only when the running batch is empty.
        return self.limits.policy.continuous or not self.running

    def _admit(self, budget: int, out: SchedulerOutput) -> int:
        """Admit waiting requests in the queue's order while seats, blocks and budget allow; under fair, take a
        seat back for a head that found none (engine.sched.fair). A static batch is admitted whole (up to
        max_num_seqs): members beyond this step's budget join it now and start computing next step."""
        policy = self.limits.policy
        max_seqs = 1 if policy is Policy.SEQUENTIAL else self.limits.max_num_seqs
        while self.waiting and (budget > 0 or policy is Policy.STATIC):
            req = self.waiting.peek()
            tokens = req.all_token_ids
            hits = self.blocks.get_computed_blocks(tokens)
            if policy.continuous and self.blocks.awaits_prefix(tokens, hits[0]):
                # A running request is computing the next blocks of this prompt (n sequences of one prompt, a
                # system prompt arriving in a burst): req shares them once cached, a step or so later, rather
                # than compute a copy; those behind it wait too, so the queue keeps its order.
                return budget
            # Seats taken back are for req alone: the victims must not win them back in the same step.
            while (n := self._seat(req, tokens, hits, budget) if len(self.running) < max_seqs else None) is None:
                v = self.book.reclaim_victim(req, self.running, max_seqs) if policy is Policy.FAIR else None
                if v is None:
                    return budget
                victim = self.running.pop(v)
                out.reclaimed.append(victim)
                budget += self._unschedule(victim, out)
                self._preempt(victim)
            if n > 0:
                out.scheduled.append(ScheduledRequest(req, n))
                budget -= n
        return budget

    def _seat(self, req: Request, tokens: list[int], hits: tuple[list[int], int], budget: int) -> int | None:
        """Admit req, the queue's head, with its prefix hits (get_computed_blocks of its tokens; seats taken
        back free blocks but evict none, so they stay valid) if its blocks can be had: returns how many of its
        tokens compute this step, or None (nothing changed) when free blocks fall short."""
        hit_blocks, num_cached = hits
        n = min(len(tokens) - num_cached, budget)
        # A static member holds blocks for its whole prompt from the start: admission is by free blocks.
        reserve = len(tokens) if self.limits.policy is Policy.STATIC else num_cached + n
        if not self.blocks.allocate_slots(req.request_id, reserve, hit_blocks):
            return None
        req.num_kv_slots = self.blocks.num_slots(req.request_id)
        self.waiting.take(req)
        self.blocks.promise(req.request_id, tokens)
        req.num_computed_tokens = num_cached
        charged = 0
        if req.scheduled_time is None:  # first admission; a preempted request's own blocks are no hit rate
            self.blocks.record_prefix_lookup(len(tokens), num_cached)
            req.scheduled_time = self.clock()
            req.num_cached_prompt_tokens = num_cached
            # VTC charges the prompt when it is admitted, so one step cannot seat a tenant many times over at
            # an unchanged counter; recomputing after a preemption is not the tenant's doing and is free.
            charged = len(tokens) - num_cached
        self.book.admitted(req, charged)
        req.status = RequestStatus.RUNNING
        self.running.append(req)
        return n

    def update(self, out: SchedulerOutput, sampled: dict[str, int]) -> list[Request]:
        """Advance computed counts, append sampled tokens, finish requests that hit EOS, a stop token or a
        length limit. Returns the requests that got a new token this step."""
        block_size, max_len = self.blocks.block_size, self.limits.max_model_len
        advanced: list[Request] = []
        ended: list[tuple[Request, RequestStatus]] = []
        now = self.clock()
        token_of = sampled.get
        # Once per running request per step: no call or property it can do without.
        for s in out.scheduled:
            req = s.request
            if req.status is not RequestStatus.RUNNING:
                continue
            before = req.num_computed_tokens
            req.num_computed_tokens += s.num_new_tokens
            if req.num_computed_tokens // block_size > before // block_size:
                self.blocks.cache_blocks(req.request_id, req.all_token_ids, req.num_computed_tokens)
            token = token_of(req.request_id)
            if token is None:
                continue
            req.output_token_ids.append(token)
            if req.first_token_time is None:
                req.first_token_time = now
            advanced.append(req)
            params = req.params
            if (not params.ignore_eos and token in req.eos_token_ids) or token in params.stop_token_ids:
                req.stop_reason = token
                ended.append((req, RequestStatus.FINISHED_STOPPED))
            elif (n := len(req.output_token_ids)) >= params.max_tokens or n + len(req.prompt_token_ids) >= max_len:
                ended.append((req, RequestStatus.FINISHED_LENGTH))
        self.book.generated_each(advanced)  # before any of them leaves: a tenant leaves with its last token counted
        for req, status in ended:
            self._finish(req, status, now)
        return advanced

    # -- finishing -------------------------------------------------------------------------------------

    def finish_request(self, request_id: str, status: RequestStatus, stop_reason: str | None = None) -> None:
        """Finish a request from outside the step (abort, stop string). Unknown or finished ids are ignored."""
        req = self.requests.get(request_id)
        if req is None or req.status.finished:
            return
        if stop_reason is not None:
            req.stop_reason = stop_reason
        self._finish(req, status, self.clock())

    def abort_requests(self, request_ids: Iterable[str]) -> list[Request]:
        aborted = []
        for rid in request_ids:
            req = self.requests.get(rid)
            if req is not None and not req.status.finished:
                self._finish(req, RequestStatus.FINISHED_ABORTED, self.clock())
                aborted.append(req)
        return aborted

    def _finish(self, req: Request, status: RequestStatus, now: float) -> None:
        was_running = req.status is RequestStatus.RUNNING
        if was_running:
            self.running.remove(req)
        elif self.held.pop(req.request_id, None) is None:
            self.waiting.remove(req)
        self.book.left(req, was_running)
        self.blocks.free(req.request_id)
        req.num_kv_slots = 0
        req.status = status
        req.finished_time = now
        del self.requests[req.request_id]
