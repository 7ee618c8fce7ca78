"""Training: a tiny model fits two small cases in seconds, deterministically, and round-trips."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from teller.analysis import Analysis
from teller.errors import TraceError
from teller.labels import CaseLabels
from teller.rca.dataset import read_case_records
from teller.rca.infer import UNMISSABLE_RATIO, UNMISSABLE_Z, LoadedModel
from teller.rca.inputs import NEIGHBOUR_FEATURES, QUEUE, STEP
from teller.rca.model import ModelConfig
from teller.rca.train import TrainConfig, dataset_cache_key, train


def tiny(cases: list[Path], out: Path, cache: Path, seed: int = 0) -> TrainConfig:
    return TrainConfig(
        data=[str(c) for c in cases],
        out=str(out),
        model=ModelConfig(d_model=32, n_layers=1, n_heads=2),
        tpe_vocab=128,
        epochs=16,
        batch_size=16,
        seed=seed,
        cache_dir=str(cache),
        progress=False,
    )


@pytest.fixture(scope="module")
def trained(two_cases, tmp_path_factory):
    root = tmp_path_factory.mktemp("rca-train")
    first = train(tiny(two_cases, root / "a", root / "cache"))
    second = train(tiny(two_cases, root / "b", root / "cache"))
    return first, second, root


def test_loss_goes_down(trained):
    first, _, _ = trained
    assert first.examples == 60 and first.anomalous == 20
    assert first.losses[-1] < 0.5 * first.losses[0]


def test_same_seed_same_weights_other_seed_other_weights(trained, two_cases):
    _, _, root = trained
    a = load_file(root / "a" / "model.safetensors")
    b = load_file(root / "b" / "model.safetensors")
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    other = train(tiny(two_cases, root / "c", root / "cache", seed=1))
    c = load_file(other.out / "model.safetensors")
    assert not all(torch.equal(a[k], c[k]) for k in a)


def test_an_ensemble_holds_the_single_runs_of_its_seeds_and_averages_them(trained, two_cases):
    _, _, root = trained
    config = tiny(two_cases, root / "ensemble", root / "cache")
    config.members, config.jobs = 2, 2  # members trained side by side, in spawned processes
    result = train(config)
    single = {0: root / "a", 1: root / "seed1"}
    if not (single[1] / "model.safetensors").is_file():
        train(tiny(two_cases, single[1], root / "cache", seed=1))
    weights = load_file(result.out / "model.safetensors")
    for k, directory in single.items():
        alone = load_file(directory / "model.safetensors")
        assert all(torch.equal(weights[f"member{k}.{name}"], alone[name]) for name in alone)
    assert len(weights) == 2 * len(alone)
    # the ensemble's step probability is its members' mean
    records = read_case_records(two_cases[0])
    both = LoadedModel.load(result.out).diagnose_records(records)
    each = [LoadedModel.load(d).diagnose_records(records) for d in single.values()]
    for b, (x, y) in zip(both, zip(*each, strict=True), strict=True):
        assert b.probability == pytest.approx((x.probability + y.probability) / 2, abs=1e-6)
    # a config that names more members than the weights hold is refused, naming the file
    meta = (result.out / "config.json").read_text().replace('"members": 2', '"members": 3')
    (result.out / "config.json").write_text(meta)
    with pytest.raises(TraceError, match=r"model\.safetensors.*unusable weights"):
        LoadedModel.load(result.out)


def test_checkpoint_round_trip_gives_the_same_diagnosis(trained, two_cases):
    _, _, root = trained
    loaded = LoadedModel.load(root / "a")
    again = LoadedModel.load(root / "a")
    assert not loaded.model.training
    weights = load_file(root / "a" / "model.safetensors")
    state = loaded.model.state_dict()
    assert all(torch.equal(state[k], weights[k]) for k in weights)
    records = read_case_records(two_cases[0])
    one = loaded.diagnose_records(records)
    two = again.diagnose_records(records)
    assert [d.probability for d in one] == [d.probability for d in two]
    assert [d.mechanism_scores for d in one] == [d.mechanism_scores for d in two]


def test_a_directory_without_a_model_is_a_clear_error(tmp_path):
    with pytest.raises(TraceError, match="not a model directory"):
        LoadedModel.load(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(TraceError, match="not valid JSON"):
        LoadedModel.load(tmp_path)


def test_explanations_are_plans_naming_only_the_heads_fault_operator_and_rank(trained, two_cases):
    from teller.eval.metrics import agreement
    from teller.rca.plans import operator_text

    _, _, root = trained
    checked = 0
    for case in two_cases:
        verdict = Analysis(case, model_dir=root / "a").diagnose()
        assert verdict.method == "model:a", verdict.warnings
        for f in verdict.findings:
            said = agreement(f.explanation, f.fault_type, f.operator, f.rank)
            assert said.agrees, f.explanation
            if f.operator is not None:  # the evidence sentence names the pointer's rank
                assert f"On rank {f.rank}, " in f.explanation or f"Rank {f.rank} " in f.explanation
                shown = operator_text(f.operator)
                named = shown in f.explanation or "the GPU sat idle" in f.explanation
                assert named, f.explanation  # an idle gap is named by what it is, not its step
            checked += 1
    assert checked > 0


def test_flagged_steps_of_a_run_share_one_pooled_fault_type(trained, two_cases):
    _, _, root = trained
    model = LoadedModel.load(root / "a")
    assert model.pointer_kinds  # what training showed (test_pointer_kinds_…)
    model.pointer_kinds = {}  # the pointer given the fault type would follow the pooled type
    for case in two_cases:
        records = read_case_records(case)
        pooled = model.diagnose_records(records)
        apart = model.diagnose_records(records, pool_faults=False)
        # pooling decides the fault type only: the same steps, probabilities and pointed nodes
        assert [d.anomalous for d in pooled] == [d.anomalous for d in apart]
        assert [d.facts for d in pooled] == [d.facts for d in apart]
        flagged = [d for d in pooled if d.anomalous]
        assert len({d.fault for d in flagged}) <= 1
        if flagged:  # the run's fault is one that some flagged step favoured on its own
            assert flagged[0].fault in {d.fault for d in apart if d.anomalous}


def test_steps_carry_their_neighbours_and_the_runs_shape(two_cases):
    records = sorted(read_case_records(two_cases[0]), key=lambda r: r.iteration)
    own = STEP.indices(NEIGHBOUR_FEATURES)
    previous = STEP.indices([f"previous_{n}" for n in NEIGHBOUR_FEATURES])
    following = STEP.indices([f"next_{n}" for n in NEIGHBOUR_FEATURES])
    for before, record, after in zip(records, records[1:], records[2:], strict=False):
        assert list(record.step_float[previous]) == list(before.step_float[own])
        assert list(record.step_float[following]) == list(after.step_float[own])
    assert not records[0].step_float[previous].any()
    assert not records[-1].step_float[following].any()
    run_shape = STEP.indices([n for n in STEP.names if n.startswith("run_")])
    assert len(run_shape) == 8
    run = {tuple(r.step_float[run_shape]) for r in records}
    assert len(run) == 1
    assert records[0].step_float[STEP["run_flagged_share"]] == pytest.approx(
        sum(r.localizer_anomalous for r in records) / len(records)
    )


@pytest.mark.train
def test_train_command_takes_the_loss_weights(two_cases, tmp_path):
    import json

    from teller.cli import main

    out = tmp_path / "m"
    data = [str(c) for c in two_cases]
    argv = ["-q", "train", "--data", *data, "-o", str(out), "--epochs", "1"]
    assert main([*argv, "--lambda-step", "2", "--lambda-op", "0.5", "--lambda-explain", "0"]) == 0
    config = json.loads((out / "config.json").read_text())["model"]
    assert (config["lambda_step"], config["lambda_op"], config["lambda_explain"]) == (2, 0.5, 0)


def test_a_power_capped_gpu_slows_all_its_kernels_alike():
    from .conftest import small_case

    case = small_case("gpu_throttle", rank=1, seed=3)
    records = read_case_records(case, use_logs=False)
    shape = STEP.indices(["kernel_median", "kernel_spread", "kernel_p90", "kernel_slower_share"])
    inside = [r.step_float[shape] for r in records if 10 <= r.iteration < 20]
    outside = [r.step_float[shape] for r in records if r.iteration < 8]
    assert inside and outside
    for median, spread, p90, share in inside:  # every kernel of rank 1 about (1 + x)× slower
        assert median > 0.3 and share > 0.8 and p90 >= median and spread < median
    for median, _, _, share in outside:
        assert abs(median) < 0.1 and share < 0.5


def test_a_co_tenant_scatters_the_kernels_it_slows_a_power_cap_does_not():
    """`kernel_scatter`: the slowest rank's kernel ratios' scatter against the run's usual. A co-tenant
    slows each kernel by its own factor; a power cap slows them all alike, so its scatter stays
    near the run's."""
    from .conftest import small_case

    def scatter(fault: str) -> tuple[list[float], list[float]]:
        records = read_case_records(small_case(fault, rank=1, seed=3), use_logs=False)
        inside = [r.step_float[STEP["kernel_scatter"]] for r in records if 10 <= r.iteration < 20]
        outside = [r.step_float[STEP["kernel_scatter"]] for r in records if r.iteration < 8]
        return inside, outside

    contended, before = scatter("gpu_contention")
    capped, _ = scatter("gpu_throttle")
    assert min(contended) > 0.6 and max(capped) < 0.4, (contended, capped)
    assert max(abs(v) for v in before) < 0.5


