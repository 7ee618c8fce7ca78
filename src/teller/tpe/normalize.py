"""Node kinds: the base alphabet of TPE, a node's layer plus its name with the run-specific parts cut.

Two nodes are the same *kind* when they did the same thing: the same kernel with other template
arguments, the same Python frame at another line, the same vLLM step with other batch counts. The
rules below strip what varies between runs (template arguments, parameter lists, hex addresses,
line numbers, numbers that are sizes or ids) and keep what names the work (namespace, function,
collective algorithm). Normalisation is lossy on purpose; TPE keeps each node's exact name as a
residual, so nothing is lost end to end.

Rules, applied in this order (examples are names from the real traces in ../shared/traces):

| # | layers | rule | example → kind |
|---|--------|------|----------------|
| 1 | all | drop hex addresses (` at 0x…`) | `<built-in method append of list object at 0x7f17c92d5f40>` → `<built-in method append of list object>` |
| 2 | engine | vLLM step: counts dropped | `execute_8192_context_9(sq8155sk8430…)_generation_37(sq37…)` → `execute_context(...)_generation(...)` |
| 3 | engine | SGLang step: batch size and tokens dropped | `step[EXTEND bs=15 toks=15360]` → `step[EXTEND]` |
| 4 | all | `#N` step / call counters dropped | `ProfilerStep#550` → `ProfilerStep` |
| 5 | all | content hashes (16+ chars of letters and digits) → `*` | `## Call CompiledFxGraph fb3en3pmdtsn2pziyq6… ##` → `## Call CompiledFxGraph * ##` |
| 6 | python | line numbers and eval counters dropped | `vllm/forward_context.py(252): get_forward_context` → `vllm/forward_context.py: get_forward_context`; `<eval_with_key>.50(4): forward` → `<eval_with_key>: forward` |
| 7 | python | module instance numbers dropped | `nn.Module: Qwen3DecoderLayer_25` → `nn.Module: Qwen3DecoderLayer` |
| 8 | kernel, comm | Itanium-mangled names demangled to their qualified name; `ck_tile::kentry` keeps its kernel argument | `_ZN5aiter24add_rmsnorm_quant_kernelIDF16b…` → `aiter::add_rmsnorm_quant_kernel`; `_ZN7ck_tile6kentryILi1ENS_12Rmsnorm2dFwdI…` → `ck_tile::kentry<Rmsnorm2dFwd>` |
| 9 | kernel, comm | C++ signatures: `(anonymous namespace)` → `anon`, template arguments and parameter list dropped, return type dropped | `void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<int>, …>(int, …)` → `at::native::vectorized_elementwise_kernel`; `std::enable_if<!(false), void>::type internal::gemvx::kernel<int, …>(…)` → `internal::gemvx::kernel`; `ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*, …)` → `ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t` (algorithm, op and type kept) |
| 10 | kernel | Tensile GEMM tuning suffix (macro tile onwards) dropped | `Cijk_Alik_Bljk_BBS_BH_Bias_HA_S_SAV_UserArgs_MT256x192x64_MI16x16x1_SN_…` → `Cijk_Alik_Bljk_BBS_BH_Bias_HA_S_SAV_UserArgs` |
| 11 | kernel | Triton argument signatures dropped | `triton__0d1d2d3d4d5d` → `triton_` |
| 12 | all but runtime, memcpy, memset, sync | trailing `_N` instance ids dropped | `triton_poi_fused__to_copy_1` → `triton_poi_fused__to_copy`; `sglang_profiler::mha__mha_batch_prefill_167` → `sglang_profiler::mha__mha_batch_prefill` |
| 13 | cpu_op, engine, python | numbered path segments → `N` | `FSDP::pre_forward (encoder.block.7.layer.0)` → `FSDP::pre_forward (encoder.block.N.layer.N)` |

Names the rules do not touch stay as they are (`aten::mm`, `cudaLaunchKernel`,
`Memcpy HtoD (Pinned -> Device)`, `nccl:all_reduce`, `volta_sgemm_128x64_nt`: cuBLAS/cuDNN kernel
names carry their tile shape, which names a distinct library kernel, and are kept).
"""

from __future__ import annotations

import re
from functools import lru_cache

