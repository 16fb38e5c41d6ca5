"""FLOP counts, timers, and the measurement of one provider on one case.

FLOPs follow the flash-attention benchmarks so that TFLOPS compare across papers: the forward does
two matmuls of ``2 * b * h * s_q * s_k * d`` FLOPs each (``4 b h s_q s_k d``), halved by a causal
mask on square attention; the backward does five such matmuls (2.5x the forward) and forward plus
backward 3.5x. Recomputation inside the backward is not counted, as in those benchmarks.
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .providers import BHSD, Case, Provider

MODES = ("bwd", "fwd", "fwd_bwd")
MODE_FLOP_FACTOR = {"fwd": 1.0, "bwd": 2.5, "fwd_bwd": 3.5}

Timer = Callable[..., float]


def attention_flops(
    batch: int,
    seqlen_q: int,
    seqlen_k: int,
    heads: int,
    headdim: int,
    causal: bool,
    mode: str = "bwd",
) -> float:
    """FLOPs of one attention call in ``mode`` (``fwd``, ``bwd`` or ``fwd_bwd``).

    ``4 * b * s_q * s_k * h * d`` for the forward, halved if causal (exact for square attention,
    the only shape the benchmarks use), times 1, 2.5 or 3.5.
    """
    if mode not in MODE_FLOP_FACTOR:
        raise ValueError(f"mode must be one of {list(MODE_FLOP_FACTOR)}, got {mode!r}")
    fwd = 4.0 * batch * seqlen_q * seqlen_k * heads * headdim
    if causal:
        fwd /= 2.0
    return MODE_FLOP_FACTOR[mode] * fwd


def tflops(flops: float, ms: float) -> float:
    """TFLOP/s of ``flops`` done in ``ms`` milliseconds."""
    if ms <= 0:
        raise ValueError(f"ms must be > 0, got {ms}")
    return flops / (ms * 1e-3) / 1e12


# Timed calls per round at least, however long a call takes. With the sweep's default (100 ms
# in four rounds) ``do_bench`` times a 10 ms backward (d128 full 16k) two or three times per
# round, so one call run at a lower clock moved that config's ratio by several percent between
# runs (0.90x in the sweeps against 0.94-0.95x in 60 ms-per-round A/B runs; H200, session 17).
MIN_TIMED_CALLS = 5


def do_bench_ms(
    fn: Callable[[], Any],
    warmup: float,
    rep: float,
    grad_to_none: Sequence[Any] | None = None,
    min_calls: int = MIN_TIMED_CALLS,
) -> float:
    """Median time of ``fn`` in ms with ``triton.testing.do_bench`` (L2 flushed before each call),
    over at least ``min_calls`` timed calls.

    The median, not Triton's default mean: one slow outlier (a clock change, another process)
    should not move a number that is compared to others at the percent level. ``do_bench`` times
    ``rep / estimate`` calls; where that is fewer than ``min_calls`` it runs again for the rest
    (its own warm-up and estimate calls come first, so the added calls are not cold).
    """
    import triton.testing

    def bench(rep_ms: float) -> list[float]:
        times = triton.testing.do_bench(
            fn, warmup=warmup, rep=rep_ms, grad_to_none=grad_to_none, return_mode="all"
        )
        return [float(t) for t in times]

    times = bench(rep)
    # Bounded: each pass adds at least one call (do_bench times max(1, rep / estimate)).
    for _ in range(min_calls):
        missing = min_calls - len(times)
        if missing <= 0:
            break
        times += bench((missing + 0.5) * statistics.median(times))
    return float(statistics.median(times))


def wall_clock_ms(
    fn: Callable[[], Any],
    warmup: float,
    rep: float,
    grad_to_none: Sequence[Any] | None = None,
    min_calls: int = 3,
) -> float:
    """A host-clock stand-in for ``do_bench_ms`` with the same signature (tests run it on the CPU).

    Runs ``fn`` for about ``warmup`` ms, then about ``rep`` ms (at least ``min_calls`` calls),
    clearing the gradients of ``grad_to_none`` before each timed call, and returns the median.
    """

    def call() -> float:
        for x in grad_to_none or ():
            x.grad = None
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e3

    deadline = time.perf_counter() + warmup * 1e-3
    call()
    while time.perf_counter() < deadline:
        call()
    times = [call() for _ in range(min_calls)]
    deadline = time.perf_counter() + rep * 1e-3
    while time.perf_counter() < deadline:
        times.append(call())
    return float(statistics.median(times))


# ------------------------------------------------------------------------------------------------
# Measuring one provider on one case


def short_reason(exc: BaseException) -> str:
    """``Type: first line`` of an exception: compiler errors run to pages, a skip line must not."""
    text = str(exc).strip().splitlines()
    first = text[0] if text else ""
    if len(first) > 200:
        first = first[:197] + "..."
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


class Inputs:
    """q, k, v, dout of one case, made once and shared by every provider (in each layout)."""

    def __init__(self, case: Case, device: Any, seed: int) -> None:
        import torch

        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[case.dtype]
        gen = torch.Generator(device=device).manual_seed(seed)

        def draw(heads: int) -> Any:
            shape = (case.batch, case.seqlen, heads, case.headdim)
            return torch.randn(shape, generator=gen, device=device, dtype=dtype)

        self.layouts = {
            "bshd": (draw(case.heads), draw(case.kv_heads), draw(case.kv_heads), draw(case.heads))
        }

    def get(self, layout: str) -> tuple[Any, Any, Any, Any]:
        if layout not in self.layouts:
            if layout != BHSD:
                raise ValueError(f"unknown layout {layout!r}")
            self.layouts[layout] = tuple(
                x.transpose(1, 2).contiguous() for x in self.layouts["bshd"]
            )
        return self.layouts[layout]


def bench_step(fn: Callable[..., Any], leaves: Sequence[Any], dout: Any, mode: str) -> Callable:
    """The callable ``do_bench`` times: the backward alone, the forward alone, or both."""
    import torch

    if mode == "bwd":
        out = fn(*leaves)

        def step() -> None:
            out.backward(dout, retain_graph=True)

    elif mode == "fwd":

        def step() -> None:
            with torch.no_grad():
                fn(*leaves)

    elif mode == "fwd_bwd":

        def step() -> None:
            fn(*leaves).backward(dout)

    else:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    return step


def repeat_diffs(
    fn: Callable[..., Any], leaves: Sequence[Any], dout: Any, repeats: int, mode: str = "bwd"
) -> tuple[tuple[float, ...], bool]:
    """Run the backward ``repeats`` times (one forward); compare each run with the first.

    Returns the largest |difference| of each gradient (dq, dk, dv) over the runs and whether every
    run was bitwise equal to the first. In ``fwd`` mode the forward output is compared instead.
    """
    import torch

    from dash_attn.testing import bitwise_equal, max_abs_diff

    if mode == "fwd":

        def once() -> tuple[Any, ...]:
            with torch.no_grad():
                return (fn(*leaves),)

    else:
        out = fn(*leaves)

        def once() -> tuple[Any, ...]:
            for x in leaves:
                x.grad = None
            out.backward(dout, retain_graph=True)
            return tuple(x.grad for x in leaves)

    first = once()
    worst = [0.0] * len(first)
    equal = True
    for _ in range(repeats - 1):
        for i, (a, b) in enumerate(zip(first, once(), strict=True)):
            if not bitwise_equal(a, b):
                equal = False
                worst[i] = max(worst[i], max_abs_diff(a, b))
    for x in leaves:
        x.grad = None
    return tuple(worst), equal


@dataclass(frozen=True)
class Measurement:
    """One provider on one case: the median of its rounds' median ms, each round's ms, the
    schedule and kernel configuration that ran, and the repeat check (None if not run)."""

    ms: float
    schedule: str | None
    bitwise_repeatable: bool | None
    kernel: str | None = None
    ms_rounds: tuple[float, ...] = ()


def launched_schedule(provider: Provider, mode: str) -> str | None:
    """The schedule a dash backward really ran (``auto`` resolved), from ``last_launch_info``."""
    if provider.family != "dash":
        return provider.schedule
    if mode == "fwd":
        return provider.schedule
    from dash_attn import last_launch_info

    info = last_launch_info()
    return info.schedule_name if info is not None else provider.schedule


def launched_kernel(provider: Provider, mode: str) -> str | None:
    """The backward kernel configuration a dash provider ran, e.g. ``triton 64x128w8s3a dq:tma``
    (backend, tiles, dQ reduction), from ``last_launch_info``; None otherwise."""
    if provider.family != "dash" or mode == "fwd":
        return None
    from dash_attn import last_launch_info

    info = last_launch_info()
    if info is None:
        return None
    return f"{info.backend} {info.tiles.label} dq:{info.dq_reduce}"


class ProviderTiming:
    """One provider's timed step on one case, kept alive across the rounds of the case so that
    the sweep can interleave providers: round 1 times every provider once, round 2 again, ...

    Why interleave: timed one after the other, providers whose call is host-bound (~0.5 ms of
    GPU work) read up to 1.4x apart on the same kernel and tables depending on their place in
    the sequence (H200, session 13, causal 512: ``dash_hopper_auto`` 0.544 ms and
    ``dash_hopper_symmetric_shift`` 0.446 ms at d64, 0.616 and 0.435 ms at d128, the same
    launch); the median over interleaved rounds is what a side-by-side comparison needs.
    """

    def __init__(self, provider: Provider, case: Case, inputs: Inputs, *, mode: str, device: Any):
        self.provider = provider
        self.mode = mode
        with provider.context():
            self.fn = provider.make(case, device)
            q, k, v, self.dout = inputs.get(provider.layout)
            grad = mode != "fwd"
            self.leaves = [x.detach().requires_grad_(grad) for x in (q, k, v)]
            self.step: Callable | None = bench_step(self.fn, self.leaves, self.dout, mode)
        self.times: list[float] = []
        self.schedule: str | None = None
        self.kernel: str | None = None

    def prime(self) -> None:
        """One untimed step, waited for: whatever the provider compiles or caches on its first
        call happens here, before any round, instead of inside the first round's warm-up."""
        if self.step is None:
            raise RuntimeError(f"{self.provider.name}: primed after finish()")
        with self.provider.context():
            self.step()
            if self.leaves[0].is_cuda:
                import torch

                torch.cuda.synchronize(self.leaves[0].device)

    def time(self, timer: Timer, warmup: float, rep: float) -> float:
        """One round: ``timer``'s ms for the step; the first round also records what ran."""
        if self.step is None:
            raise RuntimeError(f"{self.provider.name}: timed after finish()")
        with self.provider.context():
            grad_to_none = self.leaves if self.mode != "fwd" else None
            ms = timer(self.step, warmup, rep, grad_to_none)
            if not self.times:
                self.schedule = launched_schedule(self.provider, self.mode)
                self.kernel = launched_kernel(self.provider, self.mode)
        self.times.append(ms)
        return ms

    def finish(self, repeats: int) -> Measurement:
        """Frees the timed graph, runs the repeat check (``repeats`` calls compared bitwise;
        skipped below 2) and returns the measurement: the median over the rounds."""
        if not self.times:
            raise RuntimeError(f"{self.provider.name}: finish() before any round")
        self.step = None  # frees the timed graph before the check builds its own
        repeatable = None
        if repeats >= 2:
            with self.provider.context():
                _, repeatable = repeat_diffs(self.fn, self.leaves, self.dout, repeats, self.mode)
        return Measurement(
            ms=statistics.median(self.times), schedule=self.schedule,
            bitwise_repeatable=repeatable, kernel=self.kernel, ms_rounds=tuple(self.times),
        )  # fmt: skip


