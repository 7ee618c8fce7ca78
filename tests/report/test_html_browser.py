"""The HTML report in a real headless Chromium: it loads from file:// with the network cut off,
logs no console error, has the verdict, timeline, findings, tree and collectives in its DOM, paints
a screenshot, and shows hostile strings from traces and logs as text, never as markup.

Needs Debian's chromium (`apt-get update && apt-get install -y chromium`); skipped without it.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import struct
from pathlib import Path

import pytest

from chromium_page import CHROMIUM, Dom, chromium, console_errors
from conftest import real_trace
from teller.analysis import Analysis
from teller.rca.diagnose import headline_finding

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(
        CHROMIUM is None,
        reason="chromium not installed: apt-get update && apt-get install -y chromium",
    ),
]

HOSTILE = "<script>alert(1)</script>\"quoted\" 'single'"
#: The simulated cases' all-reduce kernels: the hostile case renames them too.
COLLECTIVE_KERNEL = "ncclKernel_AllReduce"


@pytest.fixture(scope="module")
def report(contention_analysis, tmp_path_factory) -> Path:
    return contention_analysis.report(tmp_path_factory.mktemp("html") / "report.html")


def test_detector_sees_a_console_error(tmp_path: Path):
    """The console check can fail: a page that throws is caught."""
    page = tmp_path / "throws.html"
    page.write_text("<!doctype html><p>x</p><script>undefinedFunction()</script>")
    _, stderr = chromium(page, tmp_path, "--dump-dom")
    assert console_errors(stderr), stderr[-2000:]


@pytest.fixture(scope="module")
def guilty(contention_analysis) -> str:
    """The operator the contention case's worst finding names (whatever the method picks)."""
    return headline_finding(contention_analysis.diagnose().findings).operator


def test_report_in_chromium(report: Path, contention_analysis, guilty: str, tmp_path: Path):
    pytest.importorskip("vl_convert", reason="the charts need vl-convert-python (pip install .)")
    verdict = contention_analysis.diagnose()
    worst = headline_finding(verdict.findings)  # what the report draws
    dumped, stderr = chromium(report, tmp_path, "--dump-dom")
    assert console_errors(stderr) == []
    dom = Dom(dumped)
    assert not [e for e in dom.elements if re.match(r"https?:", e[1].get("src", ""))]
    assert not [e for e in dom.elements if re.match(r"https?:", e[1].get("href", ""))]

    (section,) = dom.find("section", id="verdict")
    assert section[1]["class"] == "verdict"  # red: there are findings
    assert verdict.summary.splitlines()[0] in dumped

    assert dom.find("figure", id="chart-steps")
    marks = [e[1].get("aria-label", "") for e in dom.find("path")]
    flagged = [s for s in verdict.steps if s.anomalous]
    assert sum("state: anomalous" in m for m in marks) == len(flagged) > 0
    assert sum("state: normal" in m for m in marks) == len(verdict.steps) - len(flagged)
    texts = {e[2].strip() for e in dom.find("text")}
    assert {"step", "time (ms): bar observed, tick expected", "rank 0", "rank 1"} <= texts
    assert dom.find("figure", id="chart-breakdown") and dom.find("figure", id="chart-excess")
    assert "where the time went" in texts and "self time beyond the normal step (ms)" in texts

    assert len(dom.find("table", id="findings")) == 1
    assert len(dom.find("tr")) >= len(verdict.findings) + 1
    cells = [e[2] for e in dom.find("td")]
    assert worst.explanation in cells
    folded = dom.find("details", cls="finding")
    assert len(folded) == len(verdict.findings)  # every finding, not only the first
    assert all("open" not in e[1] for e in folded)
    assert len(dom.find("table", cls="evidence")) == sum(bool(f.evidence) for f in verdict.findings)
    # log times are ms into the run (with the wall-clock time when the clock is unix), not epoch ns
    assert any(re.fullmatch(r"\+[\d,]+\.\d{3} ms", e[2]) for e in dom.find("td", cls="num"))
    assert not any(re.fullmatch(r"\d{16,}", c.strip()) for c in cells)

    assert dom.find("div", id="tree")
    suspects = dom.find(cls="suspect")
    assert len(suspects) == 1
    assert guilty in "".join(e[2] for e in dom.elements[dom.elements.index(suspects[0]) :][:4])
    assert len(dom.find(cls="path")) >= 2  # the suspect and the nodes above it

    assert dom.find("table", id="collectives")
    assert any(e[2].startswith("rank 0 arrival") for e in dom.find("th"))
    assert_gantt(dom, worst.step, ranks=2)


