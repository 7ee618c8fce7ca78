"""The period finder on sequences written out by hand: what is a loop's iteration and what is not.

Each element is a top-level operation: a symbol, a start and end on the host clock, the GPU work it
launched, whether it closes an iteration (a copy to the host, a wait, the optimizer's step) and
whether it copies inputs in.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from teller.callchain.periods import Sequence, find_period

US = 1_000


@dataclass
class Op:
    symbol: str
    work_us: int = 0
    closes: bool = False
    copy_in: bool = False
    pause_us: int = 5  # host time before it


def sequence(ops: list[Op], on_gpu: bool = True, extra_work_us: int = 0) -> Sequence:
    ids: dict[str, int] = {}
    symbols, starts, ends = [], [], []
    clock = 0
    for op in ops:
        clock += op.pause_us * US
        symbols.append(ids.setdefault(op.symbol, len(ids)))
        starts.append(clock)
        clock += 10 * US
        ends.append(clock)
    work = np.array([op.work_us * US for op in ops], dtype=np.int64)
    return Sequence(
        symbols=np.array(symbols, dtype=np.int64),
        start_ns=np.array(starts, dtype=np.int64),
        end_ns=np.array(ends, dtype=np.int64),
        work_ns=work,
        closes=np.array([op.closes for op in ops]),
        copy_in=np.array([op.copy_in for op in ops]),
        total_work_ns=float(work.sum() + extra_work_us * US),
        on_gpu=on_gpu,
    )


def decode_step() -> list[Op]:
    """One serving step: inputs in, a forward of four layers, sampling, tokens out."""
    layers = [Op(name, work_us=8) for _ in range(4) for name in ("norm", "qkv", "attn", "mlp")]
    return [
        Op("copy inputs", copy_in=True, pause_us=300),  # the scheduler ran before it
        Op("embed", work_us=2),
        *layers,
        Op("lm_head", work_us=6),
        Op("sample", work_us=1),
        Op("tokens to host", closes=True),
    ]


def boundaries(ops: list[Op], period) -> list[tuple[str, int]]:
    return [(ops[int(i)].symbol, int(i)) for i in period.first]


def test_a_serving_loop_is_cut_into_its_steps_where_each_begins() -> None:
    warmup = [Op("load", pause_us=1000), Op("mlp", work_us=3)]
    ops = warmup + decode_step() * 5 + [Op("copy inputs", copy_in=True), Op("embed", work_us=2)]
    period = find_period(sequence(ops))

    assert period is not None
    step = len(decode_step())
    assert period.length == step
    assert boundaries(ops, period) == [("copy inputs", 2 + k * step) for k in range(5)]
    assert period.stop.tolist() == [2 + (k + 1) * step for k in range(5)]


def test_an_extra_operation_in_one_step_moves_only_that_step() -> None:
    steps = [decode_step() for _ in range(5)]
    steps[2].insert(5, Op("recompile", work_us=50))
    ops = [op for step in steps for op in step]
    period = find_period(sequence(ops))

    assert period is not None
    starts = [int(i) for i in period.first]
    assert [ops[i].symbol for i in starts] == ["copy inputs"] * 5
    assert np.diff(starts).tolist() == [len(s) for s in steps[:4]]  # 24, 24, 25, 24


def test_one_forward_is_not_cut_into_its_layers() -> None:
    """Sixteen layers repeat as regularly as any loop, but none closes: nothing comes back."""
    layers = [Op(name, work_us=8) for _ in range(16) for name in ("norm", "qkv", "attn", "mlp")]
    ops = [Op("copy inputs", copy_in=True), Op("embed"), *layers, Op("lm_head", work_us=6)]
    ops.append(Op("tokens to host", closes=True))
    assert find_period(sequence(ops)) is None


def test_layers_that_each_close_lose_to_the_steps_that_hold_them() -> None:
    """A model that synchronises in every layer (an MoE reading its routing back): the layers
    pass as loops themselves; the coarser loop that holds them is the iteration."""
    step: list[Op] = [Op("copy inputs", copy_in=True, pause_us=300), Op("embed", work_us=2)]
    for _ in range(12):
        step += [Op("router", work_us=2), Op("routing to host", closes=True), Op("experts", 9)]
    step += [Op("lm_head", work_us=6), Op("tokens to host", closes=True)]
    ops = step * 4
    period = find_period(sequence(ops))
    assert period is not None
    assert len(period) == 4
    assert period.length == len(step)


def test_a_loop_that_holds_little_of_the_work_is_not_the_iteration() -> None:
    """The loop repeats, but most GPU time is outside it (a long compute after a short warm-up)."""
    ops = decode_step() * 3
    assert find_period(sequence(ops)) is not None
    assert find_period(sequence(ops, extra_work_us=10_000)) is None


def test_a_repeat_with_nothing_coming_back_is_no_loop() -> None:
    """Two kernels alternating, as in a bare nsys capture of a microbenchmark."""
    ops = [Op(name, work_us=1000) for _ in range(200) for name in ("gemm", "add")]
    assert find_period(sequence(ops)) is None


def test_a_loop_with_an_idle_gpu_is_host_work() -> None:
    """CUDA graph capture: a sync per piece, but the kernels are recorded, not run."""
    piece = [Op("fill", work_us=0), Op("attention", work_us=0), Op("sync", closes=True)]
    ops = piece * 20
    idle = sequence(ops)
    idle.work_ns[1::3] = 30  # 30 ns of GPU time in each 35 µs piece
    idle.total_work_ns = float(idle.work_ns.sum())
    assert find_period(idle) is None


def test_a_single_iteration_is_no_loop() -> None:
    assert find_period(sequence(decode_step())) is None
    assert find_period(sequence(decode_step() * 2)) is not None


def test_a_cpu_only_loop_needs_no_gpu_work() -> None:
    step = [Op("recv", pause_us=200), Op("matmul"), Op("softmax"), Op("send", closes=True)]
    period = find_period(sequence(step * 4, on_gpu=False))
    assert period is not None and len(period) == 4
    assert [int(i) for i in period.first] == [0, 4, 8, 12]
