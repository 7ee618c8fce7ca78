"""Log lines on the steps they describe, scored against a real lab case's ground truth."""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from teller.align.align import align_run
from teller.cli import main
from teller.ingest.logs import request_key
from teller.labels import CaseLabels

CASE = Path(__file__).parent / "data" / "lab_none_tp2"
TRACES = CASE / "traces"
LOG = CASE / "logs" / "rank0.log"
PREFIX_BYTES = 28  # teller collect's `2026-11-30T08:20:30.889994Z ` prefix
_VLLM_STAMP = re.compile(r"(INFO|WARNING|ERROR) (\d\d-\d\d \d\d:\d\d:\d\d) ")


@pytest.fixture(scope="module")
def truth() -> dict[str, tuple[int, int]]:
    """request key → (first step, last step) from the engine's own record."""
    spans: dict[str, tuple[int, int]] = {}
    for line in (CASE / "ground_truth" / "steps.jsonl").open():
        step = json.loads(line)
        for request in step["requests"]:
            key = request_key(request["request_id"])
            first = spans.get(key, (step["step"], step["step"]))[0]
            spans[key] = (first, step["step"])
    return spans


def plain_vllm_log(tmp_path: Path, shift: timedelta = timedelta(0)) -> Path:
    """The same console as vLLM prints it: no collector prefix, times to the second (shifted)."""

    def move(match: re.Match[str]) -> str:
        printed = datetime.strptime("2026-" + match.group(2), "%Y-%m-%d %H:%M:%S") + shift
        return f"{match.group(1)} {printed:%m-%d %H:%M:%S} "

    lines = LOG.read_text().splitlines()
    path = tmp_path / "server.log"
    path.write_text("\n".join(_VLLM_STAMP.sub(move, line[PREFIX_BYTES:]) for line in lines) + "\n")
    return path


def check_against_truth(result, truth) -> dict[str, int]:
    rows = result.alignment.to_arrow(result.logs).to_pylist()
    right: dict[str, int] = {"added": 0, "finished": 0, "iteration": 0}
    for row in rows:
        if row["event"] == "request_added":
            right["added"] += row["step"] == truth[row["request_key"]][0]
        elif row["event"] == "request_finished":
            right["finished"] += row["step"] == truth[row["request_key"]][1]
        elif row["event"] == "iteration":
            right["iteration"] += row["step"] == json.loads(row["fields"])["iteration"]
    return right


def test_collector_logs_place_every_request_and_iteration_line(truth):
    result = align_run([TRACES], [LOG])
    assert check_against_truth(result, truth) == {"added": 34, "finished": 34, "iteration": 71}
    methods = result.alignment.counts()
    assert methods == {"request": 68, "iteration": 71, "window": 5, "unmatched": 5}
    assert result.alignment.confidence[[m == "request" for m in result.alignment.method]].min() == 1
    # the engine prints an iteration line just after its step ends: a sub-ms log offset
    assert 0 < result.log_offsets.offset_ns[0] < 5_000_000
    # what stays unmatched lies outside the profiled steps (start-up and shutdown lines)
    rows = result.alignment.to_arrow(result.logs).to_pylist()
    first_start = int(result.tree.steps.start_ns.min())
    last_end = int((result.tree.steps.start_ns + result.tree.steps.dur_ns).max())
    for row in rows:
        if row["method"] == "unmatched":
            assert not first_start <= row["ts_ns"] <= last_end, row["raw"]


def test_plain_vllm_times_to_the_second_still_place_every_line(tmp_path, truth):
    result = align_run([TRACES], [plain_vllm_log(tmp_path)], year=2026)
    assert check_against_truth(result, truth) == {"added": 34, "finished": 34, "iteration": 71}
    # the log clock is bounded from whole-second lines alone, to well under a second
    offset, residual = result.log_offsets.offset_ns[0], result.log_offsets.residual_ns[0]
    assert abs(offset) < 100_000_000 and residual < 100_000_000