def assert_gantt(dom: Dom, step: int, ranks: int) -> None:
    """The Gantt chart of `step`: its time axis, one labelled row per rank, every collective
    drawn, and (with peers) waits told apart from the rest, the straggler's row named."""
    (figure,) = dom.find("figure", id="chart-gantt")
    start = dom.elements.index(figure)
    after = dom.elements[start:]
    end = next((k for k, e in enumerate(after[1:], 1) if e[0] in ("figure", "h2")), len(after))
    inside = after[:end]
    texts = [e[2].strip() for e in inside if e[0] == "text"]
    assert f"ms into step {step} (all ranks on one clock)" in texts
    assert sum(bool(re.fullmatch(r"\d+(\.\d+)?", t)) for t in texts) >= 3  # axis ticks
    rows = [t for t in texts if re.fullmatch(r"rank \d+( · last in at \d+ of \d+)?", t)]
    assert len(rows) == ranks, texts
    marks = [e[1].get("aria-label", "") for e in inside if e[0] == "path"]
    assert any("part: compute and other work" in m for m in marks)
    if ranks > 1:
        assert "collective: waiting for the last rank" in texts  # the legend
        assert any("part: collective: waiting for the last rank" in m for m in marks)
        assert any("part: collective: after the last rank arrived" in m for m in marks)
        lasts = [int(re.search(r"last in at (\d+)", t).group(1)) for t in rows]
        assert max(lasts) > 0


def test_screenshot_is_a_painted_png(report: Path, tmp_path: Path):
    shots = {}
    blank = tmp_path / "blank.html"
    blank.write_text("<!doctype html><title>blank</title>")
    for name, page in (("report", report), ("blank", blank)):
        shots[name] = tmp_path / f"{name}.png"
        chromium(page, tmp_path, f"--screenshot={shots[name]}")
    data = shots["report"].read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    assert (width, height) == (1280, 2400)
    # Text, bars and tables compress far worse than an empty page of the same size.
    assert len(data) > 5 * shots["blank"].stat().st_size


@pytest.fixture(scope="module")
def localizer_guilty(contention_case: Path) -> str:
    """The operator the localizer's worst finding names on the contention case.

    The hostile case is diagnosed by the localizer: it measures operators by their durations, so
    renaming one cannot move its verdict. The model reads names, and a name it never saw moved
    its pointer to another operator (a retrained checkpoint did). The report escapes the same
    way for both verdicts."""
    return Analysis(contention_case, method="localizer").diagnose().findings[0].operator


@pytest.fixture(scope="module")
def hostile_case(contention_case: Path, localizer_guilty: str, tmp_path_factory) -> Path:
    """The contention case with the guilty operator, the collective kernels (on every rank, so
    they still pair up) and the step log lines carrying markup."""
    guilty = localizer_guilty
    case = tmp_path_factory.mktemp("hostile") / "case"
    shutil.copytree(contention_case, case)
    for trace in sorted((case / "traces").glob("*.json.gz")):
        document = json.loads(gzip.decompress(trace.read_bytes()))
        for event in document["traceEvents"]:
            name = event.get("name", "")
            if name == guilty or name.startswith(COLLECTIVE_KERNEL):
                event["name"] = name + HOSTILE
        trace.write_bytes(gzip.compress(json.dumps(document).encode(), compresslevel=1))
    log = case / "logs" / "server0.log"
    lines = log.read_text().splitlines()
    # a part of its own after a comma: the stats parser reads a `key: number unit` part only when
    # nothing follows the unit, so markup glued to `GPU KV cache usage: 3.0%` would drop the fill
    # and change what the model reads; here the line's numbers stay as they were
    log.write_text(
        "\n".join(f"{line}, {HOSTILE}" if "Iteration(" in line else line for line in lines)
    )
    return case


