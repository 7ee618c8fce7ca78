"""Drawn lab recipes: every case is one the lab accepts, the parameters vary, every fault appears,
held-out rates stay out, and the committed lab-train-v2 is what its command writes."""

from __future__ import annotations

import json
from pathlib import Path

from teller.eval.draw_lab import (
    DURATION_RANGE,
    INTENSITY_RANGE,
    RATE_RANGE,
    TP_SIZES,
    draw_lab_cases,
    lab_faults,
)
from teller.lab.faults.catalog import LAB_FAULTS
from teller.lab.run import parse_window

REPO = Path(__file__).resolve().parents[2]
#: lab-shapes-v1's arrival rates, which no lab training case may run at.
HELD_OUT_RATES = {3.0, 10.0}


def test_every_drawn_lab_case_is_one_the_lab_accepts() -> None:
    cases = draw_lab_cases(90, 5, "t")
    assert {case["args"]["fault"] for case in cases} == set(LAB_FAULTS)
    assert {case["args"]["tp"] for case in cases} == set(TP_SIZES)
    for case in cases:
        args = case["args"]
        assert set(args) <= {
            "fault",
            "tp",
            "seed",
            "duration",
            "rate",
            "window",
            "intensity",
            "rank",
        }
        assert DURATION_RANGE[0] <= args["duration"] <= DURATION_RANGE[1]
        assert RATE_RANGE[0] <= args["rate"] <= RATE_RANGE[1]
        assert args["rate"] not in HELD_OUT_RATES
        if args["fault"] == "none":
            assert "window" not in args
            continue
        start, end = parse_window(args["window"])
        assert 0 < start < end < args["duration"]
        low, high = INTENSITY_RANGE[args["fault"]]
        assert low <= args["intensity"] <= high
        assert 0 <= args["rank"] < args["tp"]


def test_the_same_seed_draws_the_same_lab_cases() -> None:
    assert draw_lab_cases(18, 3, "a") == draw_lab_cases(18, 3, "a")
    assert draw_lab_cases(18, 3, "a") != draw_lab_cases(18, 4, "a")
    assert lab_faults()[0] == "none"


def test_lab_train_v2_is_what_its_command_draws() -> None:
    recipe = json.loads((REPO / "evalsets" / "lab-train-v2.json").read_text())
    assert recipe["cases"] == draw_lab_cases(18, 300, "lab-train-v2")
    assert "--cases 18 --seed 300" in recipe["description"]
