"""Node-kind normalisation, pinned on names quoted from the real traces (normalize.py's table)."""

from __future__ import annotations

import pytest

from teller.tpe.normalize import demangle_name, normalize

CASES = [
    (
        "python",
        "<built-in method append of list object at 0x7f17c92d5f40>",
        "<built-in method append of list object>",
    ),
    (
        "engine",
        "execute_8192_context_9(sq8155sk8430sqsq7475785sqsk7671310)_generation_37(sq37sk34489sqsq37sqsk34489)",
        "execute_context(...)_generation(...)",
    ),
    ("engine", "execute_context_2(64)_generation_0(0)", "execute_context(...)_generation(...)"),
    ("engine", "step[EXTEND bs=15 toks=15360]", "step[EXTEND]"),
    ("engine", "ProfilerStep#550", "ProfilerStep"),
    (
        "engine",
        "## Call CompiledFxGraph fb3en3pmdtsn2pziyq6jiyhnewghozxvyb5vy5kk6ejlfff7gc3n ##",
        "## Call CompiledFxGraph * ##",
    ),
    (
        "python",
        "vllm/forward_context.py(252): get_forward_context",
        "vllm/forward_context.py: get_forward_context",
    ),
    ("python", "<eval_with_key>.50(4): forward", "<eval_with_key>: forward"),
    ("python", "nn.Module: Qwen3DecoderLayer_25", "nn.Module: Qwen3DecoderLayer"),
    (
        "kernel",
        "_ZN5aiter24add_rmsnorm_quant_kernelIDF16bDF16bLi256ELi16ELb0ELb0ELb1ELi1EEEvPT0_PT_PfS4_S4_S4_diiiiiiib",
        "aiter::add_rmsnorm_quant_kernel",
    ),
    (
        "kernel",
        "_ZN7ck_tile6kentryILi1ENS_12Rmsnorm2dFwdINS_27Rmsnorm2dFwdPipelineOnePassI",
        "ck_tile::kentry<Rmsnorm2dFwd>",
    ),
    (
        "kernel",
        "_ZN7ck_tile6kentryILi2ENS_38FmhaBatchPrefillWithPagedKVCacheKernelINS_40Block",
        "ck_tile::kentry<FmhaBatchPrefillWithPagedKVCacheKernel>",
    ),
    (
        "kernel",
        "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<int>, "
        "at::detail::Array<char*, 1> >(int, at::native::FillFunctor<int>, at::detail::Array<char*, 1>)",
        "at::native::vectorized_elementwise_kernel",
    ),
    (
        "kernel",
        "std::enable_if<!(false), void>::type internal::gemvx::kernel<int, int, float, 7, "
        "cublasGemvParams<cublasGemvTensorStridedBatched<float const>, float> >(cublasGemvParams<float>)",
        "internal::gemvx::kernel",
    ),
    (
        "kernel",
        "void (anonymous namespace)::elementwise_kernel_with_index<int, at::native::arange_cuda_out("
        "c10::Scalar const&)::{lambda()#1}>(int)",
        "anon::elementwise_kernel_with_index",
    ),
    (
        "comm",
        "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)",
        "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t",
    ),
    (
        "kernel",
        "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
        "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
    ),
    (
        "kernel",
        "Cijk_Alik_Bljk_BBS_BH_Bias_HA_S_SAV_UserArgs_MT256x192x64_MI16x16x1_SN_LDSB1_AFC1_AFEM1",
        "Cijk_Alik_Bljk_BBS_BH_Bias_HA_S_SAV_UserArgs",
    ),
    ("kernel", "triton__0d1d2d3d4d5d", "triton_"),
    ("kernel", "triton_poi_fused__to_copy_1", "triton_poi_fused__to_copy"),
    (
        "cpu_op",
        "sglang_profiler::mha__mha_batch_prefill_167",
        "sglang_profiler::mha__mha_batch_prefill",
    ),
    (
        "cpu_op",
        "FSDP::pre_forward (encoder.block.7.layer.0)",
        "FSDP::pre_forward (encoder.block.N.layer.N)",
    ),
    # left alone: no run-specific parts
    ("cpu_op", "aten::mm", "aten::mm"),
    ("cpu_op", "MeanBackward1", "MeanBackward1"),
    ("runtime", "hipGetDevicePropertiesR0600", "hipGetDevicePropertiesR0600"),
    ("memcpy", "Memcpy HtoD (Pinned -> Device)", "Memcpy HtoD (Pinned -> Device)"),
    ("kernel", "volta_sgemm_128x64_nt", "volta_sgemm_128x64_nt"),
    ("comm", "nccl:all_reduce", "nccl:all_reduce"),
]


@pytest.mark.parametrize(("layer", "name", "kind"), CASES)
def test_real_names_normalise_to_their_kind(layer: str, name: str, kind: str) -> None:
    assert normalize(layer, name) == kind


def test_kinds_merge_what_varies_between_runs_and_keep_what_names_the_work() -> None:
    assert normalize("python", "a.py(1): f") == normalize("python", "a.py(99): f")
    assert normalize("python", "a.py(1): f") != normalize("python", "a.py(1): g")
    ring = normalize("kernel", "ncclDevKernel_AllReduce_Sum_f32_RING_LL(int)")
    tree = normalize("kernel", "ncclDevKernel_AllReduce_Sum_f32_TREE_LL(int)")
    assert ring != tree, "the collective algorithm is part of the kind"


def test_demangle_reads_only_nested_names() -> None:
    assert demangle_name("_Z4siluf") == "silu"
    assert demangle_name("_Zxyz") is None
