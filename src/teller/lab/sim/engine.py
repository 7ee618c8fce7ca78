"""The serving engine's scheduler: continuous batching with chunked prefill, a KV cache, preemption.

It follows vLLM V1's policy: every step first gives each running request that finished its prefill
one decode token, then fills the token budget with prefill chunks (unfinished prefills first, then
waiting requests in arrival order). A decode that needs a new KV block when none is free preempts
the most recently admitted request (recompute mode: its blocks are freed and its prompt plus the
tokens generated so far are prefilled again later). Step durations come from the rank model, so the
scheduler plans one step, the ranks run it, and `complete` books the result. `reserve` holds part
of the cache out of use (the kv_pressure fault's smaller cache).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class EngineConfig:
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    kv_blocks: int = 4096
    block_size: int = 16
    cuda_graphs: bool = True  # decode-only steps replay CUDA graphs, others run eagerly
    max_graph_batch: int = 512
    step_overhead_ns: int = 150_000  # scheduler + input preparation between steps


@dataclass(frozen=True)
class WorkloadConfig:
    """Request arrivals and lengths: Poisson arrivals, log-normal prompt and output lengths."""

    rate_per_s: float = 100.0
    initial_requests: int = 48  # a backlog at the start, so a short run is already under load
    prompt_median: int = 512
    prompt_sigma: float = 0.8
    output_median: int = 128
    output_sigma: float = 0.6
    max_prompt: int = 8192
    max_output: int = 1024


@dataclass
class Request:
    index: int
    request_id: str
    arrival_ns: int
    prompt_tokens: int
    output_tokens: int
    computed: int = 0  # tokens whose KV is in the cache
    generated: int = 0
    blocks: int = 0
    first_scheduled_ns: int = -1
    first_token_ns: int = -1
    finish_ns: int = -1
    preemptions: int = 0
    prefill_ns: int = 0
    decode_ns: int = 0

    @property
    def engine_id(self) -> str:
        """The id the engine core prints: V1 appends `-<8 hex>` to the API server's id."""
        return f"{self.request_id}-{self.index:08x}"

    @property
    def target(self) -> int:
        """Tokens that must be in the cache before the next token can be sampled: the prompt and
        every token generated so far (the last one's KV comes from the step that samples next)."""
        return self.prompt_tokens + self.generated

    @property
    def prefilling(self) -> bool:
        """Nothing sampled yet, or more than the last sampled token is missing from the cache (a
        recompute after preemption); else the next step is a one-token decode."""
        return self.generated == 0 or self.computed < self.target - 1


@dataclass
class StepPlan:
    index: int
    start_ns: int
    prefill: list[tuple[Request, int, int]]  # (request, chunk tokens, tokens already cached)
    decode: list[tuple[Request, int]]  # (request, context length)
    preempted: list[Request] = field(default_factory=list)
    resumed: list[Request] = field(default_factory=list)
    graph: bool = False
    #: limits lowered below the engine's own (a scheduler fault) stopped the plan with work still
    #: to run that the engine's own limits would have taken (a request waiting for a seat or a
    #: chunk, a prompt cut into a chunk, a decode left out); the engine's own limits binding, or a
    #: full KV cache, do not count
    held_back: bool = False

    @property
    def context_tokens(self) -> int:
        return sum(chunk for _, chunk, _ in self.prefill)

    @property
    def tokens(self) -> int:
        return self.context_tokens + len(self.decode)

    @property
    def kind(self) -> str:
        if self.prefill and self.decode:
            return "mixed"
        return "prefill" if self.prefill else "decode"

    def annotation(self) -> str:
        """vLLM's step annotation: `execute_T_context_C(sq…sk…sqsq…sqsk…)_generation_G(…)`."""
        sq = [chunk for _, chunk, _ in self.prefill]
        sk = [chunk + cached for _, chunk, cached in self.prefill]
        gen_sk = [ctx for _, ctx in self.decode]
        context = _shape(sq, sk)
        generation = _shape([1] * len(self.decode), gen_sk)
        return (
            f"execute_{self.tokens}_context_{len(self.prefill)}({context})"
            f"_generation_{len(self.decode)}({generation})"
        )