def test_a_shrunken_kv_cache_blames_the_forward_the_localizer_cannot_name():
    """kv_pressure slows the whole forward (recomputed prefills), so its guilty node is the
    model's outermost module scope; every step offers it as its last candidate."""
    from .conftest import small_case

    case = small_case("kv_pressure", rank=0, seed=3, python_frames=True)
    guilty = CaseLabels.read(case).guilty_operator
    records = read_case_records(case, use_logs=False)
    assert all(r.candidates and r.candidates[-1].kind == "forward" for r in records)
    assert {r.candidates[-1].operator for r in records} == {guilty}
    anomalous = [r for r in records if r.anomalous]
    assert anomalous
    assert all(r.candidates[r.target].operator == guilty for r in anomalous)
    # the forward's own time, against what the step's batch should take
    forward = anomalous[0].candidates[-1]
    assert forward.observed_ns > 0 and forward.normal_ns > 0


def test_a_trace_without_module_scopes_has_no_forward_candidate(two_cases):
    records = read_case_records(two_cases[0], use_logs=False)
    assert not any(c.kind == "forward" for r in records for c in r.candidates)


def test_steps_carry_their_batch_against_the_runs_usual_one():
    """`*_vs_usual`: log(context, generation tokens / the run's median for that step kind)."""
    import numpy as np

    from teller.rca.dataset.features import add_context

    def decode(tokens: int) -> np.ndarray:
        step = STEP.zeros()
        step[STEP["generation_tokens"]] = np.log1p(tokens) / 8.0
        step[STEP["kind_decode"]] = 1.0
        return step

    steps = [decode(63) for _ in range(5)] + [decode(15)]
    add_context(steps)
    assert [s[STEP["generation_vs_usual"]] for s in steps[:5]] == [0.0] * 5
    assert steps[5][STEP["generation_vs_usual"]] == pytest.approx(np.log(16 / 64), abs=1e-5)
    assert all(s[STEP["context_vs_usual"]] == 0.0 for s in steps)