def idle_gpu(device: Any, seconds: float) -> None:
    """Let the GPU finish its work and idle for ``seconds`` (nothing without CUDA).

    The sweep does this before every provider's turn in a round: on the H200, whose power cap
    sets the clock from the last few hundred ms of power draw, a provider timed right after a
    power-hungry one ran at a lower clock (1476-1545 MHz against the others' 1650-1690, 10%
    slower) and rounds read up to 28% apart; after 0.5 s of idleness every provider ran at
    1980 MHz and its rounds agreed within 1-2% at 4k tokens (session 18, call 3's
    ``rounds_probe.txt``)."""
    if getattr(device, "type", device) != "cuda" or seconds <= 0:
        return
    import torch

    torch.cuda.synchronize(device)
    time.sleep(seconds)


def warm_up_gpu(device: Any, seconds: float) -> float:
    """Keep the GPU busy with bf16 matmuls for about ``seconds`` before the first timing; returns
    the seconds spent (0 without CUDA). Without it the run's first measurement ran on a GPU that
    had been idle (H200, commit 45ea8c2: ``auto`` 83 TFLOPS at hd128 causal 512, the first
    config, against 105 for ``symmetric_shift``, the same kernel and tables, timed two providers
    later)."""
    if getattr(device, "type", device) != "cuda" or seconds <= 0:
        return 0.0
    import torch

    started = time.perf_counter()
    a = torch.randn(4096, 4096, device=device, dtype=torch.bfloat16)
    while time.perf_counter() - started < seconds:
        for _ in range(20):
            a @ a
        torch.cuda.synchronize(device)
    return time.perf_counter() - started


def cleanup(device: Any) -> None:
    """Drop the last provider's graphs and cached blocks, so the next one starts from the same
    free memory (and a failure does not leave an out-of-memory state behind)."""
    gc.collect()
    if getattr(device, "type", device) == "cuda":
        import torch

        torch.cuda.empty_cache()


def gpu_alive(device: Any) -> bool:
    """False when the CUDA context is broken (an illegal address poisons every later call)."""
    if getattr(device, "type", device) != "cuda":
        return True
    import torch

    try:
        torch.cuda.synchronize(device)
        torch.empty(1, device=device).add_(1)
        torch.cuda.synchronize(device)
    except Exception:  # noqa: BLE001
        return False
    return True
