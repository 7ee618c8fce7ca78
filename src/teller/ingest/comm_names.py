"""Recognise communication by name, for the collectives that carry no metadata.

`record_param_comms` tells us a collective's kind, group and size, but vLLM's custom all-reduce,
SGLang's pynccl calls and bare NCCL kernels (nsys captures, sampled traces) carry nothing: their name
is all there is. One table of name rules serves every reader so a collective is a collective
whatever file it came from.
"""

from __future__ import annotations

import re

#: GPU kernels that implement a collective (NCCL/RCCL, vLLM/SGLang/TRT-LLM custom all-reduce,
#: NVLS multimem and symmetric-memory one/two-shot reductions).
_COMM_KERNEL = re.compile(
    r"""
    ^(?:void\s+)?(?:\w+::)*(?:nccl|rccl)       # NCCL/RCCL kernels: the name starts with the library
    | cross_device_reduce | quick_?reduce       # custom all-reduce kernels (vLLM, SGLang, TRT-LLM)
    | custom_?all_?reduce
    | multimem                                  # NVLS multimem reductions
    | one_shot_all_reduce | two_shot_all_reduce # symmetric-memory reductions
    | all_?reduce | allgather | all_gather      # any other kernel named after its collective
    | reduce_?scatter | all_?to_?all
    """,
    re.IGNORECASE | re.VERBOSE,
)

#: Host-side operators and annotations that issue a collective.
_COMM_CPU_OP = re.compile(
    r"""
    ^(?:
        record_param_comms$                             # PyTorch's annotation of a collective
      | c10d::(?!wait|barrier_?$|monitored_barrier)\w+  # c10d's collectives, not waits or barriers
      | (?:nccl|gloo|mpi|ucc):\w+                       # a backend's own record (nccl:all_reduce)
      | _c10d_functional::(?!wait_tensor|_wrap)\w+      # functional collectives, not their waits
      | vllm::(?:all_reduce|all_gather|reduce_scatter   # vLLM's collective custom ops
          |outplace_all_reduce|inplace_all_reduce)
      | _C_custom_ar::all_reduce                        # vLLM's custom all-reduce extension
      | sglang::\w*(?:all_reduce|all_gather)\w*         # SGLang's collective custom ops
      | trtllm::\w*allreduce\w*                         # TensorRT-LLM's all-reduce ops
    )
    """,
    re.VERBOSE,
)

_KIND_RULES: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern, re.IGNORECASE), kind)
    for pattern, kind in (
        (r"all_?reduce|cross_device_reduce|quick_?reduce|multimem", "allreduce"),
        (r"reduce_?scatter", "reduce_scatter"),
        (r"all_?gather", "allgather"),
        (r"all_?to_?all", "alltoall"),
        (r"broadcast", "broadcast"),
        (r"send_?recv", "sendrecv"),
        (r"\bsend\b|:send|_send", "send"),
        (r"\brecv\b|:recv|_recv", "recv"),
        (r"barrier", "barrier"),
        (r"gather", "gather"),
        (r"scatter", "scatter"),
        (r"reduce", "reduce"),
    )
)


def is_comm_kernel(name: str) -> bool:
    return _COMM_KERNEL.search(name) is not None


def is_comm_cpu_op(name: str) -> bool:
    return _COMM_CPU_OP.match(name) is not None


def collective_kind(name: str) -> str:
    """Normalised collective kind ("allreduce", "allgather", …) from any op or kernel name."""
    for pattern, kind in _KIND_RULES:
        if pattern.search(name):
            return kind
    return "collective"