def test_the_explanation_head_learns_the_mechanism_of_each_fault(trained, two_cases):
    """Two small cases suffice for the explanation head to learn which mechanism each fault's
    steps state (a straggler's late arrival, a power-capped GPU's slower kernels): on the
    labelled steps whose fault type the heads got right, its best-scored mechanism is the
    training target. (The head reads the fault type the run settled on, as it does at diagnosis;
    where that is wrong, it states that fault's mechanism, which the agreement test covers.)"""
    from teller.rca.plans import MECHANISMS

    _, _, root = trained
    model = LoadedModel.load(root / "a")
    hits = total = 0
    for case in two_cases:
        records = read_case_records(case)
        target = {r.iteration: r.mechanism for r in records if r.anomalous}
        assert set(target.values()) - {"none"}  # the facts allow a mechanism on some steps
        for d in model.diagnose_records(records):
            if d.anomalous and d.iteration in target and d.fault == CaseLabels.read(case).fault:
                best = MECHANISMS[max(range(len(MECHANISMS)), key=d.mechanism_scores.__getitem__)]
                hits += best == target[d.iteration]
                total += 1
    assert total and hits / total >= 0.8


def test_work_over_time_is_measured_against_steps_of_the_same_kind():
    """`*_over_time` (GPU, host, comm of the busiest rank against its usual): a decode step
    is compared with decode steps, not with prefills that move far more bytes. A decode step whose
    every message waits 1.5× longer is 1.5× its usual, though still far below any prefill."""
    import numpy as np

    from teller.rca.dataset.features import against_same_kind

    kinds = np.array(["prefill", "decode", "decode", "decode", "prefill", "decode"], dtype=object)
    comm_us = np.array([[900.0, 910], [30, 31], [30, 30], [45, 46], [1000, 1000], [31, 30]])
    temporal = against_same_kind(np.log(comm_us), kinds).max(axis=1)
    assert temporal[3] == pytest.approx(np.log(1.5), abs=0.03)
    assert np.abs(temporal[[1, 2, 5]]).max() < 0.05
    assert abs(temporal[0]) < 0.1 and abs(temporal[4]) < 0.1


