"""Fetch the real trace files the tests use, byte for byte, from their public repositories.

The files are third-party data (see ../shared/traces/SOURCES.md for licences); they are never
committed here. `make traces` runs this when ../shared/traces is absent: each file is downloaded
from its repository at a pinned commit and kept only if its sha256 matches.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import urllib.request
from pathlib import Path

HTA = ("facebookresearch/HolisticTraceAnalysis", "f4d0062c382f42bd8a74838bcdad1916c7d5d2da")
TRACELENS = ("AMD-AGI/TraceLens", "171dd74721ca1ec45709e5805b68ae1f65e27811")
NSYS_AI = ("GindaChen/nsys-ai", "ab196ea237d90e8df5270293d14cff1a95032500")
VLLM_DIR = "tests/traces/inference/vllm_prefilldecode_piecewise"
CAPTURE = "graph_capture_rank_0.1773709679453551615.pt.trace.json.gz"

# (path under the traces folder, (repository, commit), path in the repository, sha256)
FILES: list[tuple[str, tuple[str, str], str, str]] = [
    (
        "hta/ns_resolution_v100_resnet_rank0.pt.trace.json.gz",
        HTA,
        "tests/data/ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz",
        "e279d7280e73719e8dd9550e120cfe081fbe268596bd297fe5fcbf63e2b75a09",
    ),
    (
        "hta/queue_len_rank0_of16.json.gz",
        HTA,
        "tests/data/negative_queue_length_values_check/rank0.json.gz",
        "b8ce7a1a143b55dd1811d269272b09d1c693ffea85b91858f5fb246e7ad8c5f8",
    ),
    (
        "hta/df_index_resolver_rank1_of2_216k_events.json.gz",
        HTA,
        "tests/data/df_index_resolver/df_index_resolver.json.gz",
        "769af9ab5262468eb7baf6a7bfdb138ef15542264c72c0c313758d951b16dc15",
    ),
    (
        "hta/sampled_rank0_of128.json.gz",
        HTA,
        "tests/data/timeline_analysis/sampled_rank-0.json.gz",
        "71b98c30a2751cc56d9bf78f8fb76467acd56e0be6a1f0da23c600941d29aafd",
    ),
    (
        "hta/sampled_rank1_of128.json.gz",
        HTA,
        "tests/data/trace_filter/sampled_rank-1.json.gz",
        "2f9a65fd5f319ec8e60468a22dc9a624eb4b40369c729f6f897259d587eca57e",
    ),
    (
        "hta/critical_path_alexnet.json.gz",
        HTA,
        "tests/data/critical_path/alexnet/benchmark_result_2869224_1695835535_trace.json.gz",
        "b9febb1abc8cc729a2890fb6a4171de9867ba72c944437ee046067e7c89912dc",
    ),
    (
        "hta/cuda_event_sync.json.gz",
        HTA,
        "tests/data/critical_path/cuda_event_sync/event_sync_trace.json.gz",
        "63074c678eb92a77410d7911b64ed39c0e859d0998f74ee9b862de7a12cd7616",
    ),
    (
        "hta/cuda_event_sync_multi_stream.json.gz",
        HTA,
        "tests/data/critical_path/cuda_event_sync_multi_stream/event_sync_trace.json.gz",
        "3e79d573357fd8f764206cc2e514e4a1be4ef43808269689056ed400972ff09c",
    ),
    (
        "hta/cupti_profiler_counters.json.gz",
        HTA,
        "tests/data/cupti_profiler/benchmark_result_924719_1679055439_trace.json.gz",
        "07e7e02da9cfda66f5b6fc5fd17e1f93185321504496f4c00e8d375fb162bf84",
    ),
    (
        "hta/amd_mi250_rocm62.json.gz",
        HTA,
        "tests/data/amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz",
        "39fdab670f9e80a05ccc6d0d07611b3aeba1092fa10681d8dd08cea48d0488b5",
    ),
    (
        "hta/legacy_inference_rank1_oldcats.json.gz",
        HTA,
        "tests/data/trace_file_list/inference_rank_1.json.gz",
        "4c37e0ca5cae61bd6f9d46cc6db0e7e09260df07990d1bf6bbb253f0f636d5e8",
    ),
    (
        "hta/gpu_user_annotation_steps.json.gz",
        ("facebookresearch/HolisticTraceAnalysis", "9e27c16c78004a40422fab15cb9c1cf9f2cc5c54"),
        "tests/data/with_gpu_user_annotation/step_based_trace_2543932.json.gz",
        "04128926da97bd9029f431b36fc682ded08940359fbd4e0583f04490f8448da4",
    ),
    (
        "hta/large_integer_comms_id.pt.trace.json.gz",
        ("facebookresearch/HolisticTraceAnalysis", "9474ec5334825e881d36b67d392e13bf6788ba6d"),
        "tests/data/large_integer_trace/rank-70.Mar_25_20_48_12.2861.pt.trace.json.gz",
        "6757d7f5a360250cf45448c0ee39c5af0052dbaf3ababc45c64c60a85b25bf18",
    ),
    (
        "hta/simple_add_execution_trace_et.json.gz",
        HTA,
        "tests/data/execution_trace/benchmark_simple_add_et.json.gz",
        "7ce1b653978fea1f893ae00c6fa916e0aad069cf9aa456a7b42db43bcbfad7d5",
    ),
    (
        "hta/simple_add_kineto_pair.json.gz",
        HTA,
        "tests/data/execution_trace/benchmark_simple_add_trace.json.gz",
        "7f7e72221e263d763ac840686991321d238801cbea75d9febb59d3e3859d2b02",
    ),
    (
        "tracelens/vllm_prefilldecode_piecewise/graph_execution.json.gz",
        TRACELENS,
        f"{VLLM_DIR}/graph_execution.json.gz",
        "4eff6c90583855d67a12a06aa5edfd281a745bba4be4462a41bd4cacf6dea702",
    ),
    (
        f"tracelens/vllm_prefilldecode_piecewise/{CAPTURE}",
        TRACELENS,
        f"{VLLM_DIR}/{CAPTURE}",
        "86e9df6ffa16c973ec94ab256b35ed1c66c1dd7a7b0c61938cd45fc0add7f36c",
    ),
    (
        "tracelens/vllm_prefilldecode_piecewise/execution_details.json",
        TRACELENS,
        f"{VLLM_DIR}/execution_details.json",
        "bdb76557e978777bdec3f1952bae2c5b58da4a2977e3514f54157c89896ded27",
    ),
    (
        "tracelens/sglang_Qwen3-8B_prefilldecode.json.gz",
        TRACELENS,
        "tests/traces/inference/sglang_prefilldecode/sglang_Qwen3-8B_prefilldecode.json.gz",
        "ca3c1a8452be14f8e41aaaf3c80d2c0502ce97d365e2c74bc21a95fb9585fde8",
    ),
    (
        "tracelens/hf_qwen1.5-0.5b_h100.json.gz",
        TRACELENS,
        "tests/traces/h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz",
        "7c4a4b817b79db0aa90f0df0368de88ac6f6e22261864b68fa88d0a3f9c5c63d",
    ),
    (
        "nsys_ai/fastvideo_h100_sp2_1s.sqlite",
        NSYS_AI,
        "tests/fixtures/h100_2gpu_1s.sqlite",
        "36ad440e71a33725a672638da32d16e8dcab61e27fbc886b217f9d388fb02975",
    ),
    (
        "nsys_ai/mock_tiny_real_export.sqlite",
        NSYS_AI,
        "tests/fixtures/mock.sqlite",
        "84c90236cd88d305cff9563cd356a1cbfa0f12aaf3012ab2b7dc785e07070ed3",
    ),
    # added to ../shared/traces on 2026-12-02 (same repositories and commits)
    (
        "hta/mtia_single_rank0.json.gz",
        HTA,
        "tests/data/mtia_trace_single_rank/mtia_rank_0.json.gz",
        "74786104b3c45f02b805a5c346a8202c3ecc318a566a65e0b47c56d706374f80",
    ),
    (
        "nsys_ai/healthy_1pct.sqlite",
        NSYS_AI,
        "tests/fixtures/healthy_1pct.sqlite",
        "3ef2eff9b58727389c011901bee6de0b1ff82d653052d08abc53470d7112f4f9",
    ),
    (
        "tracelens/more/h100_timesformer_k400.json.gz",
        TRACELENS,
        "tests/traces/h100/facebook_timesformer-base-finetuned-k400__1016002.json.gz",
        "c2d1d7fea329b45adf2d065875c817e02cbc19ed6c7d19eef3fd5e3364112e87",
    ),
    (
        "tracelens/more/mi300_resnet_act_checkpoint.json.gz",
        TRACELENS,
        "tests/traces/mi300/resnet_act_checkpoint.json.gz",
        "0a6a7dfe1f0bf16c74876ebabffbac57b350d8897c4ad42c3dcf6d1dab2aa2aa",
    ),
    (
        "tracelens/more/xdit_sd3.5_profile_rank0.json.gz",
        TRACELENS,
        "tests/traces/inference/xdit_sd_3.5/profile_trace_rank_0.json.gz",
        "27e093d746edcc776524b4fa09ba20381e2dbc04767ef0dbd97fd670c3b03920",
    ),
    (
        "tracelens/more/xdit_flux1_capture_rank0.json.gz",
        TRACELENS,
        "tests/traces/inference/xdit_flux.1/capture_traces/capture_trace_rank_0.json.gz",
        "a486fb20091f6e60b6ecb21f93036b332acb5439e86404fe7a0f03cfb8f32f3f",
    ),
]


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def fetch(destination: Path) -> int:
    failures = 0
    for local, (repo, commit), remote, digest in FILES:
        target = destination / local
        if target.exists() and sha256(target) == digest:
            continue
        url = f"https://raw.githubusercontent.com/{repo}/{commit}/{remote}"
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_suffix(target.suffix + ".part")
        try:
            with urllib.request.urlopen(url, timeout=60) as response:
                partial.write_bytes(response.read())
        except OSError as error:
            print(f"fetch_traces: {url}: {error}", file=sys.stderr)
            failures += 1
            continue
        if sha256(partial) != digest:
            partial.unlink()
            print(f"fetch_traces: {url}: sha256 mismatch, file discarded", file=sys.stderr)
            failures += 1
            continue
        partial.replace(target)
        print(f"fetched {local}")
    return 1 if failures else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("destination", type=Path, nargs="?", default=Path(".traces"))
    return fetch(parser.parse_args().destination)


if __name__ == "__main__":
    sys.exit(main())
