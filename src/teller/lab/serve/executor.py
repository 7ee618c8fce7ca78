"""Run one step's batch through the model on this rank, with a KV cache per request.

Each request keeps its own keys and values (this rank's heads). A step batches them the way
Hugging Face batch generation does: left padding, a 2-D attention mask and explicit position ids,
so any mix of cache lengths runs in one forward. Prefills and decodes of a mixed step run as two
forwards inside the same step annotation. Sampling is greedy and identical on every rank (the
logits are gathered by the tensor-parallel plan), so ranks never need to exchange tokens.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache, LlamaForCausalLM

from teller.lab.serve.scheduler import StepPlan

#: Per request: one (keys, values) pair per layer, each [1, local heads, tokens, head dim].
RequestCache = list[tuple[torch.Tensor, torch.Tensor]]


class Executor:
    def __init__(self, model: LlamaForCausalLM, device: torch.device | None = None) -> None:
        self.model = model
        self.device = device or torch.device("cpu")
        self.caches: dict[str, RequestCache] = {}
        self.last_token: dict[str, int] = {}

    @property
    def cached_tokens(self) -> int:
        return sum(cache[0][0].shape[-2] for cache in self.caches.values())

    @torch.inference_mode()
    def execute(self, plan: StepPlan) -> None:
        for request_id in plan.free_ids:
            self.caches.pop(request_id, None)
            self.last_token.pop(request_id, None)
        if plan.decode_ids:
            tokens = [[self.last_token[r]] for r in plan.decode_ids]
            self._forward(plan.decode_ids, tokens)
        if plan.prefill_ids:
            self._forward(plan.prefill_ids, plan.prefill_prompts)

    def _forward(self, request_ids: list[str], new_tokens: list[list[int]]) -> None:
        past_lens = [self._cache_len(r) for r in request_ids]
        new_lens = [len(t) for t in new_tokens]
        past_width, new_width = max(past_lens), max(new_lens)
        batch = len(request_ids)
        input_ids = torch.zeros(batch, new_width, dtype=torch.long)
        positions = torch.zeros(batch, new_width, dtype=torch.long)
        mask = torch.zeros(batch, past_width + new_width, dtype=torch.long)
        for i, (tokens, past, new) in enumerate(zip(new_tokens, past_lens, new_lens, strict=True)):
            input_ids[i, new_width - new :] = torch.tensor(tokens)
            positions[i, new_width - new :] = torch.arange(past, past + new)
            mask[i, past_width - past : past_width] = 1
            mask[i, past_width + new_width - new :] = 1
        cache = self._batched_cache(request_ids, past_lens, past_width) if past_width else None
        if self.device.type != "cpu":  # built on the host, as an engine's input preparation is
            input_ids, positions, mask = (
                t.to(self.device, non_blocking=True) for t in (input_ids, positions, mask)
            )
        output = self.model(
            input_ids=input_ids,
            attention_mask=mask,
            position_ids=positions,
            cache=cache if cache is not None else DynamicCache(),
            use_cache=True,
            logits_to_keep=1,
        )
        next_tokens = output.logits[:, -1].argmax(dim=-1).tolist()
        full = output.cache
        for i, request_id in enumerate(request_ids):
            keep = past_lens[i] + new_lens[i]
            # a decode batch has no query padding and a prefill batch no cache, so each
            # request's tokens are the last `keep` positions once its own padding is dropped
            self.caches[request_id] = [
                _strip(
                    layer.keys[i : i + 1], layer.values[i : i + 1], keep, past_width, past_lens[i]
                )
                for layer in full.layers
            ]
            self.last_token[request_id] = next_tokens[i]

    def _cache_len(self, request_id: str) -> int:
        cache = self.caches.get(request_id)
        return cache[0][0].shape[-2] if cache else 0

    def _batched_cache(self, request_ids: list[str], past_lens: list[int], width: int):
        layers = []
        for layer in range(len(self.caches[request_ids[0]])):
            keys = [_left_pad(self.caches[r][layer][0], width) for r in request_ids]
            values = [_left_pad(self.caches[r][layer][1], width) for r in request_ids]
            layers.append((torch.cat(keys), torch.cat(values)))
        return DynamicCache(ddp_cache_data=layers)


def _left_pad(tensor: torch.Tensor, width: int) -> torch.Tensor:
    missing = width - tensor.shape[-2]
    return torch.nn.functional.pad(tensor, (0, 0, missing, 0)) if missing else tensor


def _strip(
    keys: torch.Tensor, values: torch.Tensor, keep: int, past_width: int, past_len: int
) -> tuple[torch.Tensor, torch.Tensor]:
    if past_width:  # decode: [pad | past | new token]
        start = past_width - past_len
        return keys[..., start:, :].clone(), values[..., start:, :].clone()
    return keys[..., -keep:, :].clone(), values[..., -keep:, :].clone()