def test_training_renames_ranks_but_keeps_which_tokens_share_one():
    from teller.rca.train import relabel_ranks

    ranks = torch.tensor([[0, 1, 1, 3, 0], [2, 2, 0, 1, 5]])
    renamed = relabel_ranks(ranks, torch.Generator().manual_seed(0))
    for row, new in zip(ranks.tolist(), renamed.tolist(), strict=True):
        assert len(set(zip(row, new, strict=True))) == len(set(row)) == len(set(new))  # bijection
    again = relabel_ranks(ranks, torch.Generator().manual_seed(0))
    assert torch.equal(renamed, again)
    assert not torch.equal(renamed, ranks)


def test_a_contended_links_window_stands_out_in_the_transfer_features():
    """`transfer_ratio`, `transfer_z` and the neighbours' `*_transfer_z`: the step's transfer time
    against the run's fit. A link at half its bandwidth adds microseconds to steps of
    milliseconds; every window step's transfer z still clears every other step's."""
    from lab.test_sim_cases import WINDOW, case

    out, _, _ = case(fault="link_contention", rank=1)
    records = read_case_records(out, use_logs=False)
    inside = [r for r in records if WINDOW[0] <= r.iteration < WINDOW[1]]
    outside = [r for r in records if not WINDOW[0] <= r.iteration < WINDOW[1]]
    z, ratio = STEP["transfer_z"], STEP["transfer_ratio"]
    assert min(r.step_float[z] for r in inside) > max(r.step_float[z] for r in outside)
    assert min(r.step_float[ratio] for r in inside) > 0.1
    middle = next(r for r in inside if r.iteration == WINDOW[0] + 5)
    assert middle.step_float[STEP["previous_transfer_z"]] > 0.5
    assert middle.step_float[STEP["next_transfer_z"]] > 0.5


