"""Continuous batching, shaped like vLLM V1's scheduler: a waiting queue and a running batch.

Every step decodes one token for each running request and admits waiting requests as prefills
while the batch has room (`max_num_seqs`) and the step's token budget (`max_num_batched_tokens`)
lasts, so a step is prefill-only, decode-only or mixed. Only rank 0 schedules; the other ranks
execute the `StepPlan` it publishes, as vLLM's workers execute the engine core's scheduler output.
"""

from __future__ import annotations

import collections
from dataclasses import asdict, dataclass, field

from teller.lab.serve.workload import Request


@dataclass
class StepPlan:
    """What every rank runs in one engine step, and which caches to free before it."""

    index: int
    prefill_ids: list[str] = field(default_factory=list)
    prefill_prompts: list[list[int]] = field(default_factory=list)
    decode_ids: list[str] = field(default_factory=list)
    free_ids: list[str] = field(default_factory=list)
    stop: bool = False
    # "start" or "stop": every rank toggles its profiler before this step, so all rank traces
    # of one capture (named by `capture_id`) hold the same steps
    profile: str = ""
    capture_id: str = ""
    # a plan that only carries a profiler toggle while the engine has no work: not a step
    idle: bool = False
    # the limits it was scheduled under kept out work the configured ones would have run
    # (scheduler_misconfig acted in this step; the lab's labels name such steps)
    held_back: bool = False

    @property
    def context_tokens(self) -> int:
        return sum(len(prompt) for prompt in self.prefill_prompts)

    @property
    def annotation(self) -> str:
        """The step's profiler annotation: vLLM's shape, which teller.callchain.steps parses."""
        return (
            f"execute_context_{len(self.prefill_ids)}({self.context_tokens})"
            f"_generation_{len(self.decode_ids)}({len(self.decode_ids)})"
        )

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> StepPlan:
        return cls(**data)


@dataclass
class _Running:
    request: Request
    generated_tokens: int = 0


class Scheduler:
    """Decides each step's batch; `complete` advances the requests a step ran."""

    def __init__(self, max_num_seqs: int, max_num_batched_tokens: int) -> None:
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: collections.deque[Request] = collections.deque()
        self.running: dict[str, _Running] = {}
        self._to_free: list[str] = []
        self._steps = 0

    def add(self, request: Request) -> None:
        self.waiting.append(request)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self, max_num_seqs: int | None = None, max_tokens: int | None = None) -> StepPlan:
        """The next step's plan; limits may be overridden for this step (scheduler_misconfig),
        and the plan says whether they kept out work the configured limits would have run."""
        max_num_seqs = max_num_seqs or self.max_num_seqs
        max_tokens = max_tokens or self.max_num_batched_tokens
        plan = StepPlan(index=self._steps, free_ids=self._to_free)
        self._to_free = []
        decodes, admitted = self._batch(max_num_seqs, max_tokens)
        configured = self._batch(self.max_num_seqs, self.max_num_batched_tokens)
        plan.held_back = decodes < configured[0] or admitted < configured[1]
        plan.decode_ids = list(self.running)[:decodes]
        for _ in range(admitted):
            request = self.waiting.popleft()
            plan.prefill_ids.append(request.request_id)
            plan.prefill_prompts.append(request.prompt_ids)
        return plan

    def _batch(self, max_num_seqs: int, max_tokens: int) -> tuple[int, int]:
        """How many running requests a step under these limits decodes, and how many waiting
        ones it admits, in order (the queue is left as it is)."""
        decodes = min(len(self.running), max_num_seqs)
        budget, admitted = max_tokens - decodes, 0
        for request in self.waiting:
            if decodes + admitted >= max_num_seqs:
                break
            prompt_len = len(request.prompt_ids)
            # a prompt over the whole budget still runs alone rather than starving forever
            alone = decodes == 0 and admitted == 0
            if prompt_len > budget and not alone:
                break
            admitted += 1
            budget -= prompt_len
        return decodes, admitted

    def complete(self, plan: StepPlan, requests: dict[str, Request]) -> list[str]:
        """Count the token each scheduled request produced; return the requests that finished."""
        self._steps += 1
        for request_id in plan.prefill_ids:
            self.running[request_id] = _Running(requests[request_id])
        finished = []
        for request_id in plan.decode_ids + plan.prefill_ids:
            state = self.running[request_id]
            state.generated_tokens += 1
            if state.generated_tokens >= state.request.max_new_tokens:
                finished.append(request_id)
                del self.running[request_id]
        self._to_free.extend(finished)
        return finished
