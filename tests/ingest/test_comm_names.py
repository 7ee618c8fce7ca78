"""Communication recognised by name, for the collectives that carry no metadata (vLLM's custom
all-reduce, SGLang's pynccl, bare NCCL kernels). Names are as these engines' kernels print them."""

from __future__ import annotations

import pytest

from teller.ingest.comm_names import collective_kind, is_comm_cpu_op, is_comm_kernel


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "allreduce"),
        (
            "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)",
            "sendrecv",
        ),
        (
            "void vllm::cross_device_reduce_1stage<__nv_bfloat16, 2>(vllm::RankData*, vllm::RankSignals, vllm::Signal*, __nv_bfloat16*, int, int)",
            "allreduce",
        ),
        (
            "void vllm::cross_device_reduce_2stage<float, 8>(vllm::RankData*, vllm::RankSignals, vllm::Signal*, float*, int, int)",
            "allreduce",
        ),
        ("void multimem_all_reduce_kernel<__nv_bfloat16>(...)", "allreduce"),
        ("void one_shot_all_reduce_kernel<float, 8>(...)", "allreduce"),
        ("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "allgather"),
        (
            "ncclDevKernel_ReduceScatter_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
            "reduce_scatter",
        ),
    ],
)
def test_collective_kernels(name: str, kind: str) -> None:
    assert is_comm_kernel(name)
    assert collective_kind(name) == kind


@pytest.mark.parametrize(
    "name",
    [
        "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float>>(...)",
        "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64",
        "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>",
    ],
)
def test_compute_kernels_are_not_communication(name: str) -> None:
    assert not is_comm_kernel(name)


@pytest.mark.parametrize(
    ("name", "comm"),
    [
        ("record_param_comms", True),
        ("vllm::all_reduce", True),
        ("vllm::outplace_all_reduce", True),
        ("_C_custom_ar::all_reduce", True),
        ("nccl:all_reduce", True),
        ("gloo:all_reduce", True),
        ("c10d::allreduce_", True),
        ("_c10d_functional::all_reduce", True),
        ("_c10d_functional::wait_tensor", False),  # waiting on a collective is not one
        ("c10d::wait", False),
        ("aten::mm", False),
    ],
)
def test_host_side_collective_ops(name: str, comm: bool) -> None:
    assert is_comm_cpu_op(name) is comm
