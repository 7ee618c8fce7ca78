"""Training corpora for TPE: trace files and case directories → step slices (or root slices).

The rank files of one case directory (from `teller lab run` / `teller lab sim`, marked by its
`labels.json` or `manifest.json`) are read together as one run; any other trace file is a run by
itself. Each run yields its vertical step slices, or one slice per root when the trace has no step
annotations (training scripts, bare profiler windows).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from teller.callchain.tree import build_tree
from teller.errors import TraceError
from teller.ingest import find_trace_files, read_run
from teller.slices import root_slices, step_slices
from teller.slices.slice import Slice
from teller.tpe.tokenizer import TPE

#: Files that mark a directory as one case (one run) of the lab or the simulator.
CASE_MARKERS = ("labels.json", "manifest.json")


@dataclass
class Corpus:
    """Slices of a set of runs, and where each run's slices start (`run_offsets`)."""

    slices: list[Slice] = field(default_factory=list)
    runs: list[str] = field(default_factory=list)
    run_offsets: list[int] = field(default_factory=lambda: [0])

    @property
    def num_nodes(self) -> int:
        return sum(len(s) for s in self.slices)

    def run_slices(self, run: int) -> list[Slice]:
        return self.slices[self.run_offsets[run] : self.run_offsets[run + 1]]


def find_runs(paths: Iterable[str | Path]) -> list[list[Path]]:
    """Group trace files into runs: the rank files of one case directory form one run; any other
    trace file is a run by itself. Directories are searched."""
    runs: list[list[Path]] = []
    for path in map(Path, paths):
        if not path.exists():
            raise TraceError(path, "no such file or directory")
        if not path.is_dir():
            runs.append([path])
            continue
        by_case: dict[Path, list[Path]] = {}
        for found in find_trace_files([path]):
            by_case.setdefault(_case_of(found, path) or found, []).append(found)
        if not by_case:
            raise TraceError(path, "no trace files found (looked for *.json, *.json.gz, *.sqlite)")
        runs.extend(by_case[key] for key in sorted(by_case))
    return runs


def _case_of(trace: Path, root: Path) -> Path | None:
    """The case directory holding `trace` (at or below `root`), or None outside any case."""
    for directory in trace.parents:
        if any((directory / marker).is_file() for marker in CASE_MARKERS):
            return directory
        if directory == root:
            break
    return None


def run_slices(files: list[Path]) -> list[Slice]:
    """The step slices of one run, or its root slices when it has no steps."""
    tree = build_tree(read_run(files))
    return step_slices(tree) if len(tree.steps) else root_slices(tree)


def load_corpus(paths: Iterable[str | Path], progress: bool = False) -> Corpus:
    """Read every run under `paths` into slices (all files are read before anything is trained)."""
    runs = find_runs(paths)
    iterator: Iterable[list[Path]] = runs
    if progress and len(runs) > 1:
        from tqdm import tqdm

        iterator = tqdm(runs, desc="reading runs", unit="run", leave=False)
    corpus = Corpus()
    for files in iterator:
        corpus.slices.extend(run_slices(files))
        corpus.runs.append(str(files[0].parent if len(files) > 1 else files[0]))
        corpus.run_offsets.append(len(corpus.slices))
    return corpus


@dataclass
class TrainResult:
    """A trained vocabulary and what it was trained on."""

    tpe: TPE
    runs: int
    slices: int
    nodes: int

    @property
    def tokens(self) -> int:
        """Tokens the training corpus encodes to (each applied merge saves one)."""
        return self.nodes - sum(self.tpe.merge_counts)


def train_vocab(
    paths: Iterable[str | Path], vocab_size: int, out: str | Path, progress: bool = False
) -> TrainResult:
    """Train a vocabulary on the runs under `paths` and save it to `out` (atomically)."""
    paths = list(paths)
    corpus = load_corpus(paths, progress=progress)
    if not corpus.num_nodes:
        raise TraceError(", ".join(map(str, paths)), "the traces hold no call-chain nodes")
    tpe = TPE.train(corpus.slices, vocab_size, progress=progress)
    tpe.save(out)
    return TrainResult(tpe, len(corpus.runs), len(corpus.slices), corpus.num_nodes)