def test_a_server_in_another_time_zone_is_found_and_does_not_matter(tmp_path, truth):
    result = align_run([TRACES], [plain_vllm_log(tmp_path, timedelta(hours=2))], year=2026)
    assert check_against_truth(result, truth) == {"added": 34, "finished": 34, "iteration": 71}
    offset_s = result.log_offsets.offset_ns[0] / 1e9
    assert 7199.9 < offset_s < 7200.1
    assert any("log clock is +7200" in w for w in result.warnings)


def shifted_collector_log(path: Path, lines: list[str], shift: timedelta) -> Path:
    """Collector-prefixed lines as if written on a host whose clock is `shift` ahead."""

    def move(line: str) -> str:
        stamp = datetime.strptime(line[: PREFIX_BYTES - 2], "%Y-%m-%dT%H:%M:%S.%f") + shift
        return f"{stamp:%Y-%m-%dT%H:%M:%S.%f}Z " + line[PREFIX_BYTES:]

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(move(line) for line in lines) + "\n")
    return path


@pytest.mark.parametrize("manifest", [False, True])
def test_two_log_files_on_different_clocks_each_get_their_offset(tmp_path, truth, manifest):
    """The engine's console split over two files, each stamped by a clock of its own."""
    lines = LOG.read_text().splitlines()
    half = len(lines) // 2
    first = shifted_collector_log(tmp_path / "logs" / "a.log", lines[:half], timedelta(0, 0.3))
    second = shifted_collector_log(tmp_path / "logs" / "b.log", lines[half:], timedelta(0, -1.7))
    if manifest:  # `teller collect` names each process's host and log
        ranks = {
            "0": {"host": "node-a", "log": "logs/a.log"},
            "1": {"host": "node-b", "log": "logs/b.log"},
        }
        (tmp_path / "manifest.json").write_text(json.dumps({"format": 1, "ranks": ranks}))
    result = align_run([TRACES], [first, second])
    keys = ["node-a", "node-b"] if manifest else [str(first), str(second)]
    assert result.log_offsets.key == keys
    assert set(result.logs.column("host")) == ({"node-a", "node-b"} if manifest else {""})
    # each recovered up to the engine's printing delay (under 5 ms, as in the single-file case)
    assert 0 < result.log_offsets.offset_of(keys[0]) - 300_000_000 < 5_000_000
    assert 0 < result.log_offsets.offset_of(keys[1]) + 1_700_000_000 < 5_000_000
    assert check_against_truth(result, truth) == {"added": 34, "finished": 34, "iteration": 71}


def test_cli_prints_lines_under_their_steps(capsys):
    assert main(["-q", "align", str(TRACES), str(LOG), "--steps", "3:4"]) == 0
    out = capsys.readouterr()
    listing = out.out.splitlines()
    assert listing[0].startswith("step 3  execute_context_1(80)_generation_1(1)")
    assert "Added request cmpl-a3d631b8f90b2498429421819e598156-0." in listing[1]
    assert listing[1].endswith("[request 1.00 r0]")
    assert "Iteration(3)" in listing[2] and listing[2].endswith("[iteration 1.00 r0]")
    assert listing[3].startswith("step 4")
    assert "149 log records" in out.err


def test_cli_prints_the_unmatched_lines_too(capsys, tmp_path):
    start_up = tmp_path / "start_up.log"  # lines that print no time: nothing places them
    start_up.write_text("".join(f"loading shard {k} of 25\n" for k in range(25)))
    assert main(["-q", "align", str(TRACES), str(LOG)]) == 0
    listing = capsys.readouterr().out.splitlines()
    at = listing.index("unmatched: 5 of 149 records (outside every step or without a time)")
    assert len(listing) == at + 6 and listing[at + 1].endswith("[rank0.log:1]")
    assert main(["-q", "align", str(TRACES), str(LOG), str(start_up)]) == 0
    listing = capsys.readouterr().out.splitlines()
    at = listing.index("unmatched: 30 of 174 records (outside every step or without a time)")
    assert listing[at + 6].startswith("    -       loading shard 0 of 25")
    assert listing[at + 6].endswith("[start_up.log:1]")
    assert len(listing) == at + 22 and listing[-1] == "    … and 10 more"