def test_hostile_strings_render_escaped(hostile_case: Path, localizer_guilty: str, tmp_path: Path):
    guilty = localizer_guilty
    analysis = Analysis(hostile_case, method="localizer")
    worst = analysis.diagnose().findings[0]
    assert worst.operator == guilty + HOSTILE  # the markup really reached the verdict
    assert any(HOSTILE in line.text for line in worst.log_lines)
    report = analysis.report(tmp_path / "hostile.html")
    assert "<script>" not in report.read_text()
    dumped, stderr = chromium(report, tmp_path, "--dump-dom")
    assert console_errors(stderr) == []
    dom = Dom(dumped)
    assert dom.find("script") == []  # parsed as text, so no script element exists
    texts = [e[2] for e in dom.find("code")]
    assert any(HOSTILE in text for text in texts)  # shown verbatim, quotes included
    assert any(guilty + HOSTILE in text for text in texts)
    if vl_convert_installed():  # the Gantt chart names the renamed collectives, as text
        (figure,) = dom.find("figure", id="chart-gantt")
        after = dom.elements[dom.elements.index(figure) :]
        labels = [e[1].get("aria-label", "") for e in after if e[0] == "path"]
        assert any(COLLECTIVE_KERNEL in m and "<script>alert(1)" in m for m in labels)
    table = dom.elements[dom.elements.index(dom.find("table", id="collectives")[0]) :]
    names = [e[1].get("title", "") for e in table if e[0] == "code"]
    assert any(COLLECTIVE_KERNEL in name and HOSTILE in name for name in names)


def vl_convert_installed() -> bool:
    try:
        import vl_convert  # noqa: F401
    except ImportError:
        return False
    return True


VLLM = "tracelens/vllm_prefilldecode_piecewise/graph_execution.json.gz"
WIDTHS = (1280, 420)
#: Marks every element that sticks out of the page, or whose content sticks out of it (outside any
#: box that scrolls or clips).
LAYOUT_PROBE = """<script>
const width = document.documentElement.clientWidth;
const wide = [];
for (const element of document.querySelectorAll("body *")) {
  let box = element.parentElement, clipped = false;
  while (box && !clipped) {
    clipped = ["auto", "scroll", "hidden"].includes(getComputedStyle(box).overflowX);
    box = box.parentElement;
  }
  const scrolls = ["auto", "scroll", "hidden"].includes(getComputedStyle(element).overflowX);
  const overflows =
    !scrolls && element.clientWidth > 0 && element.scrollWidth > element.clientWidth + 1;
  if (!clipped && (element.getBoundingClientRect().right > width + 1 || overflows)) {
    wide.push(element.tagName + "#" + element.id + "." + (element.getAttribute("class") || ""));
  }
}
document.body.setAttribute("data-wide", JSON.stringify(wide.slice(0, 10)));
document.body.setAttribute("data-scroll", document.documentElement.scrollWidth + "/" + width);
</script>"""


def wider_than_page(page: Path, tmp_path: Path, width: int) -> tuple[list[str], str]:
    """Elements wider than a `width`-px window, and scrollWidth/clientWidth, from a real layout."""
    probe = tmp_path / f"probe-{width}-{page.name}"
    probe.write_text(page.read_text().replace("</body>", LAYOUT_PROBE + "</body>"))
    dumped, stderr = chromium(probe, tmp_path, f"--window-size={width},2000", "--dump-dom")
    assert console_errors(stderr) == []
    (body,) = Dom(dumped).find("body")
    return json.loads(body[1]["data-wide"]), body[1]["data-scroll"]


def screenshots(page: Path, tmp_path: Path, name: str) -> list[Path]:
    """A screenshot per width (kept under TELLER_SCREENSHOTS when set, for a person to look at)."""
    keep = Path(os.environ.get("TELLER_SCREENSHOTS", tmp_path))
    keep.mkdir(parents=True, exist_ok=True)
    shots = []
    for width in WIDTHS:
        shot = keep / f"{name}-{width}.png"
        chromium(page, tmp_path, f"--window-size={width},2400", f"--screenshot={shot}")
        data = shot.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n"
        assert struct.unpack(">II", data[16:24]) == (width, 2400)
        shots.append(shot)
    return shots


def test_the_detector_sees_a_wide_element(tmp_path: Path):
    """The layout check can fail: a page with a 3000-px table is caught."""
    page = tmp_path / "wide.html"
    page.write_text(
        "<!doctype html><body><table id='t' style='width:3000px'><tr><td>x</td></tr></table></body>"
    )
    wide, scroll = wider_than_page(page, tmp_path, 420)
    assert any(w.startswith("TABLE#t") for w in wide) and scroll.startswith("3")