def _shape(sq: list[int], sk: list[int]) -> str:
    sqsq = sum(q * q for q in sq)
    sqsk = sum(q * k for q, k in zip(sq, sk, strict=True))
    return f"sq{sum(sq)}sk{sum(sk)}sqsq{sqsq}sqsk{sqsk}"


class Scheduler:
    """Plans steps for one replica; deterministic given its random generator."""

    def __init__(
        self,
        engine: EngineConfig,
        workload: WorkloadConfig,
        rng: np.random.Generator,
        start_ns: int,
        replica: int,
    ) -> None:
        self.engine = engine
        #: the limits the engine was started with; a fault may lower `engine` for a while
        self.configured = engine
        self.workload = workload
        self.rng = rng
        self.replica = replica
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.free_blocks = engine.kv_blocks
        self.reserved_blocks = 0  # held out of use by `reserve`
        self.next_arrival_ns = start_ns
        self.arrived: list[Request] = []  # arrivals not yet reported (for logs)
        self.finished: list[Request] = []  # finished, not yet reported
        self.count = 0
        self.backlog = workload.initial_requests
        self.prompt_scale = 1.0  # workload_shift raises it inside its window
        self.preemptions_total = 0

    # -- arrivals --------------------------------------------------------------------------------
    def _arrive_until(self, now_ns: int) -> None:
        while self.next_arrival_ns <= now_ns:
            w = self.workload
            prompt = int(
                w.prompt_median
                * self.prompt_scale
                * math.exp(w.prompt_sigma * self.rng.standard_normal())
            )
            output = int(w.output_median * math.exp(w.output_sigma * self.rng.standard_normal()))
            request = Request(
                index=self.count,
                request_id=f"cmpl-{self.rng.bytes(16).hex()}-0",
                arrival_ns=self.next_arrival_ns,
                prompt_tokens=min(max(prompt, 4), w.max_prompt),
                output_tokens=min(max(output, 1), w.max_output),
            )
            self.count += 1
            self.waiting.append(request)
            self.arrived.append(request)
            if self.backlog > 0:
                self.backlog -= 1
                continue
            gap_s = self.rng.exponential(1.0 / w.rate_per_s)
            self.next_arrival_ns += max(int(gap_s * 1e9), 1)

    # -- capacity --------------------------------------------------------------------------------
    def reserve(self, blocks: int) -> None:
        """Hold `blocks` of the KV cache out of use (a smaller cache), called before each plan.

        Only free blocks are taken: what running requests hold is taken as they finish or are
        preempted (each later call takes more), so the cache is never over-committed and usage
        stays at most 100%. A smaller target gives blocks back at once."""
        if blocks < self.reserved_blocks:
            self.free_blocks += self.reserved_blocks - blocks
            self.reserved_blocks = blocks
        else:
            take = min(blocks - self.reserved_blocks, self.free_blocks)
            self.free_blocks -= take
            self.reserved_blocks += take

    # -- planning --------------------------------------------------------------------------------
    def plan(self, index: int, now_ns: int) -> StepPlan:
        self._arrive_until(now_ns)
        if not self.running and not self.waiting:
            now_ns = self.next_arrival_ns
            self._arrive_until(now_ns)
        e = self.engine
        budget = e.max_num_batched_tokens
        plan = StepPlan(index=index, start_ns=now_ns, prefill=[], decode=[])
        decoding = [r for r in self.running if not r.prefilling]
        starved = False
        for request in decoding:
            if request not in self.running:
                continue  # preempted to make room earlier in this loop
            context = request.computed + 1
            while self._blocks_needed(request, context) > 0 and not self._take(
                request, self._blocks_needed(request, context)
            ):
                victim = self.running[-1]
                self._preempt(victim, plan)
                if victim is request:
                    break
            if request in self.running and budget > 0:
                plan.decode.append((request, context))
                budget -= 1
            elif request in self.running:
                starved = True  # the budget ran out before this request's next token
        for request in [r for r in self.running if r.prefilling]:
            if budget <= 0:
                starved = True  # a started prompt gets no chunk this step
                break
            chunk = min(request.target - request.computed, budget)
            if chunk <= 0 or not self._take(
                request, self._blocks_needed(request, request.computed + chunk)
            ):
                continue
            plan.prefill.append((request, chunk, request.computed))
            budget -= chunk
        while self.waiting and budget > 0 and len(self.running) < e.max_num_seqs:
            request = self.waiting[0]
            chunk = min(request.target - request.computed, budget)
            if not self._take(request, self._blocks_needed(request, request.computed + chunk)):
                break
            self.waiting.popleft()
            self.running.append(request)
            if request.first_scheduled_ns < 0:
                request.first_scheduled_ns = now_ns
            elif request.preemptions:
                plan.resumed.append(request)
            plan.prefill.append((request, chunk, request.computed))
            budget -= chunk
        plan.graph = (
            e.cuda_graphs and not plan.prefill and 0 < len(plan.decode) <= e.max_graph_batch
        )
        cut = any(computed + chunk < request.target for request, chunk, computed in plan.prefill)
        plan.held_back = self._held_back_below_configured(budget <= 0, cut or starved, plan)
        return plan

    def _held_back_below_configured(self, spent: bool, chunk_left: bool, plan: StepPlan) -> bool:
        """Whether the lowered limits kept out work the configured ones would have run.

        Why: a scheduler fault labels only the steps it changed; where the engine's own batch
        size already binds (a saturated replica), lowering it further changes nothing."""
        own = self.configured
        seat_free = len(self.running) < own.max_num_seqs and self.free_blocks > 0
        admits = bool(self.waiting) and seat_free
        by_budget = spent and plan.tokens < own.max_num_batched_tokens and (chunk_left or admits)
        by_seats = admits and len(self.running) >= self.engine.max_num_seqs
        return by_budget or by_seats

    def _blocks_needed(self, request: Request, tokens: int) -> int:
        return max(math.ceil(tokens / self.engine.block_size) - request.blocks, 0)

    def _take(self, request: Request, blocks: int) -> bool:
        if blocks > self.free_blocks:
            return False
        self.free_blocks -= blocks
        request.blocks += blocks
        return True

    def _preempt(self, request: Request, plan: StepPlan) -> None:
        self.running.remove(request)
        self.free_blocks += request.blocks
        request.blocks = 0
        request.computed = 0
        request.preemptions += 1
        self.preemptions_total += 1
        self.waiting.appendleft(request)
        plan.preempted.append(request)

    # -- booking ---------------------------------------------------------------------------------
    def complete(self, plan: StepPlan, end_ns: int) -> None:
        step_ns = end_ns - plan.start_ns
        for request, chunk, _ in plan.prefill:
            request.computed += chunk
            request.prefill_ns += step_ns
            if request.computed >= request.target:
                request.generated += 1
                if request.first_token_ns < 0:
                    request.first_token_ns = end_ns
        for request, _ in plan.decode:
            request.computed += 1
            request.generated += 1
            request.decode_ns += step_ns
        for request in list(self.running):
            if request.generated >= request.output_tokens:
                self.running.remove(request)
                self.free_blocks += request.blocks
                request.blocks = 0
                request.finish_ns = end_ns
                self.finished.append(request)

    @property
    def kv_usage(self) -> float:
        """Share of the cache in use, of the blocks not reserved (what a smaller cache reports)."""
        capacity = max(self.engine.kv_blocks - self.reserved_blocks, 1)
        return 1.0 - self.free_blocks / capacity