def test_the_request_queue_travels_in_the_log_modality():
    """A step's queue (requests waiting, batch against the run's largest) is one more log token
    in its own template slot after the hashed ones; without logs there is none, and dropping a
    step's logs in training drops it too."""
    import numpy as np

    from lab.test_sim_cases import case
    from teller.rca.dataset import encode, train_vocab

    out, _, _ = case(fault="scheduler_misconfig", rank=0)
    with_logs = read_case_records(out)
    without = read_case_records(out, use_logs=False)
    assert all(r.queue is not None for r in with_logs)
    assert all(r.queue is None for r in without)
    assert max(r.queue[QUEUE["waiting"]] for r in with_logs) > np.log1p(5) / 4
    tpe = train_vocab(with_logs, 64)
    log_vocab = 64
    batch = encode(with_logs, tpe, raw=False, log_vocab=log_vocab)
    assert ((batch.log_template == log_vocab + 1).sum(axis=1) == 1).all()
    assert (encode(without, tpe, raw=False, log_vocab=log_vocab).log_template == 0).all()


def test_requests_held_back_mark_a_capped_scheduler_and_nothing_else():
    """`held_back`: requests waiting that the step had room for (by the run's largest batch)
    while its tokens stayed under 80% of the run's largest step. A capped scheduler's window has
    them in every step; the same workload without a fault, whose queue drains at full batches,
    has none."""
    from lab.test_sim_cases import WINDOW, case

    out, _, _ = case(fault="scheduler_misconfig", rank=0)
    records = read_case_records(out)
    held_back = QUEUE["held_back"]
    inside = [r.queue[held_back] for r in records if WINDOW[0] <= r.iteration < WINDOW[1]]
    assert min(inside) > 0.3
    baseline, _, _ = case(fault="none", rank=0)
    assert max(r.queue[held_back] for r in read_case_records(baseline)) == 0.0
    # the records carry the count the feature is made of, and None where there is no queue
    assert min(r.held_back for r in records if WINDOW[0] <= r.iteration < WINDOW[1]) > 0
    assert {r.held_back for r in read_case_records(baseline)} == {0}
    assert {r.held_back for r in read_case_records(out, use_logs=False)} == {None}


def test_the_kv_cache_fill_the_engine_prints_tells_a_full_cache_from_a_capped_scheduler():
    """`kv_cache_fill`, `kv_cache_known`: the KV cache's fill the step's log lines state (carried
    to later steps) and 1 where it is known. A shrunk cache fills up inside its window; a capped scheduler keeps
    requests waiting with the cache far from full."""
    from lab.test_sim_cases import WINDOW, case

    def window_fill(fault: str) -> list[float]:
        out, _, _ = case(fault=fault, rank=0)
        records = read_case_records(out)
        assert all(r.queue is not None and r.queue[QUEUE["kv_cache_known"]] == 1.0 for r in records)
        fill = QUEUE["kv_cache_fill"]
        return [r.queue[fill] for r in records if WINDOW[0] <= r.iteration < WINDOW[1]]

    assert max(window_fill("kv_pressure")) > 0.95
    assert max(window_fill("scheduler_misconfig")) < 0.9