@pytest.mark.parametrize("width", WIDTHS)
def test_nothing_is_wider_than_the_page(report: Path, tmp_path: Path, width: int):
    wide, scroll = wider_than_page(report, tmp_path, width)
    assert wide == [], wide
    page_width, window = (int(n) for n in scroll.split("/"))
    assert page_width <= window


def test_demo_like_report_screenshots(report: Path, tmp_path: Path):
    pytest.importorskip("vl_convert", reason="the charts need vl-convert-python (pip install .)")
    shots = screenshots(report, tmp_path, "contention-report")
    assert all(shot.stat().st_size > 20_000 for shot in shots)


def test_real_one_step_vllm_report(tmp_path: Path):
    """A real vLLM capture of one step: the chart has its axes, and the page fits both widths."""
    pytest.importorskip("vl_convert", reason="the charts need vl-convert-python (pip install .)")
    run = Analysis(real_trace(VLLM), method="localizer")
    report = run.report(tmp_path / "vllm.html")
    dumped, stderr = chromium(report, tmp_path, "--dump-dom")
    assert console_errors(stderr) == []
    dom = Dom(dumped)
    assert dom.find("figure", id="chart-steps")
    texts = {e[2].strip() for e in dom.find("text")}
    assert {"step", "time (ms): bar observed, tick expected", "rank 0"} <= texts
    marks = [e[1].get("aria-label", "") for e in dom.find("path")]
    assert sum("step: 0;" in m and "kind: mixed" in m for m in marks) == 1
    assert dom.find("figure", id="chart-breakdown")  # no finding: the longest step's time
    for width in WIDTHS:
        wide, scroll = wider_than_page(report, tmp_path, width)
        assert wide == [], (width, wide)
        page_width, window = (int(n) for n in scroll.split("/"))
        assert page_width <= window
    screenshots(report, tmp_path, "vllm-one-step-report")


SAMPLED_PAIR = ("hta/sampled_rank0_of128.json.gz", "hta/sampled_rank1_of128.json.gz")


def test_real_two_rank_trace_gantt(tmp_path: Path):
    """Two real ranks of one training job, with collectives in every step: the worst step's
    Gantt chart has both ranks' rows and its axes, and the page fits both widths."""
    pytest.importorskip("vl_convert", reason="the charts need vl-convert-python (pip install .)")
    run = Analysis([real_trace(name) for name in SAMPLED_PAIR], method="localizer")
    verdict = run.diagnose()
    step = (
        verdict.findings[0].step
        if verdict.findings
        else max(verdict.steps, key=lambda r: r.dur_ns).step
    )
    report = run.report(tmp_path / "sampled.html")
    dumped, stderr = chromium(report, tmp_path, "--dump-dom")
    assert console_errors(stderr) == []
    assert_gantt(Dom(dumped), step, ranks=2)
    for width in WIDTHS:
        wide, scroll = wider_than_page(report, tmp_path, width)
        assert wide == [], (width, wide)
        page_width, window = (int(n) for n in scroll.split("/"))
        assert page_width <= window
    screenshots(report, tmp_path, "sampled-two-rank-report")


def test_diff_page_in_chromium(baseline_case, contention_case, tmp_path: Path, capsys):
    """`teller diff --format html` in a real browser: no console error, its charts have axes,
    nothing is wider than the page at either width."""
    pytest.importorskip("vl_convert", reason="the charts need vl-convert-python (pip install .)")
    from teller.cli import main

    argv = ["-q", "diff", str(baseline_case), str(contention_case), "--format", "html"]
    assert main([*argv, "--fail-on-regression", "5"]) == 1
    page = tmp_path / "diff.html"
    page.write_text(capsys.readouterr().out)
    dumped, stderr = chromium(page, tmp_path, "--dump-dom")
    assert console_errors(stderr) == []
    dom = Dom(dumped)
    assert dom.find("figure", id="chart-operators") and dom.find("figure", id="chart-kinds")
    texts = {e[2].strip() for e in dom.find("text")}
    assert {"self time per step, B minus A (ms)", "median step time (ms)"} <= texts
    for width in WIDTHS:
        wide, scroll = wider_than_page(page, tmp_path, width)
        assert wide == [], (width, wide)
        page_width, window = (int(n) for n in scroll.split("/"))
        assert page_width <= window
    screenshots(page, tmp_path, "diff")
