"""Drawn recipes: every knob varies across cases, every case is one the simulator accepts and
its fault can act on, and held-out shapes and faults stay out."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from teller.eval.draw import (
    COLLECTIVE_FAULTS,
    NETWORK_FAULTS,
    RUN_WIDE_FAULTS,
    DrawRules,
    draw_cases,
)
from teller.eval.recipes import COMMANDS, build_case, command_line
from teller.lab.sim.cli import add_arguments
from teller.lab.sim.faults import SIM_FAULTS


def _parsed(case: dict) -> argparse.Namespace:
    parser = argparse.ArgumentParser(exit_on_error=False)
    add_arguments(parser)
    return parser.parse_args(command_line(case, Path("/nonexistent"))[len(COMMANDS["sim"]) :])


def test_the_same_seed_draws_the_same_cases() -> None:
    rules = DrawRules()
    assert draw_cases(20, 7, "a", rules) == draw_cases(20, 7, "a", rules)
    assert draw_cases(20, 7, "a", rules) != draw_cases(20, 8, "a", rules)


def test_every_drawn_case_is_one_the_simulator_accepts_and_its_fault_can_act_on() -> None:
    rules = DrawRules(budget=8_000)
    cases = draw_cases(400, 1, "t", rules)
    seen: dict[str, set] = {
        "tp": set(),
        "pp": set(),
        "eager": set(),
        "fault": set(),
        "nodes": set(),
    }
    layers = []
    for case in cases:
        args = _parsed(case)
        world = args.nodes * args.gpus_per_node
        assert world % (args.tp * args.pp) == 0, case
        assert world * args.steps * args.layers <= rules.budget, case
        if args.fault in NETWORK_FAULTS:
            assert args.tp * args.pp > args.gpus_per_node, case  # a group spans nodes
        if args.fault in COLLECTIVE_FAULTS:
            assert args.tp >= 2, case
        if args.fault != "none":
            start, end = map(int, args.window.split(":"))
            assert 0 <= start < end <= args.steps, case
            assert 0.1 <= args.intensity <= 2.0
        if args.fault not in RUN_WIDE_FAULTS:
            assert 0 <= args.rank < world, case
        for knob in ("tp", "pp", "eager", "fault", "nodes"):
            seen[knob].add(getattr(args, knob))
        layers.append(args.layers)
    assert seen["tp"] == {1, 2, 4, 8} and seen["pp"] == {1, 2, 4}
    assert seen["eager"] == {True, False} and seen["fault"] == set(SIM_FAULTS)
    assert min(seen["nodes"]) == 1 and max(seen["nodes"]) == 8
    assert min(layers) <= 6 and max(layers) >= 60


def test_held_out_shapes_and_faults_stay_out_and_only_keeps_to_them() -> None:
    training = draw_cases(
        200, 2, "t", DrawRules(hold_out=("tp8", "pp"), hold_out_faults=("straggler",))
    )
    assert all(c["args"]["tp"] != 8 and c["args"]["pp"] == 1 for c in training)
    assert all(c["args"]["fault"] != "straggler" for c in training)
    held = draw_cases(100, 3, "h", DrawRules(only=("tp8", "pp")))
    assert all(c["args"]["tp"] == 8 or c["args"]["pp"] > 1 for c in held)
    with pytest.raises(ValueError, match="unknown shapes"):
        DrawRules(hold_out=("tp16",))


def test_a_world_of_one_draws_single_gpu_runs_with_their_faults() -> None:
    cases = draw_cases(120, 4, "s", DrawRules(max_world=1))
    assert all(c["args"]["nodes"] * c["args"]["gpus_per_node"] == 1 for c in cases)
    faults = {c["args"]["fault"] for c in cases}
    # no peers: no collective or network faults; every fault of one GPU and its host is drawn
    assert not faults & (COLLECTIVE_FAULTS | NETWORK_FAULTS)
    assert faults == set(SIM_FAULTS) - COLLECTIVE_FAULTS - NETWORK_FAULTS


def test_a_drawn_case_builds(tmp_path: Path) -> None:
    [case] = draw_cases(1, 11, "b", DrawRules(budget=600))
    build_case(case, tmp_path)
    manifest = json.loads((tmp_path / case["id"] / "manifest.json").read_text())
    assert manifest
