"""slow_operator: one rank's attention implementation switched from "sdpa" to "eager" by config.

Llama reads `config._attn_implementation` on every forward, so inside the window the guilty rank
computes attention as explicit `aten::matmul` → `aten::softmax` → `aten::matmul` (with a 4-D mask)
instead of one `aten::scaled_dot_product_attention`, as a deployment with a mis-set
`attn_implementation` does. The other ranks keep sdpa and wait for it at the o_proj all-reduce.
"""

from __future__ import annotations

from transformers import LlamaForCausalLM

from teller.lab.serve.model import set_attention

FAULT_IMPLEMENTATION = "eager"


def apply(model: LlamaForCausalLM, active: bool, normal_implementation: str) -> None:
    set_attention(model, FAULT_IMPLEMENTATION if active else normal_implementation)
