"""Train the root-cause model: `train(config) -> TrainResult`.

Cases are read once into step records (in `jobs` processes: reading a trace is the slow part), the
TPE vocabulary is learned from their candidate paths, and the model is fitted with AdamW on all
steps of the training cases. The evaluation cases are a different recipe (different seeds), so the
split is by case by construction. Deterministic under `seed` (one thread, seeded shuffles).

A checkpoint is a directory: `model.safetensors` (weights), `config.json` (model and training
configuration, fault names, the explanation head's mechanisms, input switches) and `tpe.json`
(the TPE vocabulary). Nothing is pickled.

With `members` > 1 the checkpoint is an ensemble: the same model trained from seeds `seed`,
`seed + 1`, …, each exactly as a single run with that seed would train it, its weights stored
under `member{k}.` in the one safetensors file. Why: on a training set this small, two seeds
disagree about the weak steps (a slightly late rank, a kernel a little slower), and a single
model's verdict on them is a draw; the members' average is steadier.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import shutil
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file
from tqdm import tqdm

from teller.errors import TellerError
from teller.layout import labelled_case_dirs
from teller.rca.dataset import encode, read_case_records, train_vocab
from teller.rca.inputs import CANDIDATE_KINDS, FAULT_NAMES, Batch
from teller.rca.model import MAX_RANKS, ModelConfig, RootCauseModel
from teller.rca.plans import MECHANISMS
from teller.tpe.tokenizer import TPE

#: The checkpoint format: a checkpoint of another format does not load (its inputs differ;
#: default_model/README.md says how each format changed them).
FORMAT = "teller.rca/8"


@dataclass
class TrainConfig:
    data: list[str]  # case directories, or folders holding them
    out: str
    model: ModelConfig = field(default_factory=ModelConfig)
    raw_nodes: bool = False  # ablation: every node its own token (no TPE merges)
    tpe_vocab: int = 512
    epochs: int = 40
    batch_size: int = 64
    lr: float = 3e-3
    weight_decay: float = 0.01
    seed: int = 0
    log_dropout: float = 0.5  # share of training steps shown without logs (the scoreboard has none)
    # rename the ranks of every training step at random (`relabel_ranks`)
    shuffle_ranks: bool = True
    jobs: int = 1  # processes reading cases, then training members side by side
    members: int = 1  # an ensemble of this many models, seeds seed .. seed + members - 1
    cache_dir: str | None = None  # encoded dataset cache (npz + tpe.json), keyed by the inputs
    # a fault type whose labelled steps are left out, to measure how the model meets a fault
    # it never saw (`without_fault`)
    held_out_fault: str | None = None
    progress: bool = True


@dataclass
class TrainResult:
    out: Path
    cases: int
    examples: int
    anomalous: int
    losses: list[float]  # mean total loss per epoch
    seconds: float
    params: int


def find_case_dirs(roots: list[str]) -> list[Path]:
    dirs = labelled_case_dirs(map(Path, roots))
    if not dirs:
        raise TellerError(f"{', '.join(roots)}: no labelled cases (labels.json) found")
    return dirs


def load_dataset(config: TrainConfig) -> tuple[Batch[np.ndarray], TPE, int]:
    """The encoded batch, the TPE vocabulary and the case count; from the cache when it has
    them.

    The cache holds both encodings (TPE and raw nodes) of one read, so the ablations cost no
    second pass over the traces."""
    dirs = find_case_dirs(config.data)
    key = dataset_cache_key(dirs, config.tpe_vocab)
    cache = Path(config.cache_dir) / key if config.cache_dir else None
    name = "arrays-raw.npz" if config.raw_nodes else "arrays.npz"
    if cache is not None and (cache / name).is_file():
        with np.load(cache / name, allow_pickle=False) as data:
            arrays = Batch.from_arrays({k: data[k] for k in data.files})
        return arrays, TPE.load(cache / "tpe.json"), len(dirs)
    records = []
    with ProcessPoolExecutor(max_workers=config.jobs) if config.jobs > 1 else _Serial() as pool:
        results = pool.map(read_case_records, dirs)
        for case_records in tqdm(
            results, total=len(dirs), desc="reading cases", disable=not config.progress
        ):
            records.extend(case_records)
    tpe = train_vocab(records, config.tpe_vocab)
    log_vocab = config.model.log_vocab
    if cache is not None:
        cache.mkdir(parents=True, exist_ok=True)
        tpe.save(cache / "tpe.json")
        for raw, file in ((False, "arrays.npz"), (True, "arrays-raw.npz")):
            arrays = encode(records, tpe, raw=raw, log_vocab=log_vocab)
            np.savez(cache / file, **arrays.arrays())
    arrays = encode(records, tpe, raw=config.raw_nodes, log_vocab=log_vocab)
    return arrays, tpe, len(dirs)


def dataset_cache_key(dirs: list[Path], tpe_vocab: int) -> str:
    """The cache's name for these cases: their paths and their labels' bytes, so a case whose
    labels were written again (the simulator's labelling rules change) is read again, not served
    with the targets it had."""
    labels = [hashlib.sha256((d / "labels.json").read_bytes()).hexdigest() for d in dirs]
    inputs = [str(d.resolve()) for d in dirs] + labels + [tpe_vocab, FORMAT, list(MECHANISMS)]
    return hashlib.sha256(json.dumps(inputs).encode()).hexdigest()[:16]


class _Serial:
    """`map` in this process (tests, one core), with the executor's context-manager shape."""

    def __enter__(self) -> _Serial:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def map(self, fn, items):
        return map(fn, items)


def train(config: TrainConfig) -> TrainResult:
    started = time.perf_counter()
    if config.members < 1:
        raise TellerError(f"members must be at least 1, not {config.members}")
    arrays, tpe, cases = load_dataset(config)
    if config.held_out_fault is not None:
        arrays = without_fault(arrays, config.held_out_fault)
    config.model.vocab_size = tpe.vocab_size
    config.model.mechanisms = len(MECHANISMS)
    seeds = [config.seed + k for k in range(config.members)]
    if config.members > 1 and config.jobs > 1:
        context = multiprocessing.get_context("spawn")  # no forked torch state
        with ProcessPoolExecutor(min(config.jobs, config.members), mp_context=context) as pool:
            results = pool.map(_fit_member_weights, [(config, arrays, s) for s in seeds])
            bar = tqdm(
                results, total=len(seeds), desc="training members", disable=not config.progress
            )
            fitted = [(_from_weights(config, weights), losses) for weights, losses in bar]
    else:
        fitted = [_fit_member((config, arrays, s)) for s in seeds]
    models = [model for model, _ in fitted]
    save(models, tpe, config, Path(config.out), pointer_kinds(arrays))
    return TrainResult(
        out=Path(config.out),
        cases=cases,
        examples=len(arrays),
        anomalous=int(arrays.y_step.sum()),
        losses=np.mean([losses for _, losses in fitted], axis=0).tolist(),  # members' mean
        seconds=time.perf_counter() - started,
        params=sum(m.num_params() for m in models),
    )


def without_fault(arrays: Batch[np.ndarray], fault: str) -> Batch[np.ndarray]:
    """The examples less the anomalous steps labelled `fault`.

    Why a fault's steps and not its cases: the encoded arrays (and their cache) hold steps, not
    which case each came from. The held-out cases' steps outside their labelled ones stay, as
    normal steps, which is what they are labelled in every checkpoint."""
    if fault not in FAULT_NAMES or fault == "none":
        known = ", ".join(f for f in FAULT_NAMES if f != "none")
        raise TellerError(f"held-out fault {fault!r} is not a fault type ({known})")
    dropped = (arrays.y_step > 0) & (arrays.y_fault == FAULT_NAMES.index(fault))
    if not dropped.any():
        raise TellerError(f"held-out fault {fault!r}: the training cases label no step with it")
    return arrays.rows(np.flatnonzero(~dropped))


def _fit_member_weights(
    job: tuple[TrainConfig, Batch[np.ndarray], int],
) -> tuple[dict[str, np.ndarray], list[float]]:
    """`_fit_member` in a worker process, its weights as NumPy arrays: a torch tensor sent back
    through a process pool travels as shared memory whose handles outlive the pool and fail to
    close at interpreter exit."""
    model, losses = _fit_member(job)
    return {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}, losses


def _from_weights(config: TrainConfig, weights: dict[str, np.ndarray]) -> RootCauseModel:
    model = RootCauseModel(config.model)
    model.load_state_dict({k: torch.from_numpy(v) for k, v in weights.items()})
    model.eval()
    return model


def _fit_member(
    job: tuple[TrainConfig, Batch[np.ndarray], int],
) -> tuple[RootCauseModel, list[float]]:
    """One model trained from `seed` on the encoded arrays: (model, mean loss per epoch).

    Everything random is seeded here, so a member is the model a single run with its seed gives,
    whichever process trains it."""
    config, arrays, seed = job
    torch.manual_seed(seed)
    torch.set_num_threads(1)  # bit-for-bit the same weights for the same seed
    model = RootCauseModel(config.model)
    tensors = arrays.map(torch.from_numpy)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=config.lr, weight_decay=config.weight_decay
    )
    count = len(arrays)
    generator = torch.Generator().manual_seed(seed)
    losses = []
    show = config.progress and (config.members == 1 or config.jobs == 1)
    desc = "training" if config.members == 1 else f"training (seed {seed})"
    bar = tqdm(range(config.epochs), desc=desc, disable=not show)
    for _ in bar:
        model.train()
        order = torch.randperm(count, generator=generator)
        total = 0.0
        for start in range(0, count, config.batch_size):
            batch = tensors.rows(order[start : start + config.batch_size])
            if config.log_dropout > 0:
                drop = torch.rand(len(batch), generator=generator) < config.log_dropout
                batch.log_template = batch.log_template.masked_fill(drop[:, None], 0)
            if config.shuffle_ranks:
                batch.tok_rank = relabel_ranks(batch.tok_rank, generator)
            _, loss = model(batch)
            optimizer.zero_grad(set_to_none=True)
            loss["total"].backward()
            optimizer.step()
            total += float(loss["total"].detach()) * len(batch)
        losses.append(total / count)
        bar.set_postfix(loss=f"{losses[-1]:.4f}")
    model.eval()
    return model, losses