def test_cli_bad_log_path_is_one_line_error(capsys):
    assert main(["-q", "align", str(TRACES), str(CASE / "missing.log")]) == 2
    assert "missing.log: no such log file" in capsys.readouterr().err


@pytest.mark.parametrize("window", [None, "3:5"])
def test_nccl_watchdog_lines_attach_to_the_hung_collective(tmp_path, window):
    """A simulated collective hang (the GPU-cluster fault the CPU lab cannot make).

    The hung step's annotation never closes, so the trace lacks it: the first step (no step in
    the trace at all), or the one after three closed steps.
    """
    case = tmp_path / "hang"
    argv = ["-q", "lab", "sim", "--out", str(case), "--tp", "2", "--gpus-per-node", "2"]
    argv += ["--steps", "6", "--layers", "2", "--jobs", "1", "--fault", "collective_hang"]
    argv += ["--window", window] if window else []
    assert main([*argv, "--rank", "1"]) == 0
    labels = CaseLabels.read(case)
    result = align_run([case / "traces"], [case / "logs"], year=2026)
    rows = result.alignment.to_arrow(result.logs).to_pylist()
    watchdog = [row for row in rows if row["event"] == "nccl_timeout"]
    assert watchdog and all(row["method"] == "collective" for row in watchdog)
    assert {row["step"] for row in watchdog} == set(labels.steps)
    comm = result.tree.comm
    for row in watchdog:
        seq = json.loads(row["fields"])["seq"]
        (k,) = [
            k
            for k in range(len(comm))
            if comm.rank[k] == row["rank"] and comm.seq[k] == seq and comm.node[k] == row["node"]
        ]
        assert comm.kind[k] == json.loads(row["fields"]).get("op_type", comm.kind[k])
        assert row["confidence"] == 1.0


def test_arrival_lines_stamped_late_by_a_loaded_collector_keep_their_steps(tmp_path, truth):
    """The collector stamps a line when its tee reads the pipe; on a loaded host an Added line
    printed just before its step starts can be stamped several ms into that step (the 18 lab
    evaluation cases, recorded under load, have such lines). Such a request is still admitted by
    that step."""
    lines = LOG.read_text().splitlines()
    late = timedelta(milliseconds=8)
    stamped = []
    for line in lines:
        if "Added request" in line:
            line = (
                shifted_collector_log(tmp_path / "one.log", [line], late).read_text().rstrip("\n")
            )
        stamped.append(line)
    log = tmp_path / "rank0.log"
    log.write_text("\n".join(stamped) + "\n")
    result = align_run([TRACES], [log])
    assert check_against_truth(result, truth) == {"added": 34, "finished": 34, "iteration": 71}


def foreign_log(tmp_path: Path, pid: str, hours: int) -> Path:
    """The case's collector log with its process id replaced and its times moved by `hours`."""

    def move(line: str) -> str:
        stamp = datetime.strptime(line[: PREFIX_BYTES - 2], "%Y-%m-%dT%H:%M:%S.%f")
        return f"{stamp + timedelta(hours=hours):%Y-%m-%dT%H:%M:%S.%f}Z " + line[PREFIX_BYTES:]

    lines = LOG.read_text().replace("pid=12774", f"pid={pid}").splitlines()
    path = tmp_path / f"pid{pid}_{hours}h.log"
    path.write_text("\n".join(move(line) for line in lines) + "\n")
    return path


def test_a_log_of_another_run_is_set_aside_not_aligned(tmp_path):
    other_run = foreign_log(tmp_path, "999999", 2)
    result = align_run([TRACES], [other_run])
    assert len(result.logs) == 0
    (warning,) = [w for w in result.warnings if "set aside" in w]
    assert other_run.name in warning and "(999999)" in warning and "outside the traces" in warning


def test_a_log_only_moved_in_time_or_only_of_other_processes_is_aligned(tmp_path):
    for path in (foreign_log(tmp_path, "12774", 2), foreign_log(tmp_path, "999999", 0)):
        result = align_run([TRACES], [path])
        assert len(result.logs) > 0
        assert not [w for w in result.warnings if "set aside" in w]