def test_a_steps_kv_cache_fill_is_the_last_its_lines_state(tmp_path):
    """The fill comes from the log table's typed `kv_cache_fill` column, whichever engine printed
    it (vLLM a percentage, SGLang a fraction, TensorRT-LLM free and total blocks): per step the
    last line that states one; lines on no step, or stating none, leave it unknown."""
    import numpy as np

    from ingest.test_logs_engines import SGLANG_LINES, TRTLLM_LINE
    from ingest.test_logs_vllm import V1_LINES
    from teller.align.align import kv_fill_by_step
    from teller.ingest.logs import read_logs

    quarter_free = TRTLLM_LINE.replace('"Free KV cache blocks":0', '"Free KV cache blocks":612')
    files = {
        "vllm.log": [V1_LINES[3], V1_LINES[0]],  # 1.0%, then a line stating no fill
        "sglang.log": SGLANG_LINES[:2],  # 0.12, 0.00
        "trtllm.log": [quarter_free],  # 612 of 2448 blocks free
    }
    for name, lines in files.items():
        (tmp_path / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    fill = read_logs([tmp_path / name for name in files], year=2025).kv_cache_fill()
    assert np.isnan(fill[1]) and list(np.round(fill[[0, 2, 3, 4]], 4)) == [0.01, 0.12, 0.0, 0.75]
    steps = np.array([3, 4, 3, -1, 5])  # the SGLang prefill line on no step
    assert kv_fill_by_step(steps, fill) == {3: pytest.approx(0.12), 5: pytest.approx(0.75)}


def test_a_contended_links_guilty_collective_is_a_candidate_of_every_labelled_step():
    """The step's transfer is a candidate of its own (the collective of the rank that spent
    longest in collectives it reached last): a contended link adds tens of microseconds per
    step, below the localizer's noise floor, and without it the pointer would often have no
    right answer among a link fault's steps."""
    from lab.test_sim_cases import case

    out, _, _ = case(fault="link_contention", rank=1)
    labels = CaseLabels.read(out)
    records = read_case_records(out, use_logs=False)
    inside = [r for r in records if r.iteration in labels.steps]
    assert len(inside) >= 5 and all(r.target >= 0 for r in inside)
    for record in inside:
        guilty = record.candidates[record.target]
        assert guilty.operator == labels.guilty_operator
        assert guilty.observed_ns > guilty.normal_ns  # slower than the run's fit for its batch
    transfers = [c for r in records for c in r.candidates if c.kind == "transfer"]
    assert len({c.node for c in transfers}) == len(transfers)  # never the same node twice


def test_pointer_kinds_are_what_training_showed_and_condition_the_pointer(trained):
    """`pointer_kinds`: per fault type, the candidate kinds its guilty node had in training (5% or
    more of its steps). At inference a flagged step's pointer is read given the pooled fault type:
    other kinds get no weight; a step with no allowed candidate keeps its distribution."""
    import dataclasses

    import numpy as np

    from teller.rca.inputs import CANDIDATE_KINDS, FAULT_NAMES, Batch
    from teller.rca.train import pointer_kinds

    link, gpu = FAULT_NAMES.index("link_contention"), FAULT_NAMES.index("gpu_throttle")
    transfer, compute = CANDIDATE_KINDS.index("transfer"), CANDIDATE_KINDS.index("compute")
    arrival = CANDIDATE_KINDS.index("arrival")
    n = 41  # 20 link steps at transfer, 1 at compute (under 5%), 20 gpu steps at compute
    arrays = dataclasses.replace(
        Batch.blank(n + 3),
        y_step=np.r_[np.ones(n), np.zeros(3)].astype(np.float32),
        y_fault=np.r_[[link] * 21, [gpu] * 20, [0] * 3],
        y_ptr=np.r_[[0] * 20, [1] * 21, [-1] * 3],
        tok_ckind=np.tile([transfer, compute, arrival], (n + 3, 1)),
    )
    assert pointer_kinds(arrays) == {"link_contention": ["transfer"], "gpu_throttle": ["compute"]}

    model = LoadedModel.load(trained[0].out)
    model.pointer_kinds = {"link_contention": ["transfer", "arrival"]}
    pointer = np.array([[0.2, 0.7, 0.1], [0.2, 0.7, 0.1], [0.0, 1.0, 0.0]])
    focus = dataclasses.replace(
        Batch.blank(3),
        focus_candidate=np.array([[0, 1, 2]] * 3),
        tok_ckind=np.array([[transfer, compute, arrival]] * 2 + [[compute] * 3]),
    )
    faults = np.array([link, gpu, link])
    given = model._given_fault(pointer, focus, faults, np.array([True, True, True]))
    assert np.allclose(given[0], [2 / 3, 0.0, 1 / 3])  # link: the compute candidate is out
    assert np.allclose(given[1], pointer[1])  # no table entry for gpu_throttle here
    assert np.allclose(given[2], pointer[2])  # nothing allowed: left as it was


def test_a_step_far_slower_than_its_batch_predicts_is_flagged_whatever_the_step_head_says(
    trained, two_cases
):
    _, _, root = trained
    model = LoadedModel.load(root / "a")
    records = read_case_records(two_cases[0])  # the toy straggler: two steps near 5x expected
    z = np.array([r.step_float[STEP["z"]] * 10.0 for r in records])
    ratio = np.array([r.dur_ns / max(r.expected_ns, 1) for r in records])
    blatant = (ratio >= UNMISSABLE_RATIO) & (z >= UNMISSABLE_Z)
    assert blatant.any() and not blatant.all()
    # a threshold no output reaches: the floor flags those steps and no other (a step merely
    # slow is left to the head), and they are diagnosed (a pick, a fault type) like any other
    diagnoses = model.diagnose_records(records, threshold=1.01)
    assert [d.anomalous for d in diagnoses] == blatant.tolist()
    assert all(d.facts is not None and d.fault for d in diagnoses if d.anomalous)


def test_held_out_fault_drops_its_labelled_steps_only():
    from teller.errors import TellerError
    from teller.rca.inputs import FAULT_NAMES, Batch
    from teller.rca.train import without_fault

    arrays = Batch.blank(6)
    arrays.y_step[:] = [0, 1, 1, 0, 1, 1]
    straggler, throttle = FAULT_NAMES.index("straggler"), FAULT_NAMES.index("gpu_throttle")
    arrays.y_fault[:] = [0, straggler, throttle, 0, straggler, throttle]
    arrays.step_float[:, 0] = np.arange(6)
    kept = without_fault(arrays, "straggler")
    assert kept.step_float[:, 0].tolist() == [0, 2, 3, 5]
    assert FAULT_NAMES.index("straggler") not in kept.y_fault[kept.y_step > 0].tolist()
    with pytest.raises(TellerError, match="not a fault type"):
        without_fault(arrays, "stragler")
    with pytest.raises(TellerError, match="label no step"):
        without_fault(arrays, "net_throttle")


def test_only_a_fault_type_the_steps_hold_likely_settles_the_pointer(trained, two_cases):
    """An unfamiliar fault gets a diffuse type; the nearest type's candidate kinds then do not
    veto what the pointer read (`TYPE_SETTLES_POINTER`)."""
    import dataclasses

    from teller.rca.infer import TYPE_SETTLES_POINTER
    from teller.rca.inputs import CANDIDATE_KINDS, FAULT_NAMES

    model = LoadedModel.load(trained[0].out)
    records = read_case_records(two_cases[0])
    outputs = model.forward(records)
    kinds = outputs.arrays.tok_ckind
    focus = outputs.arrays.focus_candidate >= 0
    compute, other = CANDIDATE_KINDS.index("compute"), CANDIDATE_KINDS.index("arrival")
    both = [
        b
        for b in range(len(records))
        if (focus[b] & (kinds[b] == compute)).any() and (focus[b] & (kinds[b] == other)).any()
    ]
    assert both, "the toy straggler's steps have compute and arrival candidates"
    pointer = np.zeros_like(outputs.pointer)
    preferred, allowed = {}, {}
    for b in both:  # the pointer prefers an arrival, 0.7 against 0.3 for a compute candidate
        arrival_token = np.flatnonzero(focus[b] & (kinds[b] == other))[0]
        compute_token = np.flatnonzero(focus[b] & (kinds[b] == compute))[0]
        pointer[b, arrival_token], pointer[b, compute_token] = 0.7, 0.3
        preferred[b] = records[b].candidates[outputs.arrays.focus_candidate[b, arrival_token]]
        allowed[b] = records[b].candidates[outputs.arrays.focus_candidate[b, compute_token]]
    throttle = FAULT_NAMES.index("gpu_throttle")
    model.pointer_kinds = {"gpu_throttle": ["compute"]}

    def named(type_probability: float) -> dict[int, object]:
        logp = np.full_like(outputs.fault_logp, np.log((1 - type_probability) / 20))
        logp[:, throttle] = np.log(type_probability)
        given = dataclasses.replace(outputs, pointer=pointer, fault_logp=logp)
        diagnoses = model.diagnose_records(records, threshold=0.0, outputs=given)
        return {b: diagnoses[b].candidates[0][0] for b in both}

    assert 0.2 < TYPE_SETTLES_POINTER <= 0.8
    assert named(0.8) == allowed
    assert named(0.2) == preferred


def test_the_dataset_cache_is_keyed_by_the_cases_labels(tmp_path):
    """A case labelled again (the simulator's labelling rules changed) is read again, not served
    from the cache with the targets it had."""
    case = tmp_path / "case"
    case.mkdir()
    (case / "labels.json").write_text('{"steps": [10, 11, 12]}')
    before = dataset_cache_key([case], 512)
    assert dataset_cache_key([case], 512) == before
    (case / "labels.json").write_text('{"steps": [11]}')
    assert dataset_cache_key([case], 512) != before


def test_a_capped_scheduler_the_queue_refutes_is_let_go(trained, two_cases):
    """A step the head alone flags as a capped scheduler is let go where the request records
    show it held no waiting request back (`queue_refutes`); one that held requests back, one
    whose queue is unknown, one a floor flags, and any step of another type stay flagged."""
    import dataclasses

    from teller.rca.infer import unmissable
    from teller.rca.inputs import FAULT_NAMES

    model = LoadedModel.load(trained[0].out)
    records = [
        dataclasses.replace(r, held_back=(0, 3, None)[k % 3])
        for k, r in enumerate(read_case_records(two_cases[0]))
    ]
    outputs = model.forward(records)
    floored = unmissable(records)

    def flagged(fault: str) -> set[int]:
        logp = np.full_like(outputs.fault_logp, np.log(0.01))
        logp[:, FAULT_NAMES.index(fault)] = np.log(0.8)
        given = dataclasses.replace(
            outputs, probability=np.ones_like(outputs.probability), fault_logp=logp
        )
        return {d.iteration for d in model.diagnose_records(records, outputs=given) if d.anomalous}

    refuted = {
        r.iteration for r, f in zip(records, floored, strict=True) if r.held_back == 0 and not f
    }
    assert refuted, "some steps the head alone flags held nothing back"
    assert flagged("scheduler_misconfig") == {r.iteration for r in records} - refuted
    assert flagged("gpu_throttle") == {r.iteration for r in records}


def test_a_floored_step_the_queue_refutes_keeps_its_flag_and_takes_another_type(trained, two_cases):
    """A floor's step typed a capped scheduler whose queue held nothing back is still flagged,
    with the most likely other type; a floor's step that held requests back keeps the type."""
    import dataclasses

    from teller.rca.inputs import FAULT_NAMES

    model = LoadedModel.load(trained[0].out)
    records = [
        dataclasses.replace(r, held_back=k % 2, dur_ns=2 * max(r.expected_ns, 1))
        for k, r in enumerate(read_case_records(two_cases[0]))
    ]
    outputs = model.forward(records)
    logp = np.full_like(outputs.fault_logp, np.log(0.01))
    logp[:, FAULT_NAMES.index("scheduler_misconfig")] = np.log(0.8)
    logp[:, FAULT_NAMES.index("cpu_contention")] = np.log(0.15)
    for pool in (True, False):
        given = dataclasses.replace(
            outputs, probability=np.zeros_like(outputs.probability), fault_logp=logp
        )
        held_share = {r.iteration: 1.0 for r in records}  # every step floored
        diagnoses = model.diagnose_records(
            records, pool_faults=pool, outputs=given, held_share=held_share
        )
        assert all(d.anomalous for d in diagnoses)
        types = {r.held_back: {d.fault} for r, d in zip(records, diagnoses, strict=True)}
        assert types == {0: {"cpu_contention"}, 1: {"scheduler_misconfig"}}