#: Least share of a fault type's pointed training steps a candidate kind needs to stay allowed.
MIN_KIND_SHARE = 0.05


def pointer_kinds(arrays: Batch[np.ndarray]) -> dict[str, list[str]]:
    """fault type → the candidate kinds its guilty node had in training (each in at least
    `MIN_KIND_SHARE` of the type's steps with a guilty candidate).

    Why: inference reads the pointer given the fault type the run's flagged steps agree on
    (`LoadedModel.diagnose_records`). A contended link is a collective's transfer or arrival,
    never a matmul; the pointer alone, on a step whose transfer grew by microseconds, can settle
    on the step's largest compute and name an operator the explanation's own fault type rules
    out. The table is what the training cases showed, not a rule written by hand."""
    pointed = (arrays.y_step > 0) & (arrays.y_ptr >= 0)
    rows = np.flatnonzero(pointed)
    kinds = arrays.tok_ckind[rows, arrays.y_ptr[rows]]
    faults = arrays.y_fault[rows]
    out: dict[str, list[str]] = {}
    for f in np.unique(faults).tolist():
        counts = np.bincount(kinds[faults == f], minlength=len(CANDIDATE_KINDS))
        share = counts / counts.sum()
        out[FAULT_NAMES[f]] = [
            k for k, v in zip(CANDIDATE_KINDS, share, strict=True) if v >= MIN_KIND_SHARE
        ]
    return out


