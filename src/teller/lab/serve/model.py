"""Build the lab's Llama: random seeded weights, sharded by transformers' own tensor-parallel plan.

Nothing is downloaded: the weights come from a `LlamaConfig` built in code and a seed, identical on
every rank before sharding. Tensor parallelism is transformers 5.x's path without `from_pretrained`:
`initialize_distributed_mesh(DistributedConfig(tp_size=N))` builds the device mesh on the running
process group (gloo on CPU, nccl on GPUs) and `maybe_distribute_model` applies the model's
`base_model_tp_plan` (q/k/v/gate/up colwise, o/down rowwise with an all-reduce, embedding rowwise).
"""

from __future__ import annotations

import os
from dataclasses import asdict
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from teller.lab.serve.config import ModelConfig

#: ModelConfig fields that are not LlamaConfig arguments: the attention implementation is set on
#: the built config (as `from_pretrained` does), the seed draws the weights.
_NOT_LLAMA_ARGUMENTS = ("attn_implementation", "weight_seed")


def llama_config(config: ModelConfig) -> LlamaConfig:
    """Hugging Face's config of the lab's Llama; ModelConfig's other fields keep HF's names."""
    arguments = asdict(config)
    for name in _NOT_LLAMA_ARGUMENTS:
        del arguments[name]
    hf_config = LlamaConfig(**arguments)
    hf_config._attn_implementation = config.attn_implementation
    return hf_config


def build_model(
    config: ModelConfig, tp: int, device: torch.device | None = None
) -> LlamaForCausalLM:
    """The model on this rank: full seeded weights, then this rank's shard when `tp` > 1.

    The weights are drawn on the CPU whatever the device, so every rank (and a CPU and a GPU
    run) starts from the same numbers; a GPU rank then moves them to its device before sharding,
    and transformers' mesh (built on the CUDA device type when NCCL is the backend) keeps them there.
    """
    torch.manual_seed(config.weight_seed)
    model = LlamaForCausalLM(llama_config(config)).eval()
    if device is not None and device.type != "cpu":
        model = model.to(device)
    if tp > 1:
        from transformers.distributed.configuration_utils import DistributedConfig
        from transformers.distributed.utils import initialize_distributed_mesh

        distributed = DistributedConfig(tp_size=tp)
        _, mesh = initialize_distributed_mesh(distributed)
        model = LlamaForCausalLM.maybe_distribute_model(model, distributed, mesh)
    return model


def map_weights_from_disk(model: LlamaForCausalLM, path: Path) -> int:
    """Back this rank's weights by a file mapping, as mmap-loaded checkpoints are; returns bytes.

    The weights are written to `path`, dropped from the page cache, mapped back (shared, so clean
    pages can be evicted and re-read rather than needing swap) and the file is unlinked. Every
    case runs this way, so a memory limit on one rank (memory_pressure) makes the kernel evict
    that rank's weight pages and fault them back in during its matmuls; without a limit the
    pages stay resident and cost nothing extra.
    """
    from torch.distributed.tensor import DTensor

    locals_ = []
    for parameter in model.parameters():
        local = parameter._local_tensor if isinstance(parameter, DTensor) else parameter.data
        if not any(local.data_ptr() == seen.data_ptr() for seen in locals_):  # tied weights once
            locals_.append(local)
    path.parent.mkdir(parents=True, exist_ok=True)
    offsets, total_bytes = [], 0
    with path.open("wb") as handle:
        for local in locals_:
            offsets.append(total_bytes)
            data = local.detach().contiguous().numpy().tobytes()
            handle.write(data)
            total_bytes += len(data)
        handle.flush()
        os.fsync(handle.fileno())
        os.posix_fadvise(handle.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    storage = torch.UntypedStorage.from_file(str(path), shared=True, nbytes=total_bytes)
    path.unlink()
    with torch.no_grad():
        for local, offset in zip(locals_, offsets, strict=True):
            element = local.element_size()
            local.set_(storage, offset // element, local.shape, local.stride())
    return total_bytes