_HEX = re.compile(r"\s*(?:\bat\s+)?0x[0-9a-fA-F]+")
_VLLM_STEP = re.compile(r"^execute_(?:\d+_)?context_\d+\([^)]*\)_generation_\d+\([^)]*\)")
_SGLANG_STEP = re.compile(r"^step\[([A-Z_]+)?[^\]]*\]")
_COUNTER = re.compile(r"#\d+$")
_HASH = re.compile(r"\b(?=[a-z0-9]*\d)(?=[a-z0-9]*[a-z])[a-z0-9]{16,}\b")
_PY_LINE = re.compile(r"^(.*?)(?:\.\d+)?\(\d+\): ")
_MODULE_INSTANCE = re.compile(r"^(nn\.Module: \w+?)_\d+$")
_TENSILE = re.compile(r"^(Cijk_\w+?)_MT\d+x\d+x\d+.*$")
_TRITON_SIGNATURE = re.compile(r"^(triton_\w*?)_(?:\d+d)+\d*$")
_TRAILING_ID = re.compile(r"(?<=[A-Za-z_])_\d+$")
_PATH_NUMBER = re.compile(r"(?<=\.)\d+(?=[.)\s]|$)")
_ANONYMOUS = re.compile(r"\(anonymous namespace\)|<unnamed>")

#: Template wrappers whose first argument names the real kernel (kept as `wrapper<Argument>`).
WRAPPER_TEMPLATES = frozenset({"ck_tile::kentry"})

_SIGNATURE_LAYERS = frozenset({"kernel", "comm"})
_KEEP_ID_LAYERS = frozenset({"runtime", "memcpy", "memset", "sync"})
_PATH_LAYERS = frozenset({"cpu_op", "engine", "python"})


@lru_cache(maxsize=1 << 16)
def normalize(layer: str, name: str) -> str:
    """The kind name of a node: `name` with the rules of this module's docstring applied."""
    out = _HEX.sub("", name)
    if layer == "engine":
        if _VLLM_STEP.match(out):
            return "execute_context(...)_generation(...)"
        if match := _SGLANG_STEP.match(out):
            return f"step[{match[1] or ''}]"
    out = _COUNTER.sub("", out)
    out = _HASH.sub("*", out)
    if layer == "python":
        out = _PY_LINE.sub(r"\1: ", out)
        out = _MODULE_INSTANCE.sub(r"\1", out)
    if layer in _SIGNATURE_LAYERS:
        if out.startswith("_Z"):
            out = demangle_name(out) or out
        elif "<" in out or "(" in out:
            out = _strip_signature(out)
    if layer == "kernel":
        out = _TENSILE.sub(r"\1", out)
        out = _TRITON_SIGNATURE.sub(r"\1", out)
    if layer not in _KEEP_ID_LAYERS:
        out = _TRAILING_ID.sub("", out)
    if layer in _PATH_LAYERS:
        out = _PATH_NUMBER.sub("N", out)
    return out.strip() or name


def _strip_signature(name: str) -> str:
    """`void ns::f<T, U<V>>(int, …)` → `ns::f`: templates, parameters and return type dropped."""
    name = _ANONYMOUS.sub("anon", name)
    kept: list[str] = []
    angle = 0
    for char in name:
        if char == "<":
            angle += 1
        elif char == ">" and angle:
            angle -= 1
        elif angle == 0:
            if char == "(":
                break
            kept.append(char)
    head = "".join(kept).strip()
    return head.rsplit(" ", 1)[-1] if head else name


def demangle_name(mangled: str) -> str | None:
    """The qualified name of an Itanium-mangled symbol (`_ZN5aiter3fooI…` → `aiter::foo`).

    Only the nested name is read (no types, no arguments): that is all a node kind needs. Returns
    None for shapes this small reader does not know.
    """
    pos = 2
    parts: list[str] = []
    nested = mangled.startswith("_ZN")
    if nested:
        pos = 3
        while pos < len(mangled) and mangled[pos] in "rVKL":  # cv-qualifiers
            pos += 1
    while pos < len(mangled) and mangled[pos].isdigit():
        length_end = pos
        while length_end < len(mangled) and mangled[length_end].isdigit():
            length_end += 1
        length = int(mangled[pos:length_end])
        parts.append(mangled[length_end : length_end + length])
        pos = length_end + length
        if not nested:
            break
    if not parts:
        return None
    qualified = "::".join(parts)
    if qualified in WRAPPER_TEMPLATES and pos < len(mangled) and mangled[pos] == "I":
        argument = _first_template_name(mangled, pos + 1)
        if argument:
            return f"{qualified}<{argument}>"
    return qualified


def _first_template_name(mangled: str, pos: int) -> str | None:
    """The first source name in a template argument list, skipping literals and substitutions."""
    while pos < len(mangled):
        char = mangled[pos]
        if char == "L":  # literal: L <type> <value> E
            end = mangled.find("E", pos)
            if end < 0:
                return None
            pos = end + 1
        elif char == "N":
            pos += 1
        elif char == "S":  # substitution S_ or S<seq-id>_
            end = mangled.find("_", pos)
            if end < 0:
                return None
            pos = end + 1
        elif char.isdigit():
            length_end = pos
            while length_end < len(mangled) and mangled[length_end].isdigit():
                length_end += 1
            length = int(mangled[pos:length_end])
            return mangled[length_end : length_end + length] or None
        else:
            return None
    return None