def relabel_ranks(tok_rank: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Each example's ranks renamed by its own random permutation of 0..MAX_RANKS-1.

    Why: which rank is guilty is an accident of where a fault was injected, and a small training
    set can hold one fault on one rank only (the lab's cases mostly on rank 1), so a model that
    sees raw rank numbers learns "rank 1 is guilty" and points at rank 1 when rank 0 is the one.
    Renamed ranks keep what matters, which tokens share a rank, and nothing else."""
    relabel = torch.argsort(torch.rand(tok_rank.shape[0], MAX_RANKS, generator=generator), dim=1)
    return torch.gather(relabel, 1, tok_rank.clamp(0, MAX_RANKS - 1))


def save(
    models: list[RootCauseModel],
    tpe: TPE,
    config: TrainConfig,
    out: Path,
    kinds: dict[str, list[str]] | None = None,
) -> None:
    """Write the checkpoint directory atomically (a temp dir renamed into place); one model's
    weights under their own names, an ensemble's under `member{k}.`."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    os.chmod(tmp, 0o755)
    weights = {}
    for k, model in enumerate(models):
        prefix = f"member{k}." if len(models) > 1 else ""
        weights.update({prefix + n: v.contiguous() for n, v in model.state_dict().items()})
    save_file(weights, tmp / "model.safetensors")
    tpe.save(tmp / "tpe.json")
    meta = {
        "format": FORMAT,
        "model": config.model.to_json(),
        "raw_nodes": config.raw_nodes,
        "members": len(models),
        "fault_names": list(FAULT_NAMES),
        "mechanisms": list(MECHANISMS),
        "pointer_kinds": kinds or {},
        "train": {k: v for k, v in asdict(config).items() if k not in ("model", "progress")},
    }
    (tmp / "config.json").write_text(json.dumps(meta, indent=2))
    if (out / "README.md").is_file():  # the shipped model's provenance survives a rebuild
        shutil.copy(out / "README.md", tmp / "README.md")
    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp, out)
