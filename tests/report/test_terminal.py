"""What `teller analyze` prints: tables laid out by rich, prose wrapped at spaces only (a long
engine log line is wrapped, never cut mid-word), and plain text without colour unless stdout is a
terminal."""

from __future__ import annotations

import io
from dataclasses import replace

from teller.callchain.render import format_ns
from teller.cli import main
from teller.rca.diagnose import worst_of
from teller.rca.verdict import LogLine
from teller.report.console import PLAIN, PLAIN_WIDTH, Look, look_for, table_lines, wrapped
from teller.report.diff import distinct_short_names
from teller.report.terminal import render_terminal

ITERATION = (
    "(EngineCore_0 pid=835154) INFO 01-01 00:00:00 [loggers.py:257] Engine 000: Iteration(5): "
    "2 context requests, 2026 context tokens, 22 generation requests, 22 generation tokens, "
    "iteration elapsed time: 19.37 ms, GPU KV cache usage: 19.1%"
)


def _with_log_line(verdict, text: str):
    worst = verdict.findings[0]
    line = LogLine(ts_ns=0, rank=worst.rank, level="INFO", text=text)
    findings = [replace(f, log_lines=[line]) for f in verdict.findings]
    return replace(verdict, findings=findings)


def test_a_long_log_line_wraps_whole_words(contention_analysis):
    verdict = _with_log_line(contention_analysis.diagnose(), ITERATION)
    text = render_terminal(verdict, contention_analysis.breakdown())
    lines = text.splitlines()
    start = next(k for k, line in enumerate(lines) if line.startswith("  log: "))
    shown = [lines[start], *(line for line in lines[start + 1 :] if line.startswith(" " * 7))]
    joined = " ".join(line.strip() for line in shown).removeprefix("log: ")
    assert joined.startswith(ITERATION[:200])  # every word there, in order, none cut
    assert "iteration elapsed time: 19.37 ms" in joined
    assert len(shown) > 1 and all(len(line) <= PLAIN_WIDTH for line in shown)


def test_a_log_line_too_long_ends_at_a_space():
    words = [f"word{k}" for k in range(200)]
    lines = wrapped("  log: ", " ".join(words), PLAIN, max_lines=3)
    assert len(lines) == 3 and lines[-1].endswith(" …")
    assert set(" ".join(lines).split()) - {"log:", "…"} <= set(words)  # whole words only


def test_prose_lines_fit_the_width_and_why_still_wraps(contention_analysis):
    verdict = contention_analysis.diagnose()
    lines = render_terminal(verdict, contention_analysis.breakdown()).splitlines()
    why = next(k for k, line in enumerate(lines) if line.startswith("  why: "))
    assert lines[why + 1].startswith(" " * 7) and not lines[why + 1][7].isspace()
    for line in lines:  # only a single word longer than the width may stick out
        assert len(line) <= PLAIN_WIDTH or " " not in line.strip(), line


def test_plain_unless_a_terminal(monkeypatch):
    assert look_for(io.StringIO()) == PLAIN

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setenv("COLUMNS", "132")
    monkeypatch.delenv("NO_COLOR", raising=False)
    assert look_for(Terminal()) == Look(width=132, color=True)
    monkeypatch.setenv("NO_COLOR", "1")
    assert look_for(Terminal()) == Look(width=132, color=False)


def test_colour_only_when_asked():
    header, rows = ["rank", "share"], [["0", "95%"], ["1", "[cpu_op] 5%"]]
    plain = table_lines(header, rows, PLAIN)
    assert "\x1b" not in "".join(plain)
    assert plain[2].split() == ["1", "[cpu_op]", "5%"]  # cells are text, not rich markup
    assert "\x1b[1m" in "".join(table_lines(header, rows, Look(color=True)))


def test_analyze_output_in_a_pipe_has_no_control_codes(contention_case, capsys):
    assert main(["analyze", str(contention_case), "-q", "--method", "localizer"]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "where the time went" in out
    assert main(["info", str(contention_case), "-q"]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out
    assert out.splitlines()[-4].split() == [
        "rank",
        "steps",
        "kinds",
        "median",
        "longest",
        "found",
        "by",
    ]


def test_names_too_long_for_the_column_stay_distinct():
    names = [f"transformers/models/qwen2/modeling_qwen2.py({line}): forward" for line in (150, 243)]
    shown = distinct_short_names(names, 31)
    assert len(set(shown)) == 2 and all(len(s) <= 31 for s in shown)
    assert "(150): forward" in shown[0] and "(243): forward" in shown[1]


def test_control_characters_from_a_trace_are_shown_not_acted_on():
    hostile = "kernel\x1b[2J\x1b]0;title\x07"
    for look in (PLAIN, Look(color=True)):
        text = "\n".join(
            table_lines(["name"], [[hostile]], look) + wrapped("  log: ", hostile, look)
        )
        assert "\x1b[2J" not in text and "\x07" not in text
        assert text.count("kernel\\x1b[2J\\x1b]0;title\\x07") == 2
        codes = {text[k : k + 4] for k in range(len(text)) if text[k] == "\x1b"}
        assert codes <= {"\x1b[1m", "\x1b[0m"}  # only the header's bold, and only in colour


def test_the_worst_step_is_timed_on_the_rank_its_explanation_names(contention_analysis):
    verdict = contention_analysis.diagnose()
    assert verdict.findings and verdict.findings[0].rank is not None
    # the step's slowest rank took longer than the named rank (a peer waiting for it, say)
    findings = [replace(f, step_dur_ns=f.step_dur_ns + 987_654_321) for f in verdict.findings]
    verdict = replace(verdict, findings=findings)
    worst = worst_of(findings)
    own = next(r for r in verdict.steps if (r.rank, r.step) == (worst.rank, worst.step))

    text = render_terminal(verdict, contention_analysis.breakdown(), PLAIN)
    headline = " ".join(text.split())  # the headline may wrap
    took = f"{format_ns(own.dur_ns)} on rank {worst.rank}"
    assert f"worst: step {worst.step} [{worst.step_kind}] {took}" in headline
    assert format_ns(worst.step_dur_ns) not in headline
