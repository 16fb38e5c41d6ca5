"""Interleaved timing rounds: the method behind the A/B probes under benchmarks/results/h200/
(sessions 32-36), in one place.

Small differences between two kernels (1-3%) drown in the drift of a GPU's clock and
temperature over a run. So each round runs every contender once, in an order that rotates over
the permutations of the contenders, and a ratio is taken per round (A's time over B's, both
from the same round) before the median: drift that is slow against one round cancels.

    from tools.hopper.interleaved import cuda_timer, run_rounds, ratio_line
    times = run_rounds({"A": shipped, "B": candidate, "F": fa4}, rounds=24, timer=cuda_timer)
    print(ratio_line(times, "A", "B"))   # A/B (>1: B faster) 1.0123 [1.0034, 1.0201]

``timer`` takes a zero-argument callable and returns its time in ms; ``cuda_timer`` brackets
it with CUDA events and synchronises (GPU time of whatever it enqueued, host gaps included).
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Callable, Mapping, Sequence

Timer = Callable[[Callable[[], object]], float]


def cuda_timer(fn: Callable[[], object]) -> float:
    """Milliseconds between CUDA events recorded around ``fn()`` on the current stream."""
    import torch

    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end)


def round_orders(keys: Sequence[str], rounds: int, stride: int = 7) -> list[tuple[str, ...]]:
    """The order of each round: permutation ``(i * stride) % n!`` of ``keys`` in round ``i``,
    so that consecutive rounds start with different contenders (7 is prime to the 2, 6, 24 and
    120 permutations of two to five contenders, so every order comes round in turn)."""
    orders = list(itertools.permutations(keys))
    return [orders[(i * stride) % len(orders)] for i in range(rounds)]


def run_rounds(
    fns: Mapping[str, Callable[[], object]], rounds: int, timer: Timer = cuda_timer
) -> dict[str, list[float]]:
    """Each contender's time in each round (ms), in round order."""
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    times: dict[str, list[float]] = {key: [] for key in fns}
    for order in round_orders(list(fns), rounds):
        for key in order:
            times[key].append(timer(fns[key]))
    return times


def quantile(values: Sequence[float], p: float) -> float:
    """The ``p`` quantile by rank (the probes' convention: no interpolation)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p * len(ordered)))]


def ratios(times: Mapping[str, Sequence[float]], num: str, den: str) -> list[float]:
    """Per-round ``num / den`` (> 1: ``den`` is faster)."""
    return [a / b for a, b in zip(times[num], times[den], strict=True)]


def ratio_line(times: Mapping[str, Sequence[float]], num: str, den: str) -> str:
    """``num/den (>1: den faster) median [25%, 75%]`` of the per-round ratios."""
    r = ratios(times, num, den)
    return (
        f"   {num}/{den} (>1: {den} faster) {statistics.median(r):.4f} "
        f"[{quantile(r, 0.25):.4f}, {quantile(r, 0.75):.4f}]"
    )


def medians_line(times: Mapping[str, Sequence[float]]) -> str:
    """Each contender's median time: ``A 5.554 ms  B 5.599 ms ...``."""
    return "  ".join(f"{key} {statistics.median(v):.3f} ms" for key, v in times.items())


def repeat(fn: Callable[[], object], calls: int) -> Callable[[], None]:
    """A contender that runs ``fn`` ``calls`` times back to back (one timed unit of a round:
    several calls so that a short kernel's launch gaps do not dominate)."""
    if calls < 1:
        raise ValueError(f"calls must be >= 1, got {calls}")

    def run() -> None:
        for _ in range(calls):
            fn()

    return run
