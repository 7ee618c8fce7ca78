"""slow_operator: one rank's attention kernel switched from flash to the math fallback by config.

Inside the window the guilty rank runs with PyTorch's flash SDPA backend disabled
(`torch.backends.cuda.enable_flash_sdp(False)`, which governs the CPU kernels too), as a deployment
with a disabled or unavailable fused kernel does. Llama still calls
`aten::scaled_dot_product_attention`, but it now dispatches to
`aten::_scaled_dot_product_attention_math` instead of
`aten::_scaled_dot_product_flash_attention_for_cpu`: the same node takes longer (the math path
materialises the whole attention matrix), and the other ranks wait for it at the o_proj all-reduce.
"""

from __future__ import annotations

import torch


def apply(active: bool) -> None:
    torch.backends.cuda.enable_flash_sdp(not active)
