"""`teller tpe train` and `teller tpe stats`, called in-process on real traces."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import real_trace
from teller.cli import main
from teller.tpe import TPE

TRAIN = "tracelens/hf_qwen1.5-0.5b_h100.json.gz"
OTHER = "hta/sampled_rank0_of128.json.gz"


def test_train_writes_a_vocabulary_and_stats_reads_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    vocab = tmp_path / "vocab.json"

    assert (
        main(["-q", "tpe", "train", str(real_trace(TRAIN)), "--vocab", "300", "-o", str(vocab)])
        == 0
    )
    trained = capsys.readouterr().out
    tpe = TPE.load(vocab)
    assert tpe.vocab_size <= 300 and tpe.merges
    assert f"{tpe.vocab_size:,} tokens" in trained

    assert main(["tpe", "stats", str(real_trace(OTHER)), "--vocab", str(vocab), "--top", "3"]) == 0
    report = capsys.readouterr().out
    assert "R = 1 - tokens/nodes per slice: mean" in report
    assert "rank 0 step 0" in report and "rank 0 step 1" in report
    assert report.count("- merge#") == 3
    assert "⇒ kernel:" in report, "top merges are printed as subtrees with launch edges"


def test_bad_input_exits_2_naming_the_file_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    broken = tmp_path / "broken.json"
    broken.write_text('{"traceEvents": [{"ph": "X", "name": ')
    vocab = tmp_path / "vocab.json"

    assert main(["-q", "tpe", "train", str(broken), "--vocab", "64", "-o", str(vocab)]) == 2
    assert str(broken) in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["broken.json"]

    assert main(["tpe", "stats", str(real_trace(OTHER)), "--vocab", str(broken)]) == 2
    err = capsys.readouterr().err
    assert str(broken) in err and "not a TPE vocabulary" in err

    missing = tmp_path / "missing"
    assert main(["-q", "tpe", "train", str(missing), "--vocab", "64", "-o", str(vocab)]) == 2
    assert "no such file or directory" in capsys.readouterr().err
