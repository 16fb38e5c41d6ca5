"""The GPU loops of ``dash-attn bench``: the operator sweep and the determinism table.

Each loop takes its providers, timer and device from the caller (``main._run_gpu``), so the CPU
tests run them with test doubles. A provider that fails is skipped with its reason (``Skips``);
the loop goes on unless the CUDA context is broken.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .providers import Case, Provider, ProviderUnavailable
from .runinfo import Deadline, Progress
from .timing import (
    Inputs,
    Measurement,
    ProviderTiming,
    Timer,
    attention_flops,
    cleanup,
    gpu_alive,
    idle_gpu,
    launched_schedule,
    repeat_diffs,
    short_reason,
    tflops,
    warm_up_gpu,
)

# A case whose providers took longer than this to prime (their first calls compile kernels, on
# the CPU, while the GPU idles) gets REWARM_S of GPU warm-up before its first round. Without it
# the first rounds after a compile could run slow: H200, session 55, call 8, the run's first
# config (hd 128 causal 512): three of four dash_hopper_auto rounds 1.5-1.7x slower than the
# fourth, FA4 non-det's first two rounds too (benchmarks/NOTES.md item 302).
PRIME_IDLE_S = 1.0
REWARM_S = 1.0


@dataclass
class Skips:
    """Providers that did not run, with the reason; each unavailable provider is printed once."""

    items: list[dict[str, Any]]
    announced: set[str]

    def add(self, stage: str, provider: str, case: str, reason: str, note: Callable) -> None:
        self.items.append({"stage": stage, "provider": provider, "config": case, "reason": reason})
        key = f"{provider}: {reason}"
        if key not in self.announced:
            self.announced.add(key)
            note(f"  skip {provider} ({case}): {reason}")


ProviderFactory = Callable[[Case], list[Provider]]


def _case_fields(case: Case) -> dict[str, Any]:
    return {
        "dtype": case.dtype,
        "headdim": case.headdim,
        "seqlen": case.seqlen,
        "batch": case.batch,
        "heads": case.heads,
        "causal": case.causal,
    }


def _short(name: str) -> str:
    return name.removeprefix("dash_")


def _config_line(case: Case, rows: Sequence[dict[str, Any]], seconds: float) -> str:
    parts = [f"{case.label}  {seconds:5.1f} s"]
    for row in rows:
        parts.append(f"{_short(row['provider'])} {row['tflops']:.0f}")
    return "  ".join(parts) if rows else parts[0] + "  (no provider ran)"


def _time_case(
    case: Case,
    providers: Sequence[Provider],
    inputs: Inputs,
    *,
    mode: str,
    warmup: float,
    rep: float,
    rounds: int,
    repeats: int,
    timer: Timer,
    device: Any,
    skips: Skips,
    note: Callable[[str], None],
    idle_s: float = 0.0,
    settle_ms: float = 0.0,
) -> tuple[list[tuple[Provider, Measurement]], bool]:
    """The providers of one case in ``rounds`` interleaved rounds (every other one in reverse
    order; the GPU idle for ``idle_s`` before each provider's turn, then ``settle_ms`` of the
    provider's own untimed calls), then each one's repeat check. Before the rounds each
    provider is made and called once (``ProviderTiming.prime``: its compiles), and where that
    took over ``PRIME_IDLE_S`` the GPU is warmed up for ``REWARM_S``.
    Returns the measurements (in provider order) and False if the CUDA context broke (the
    caller stops); a provider that fails is skipped with its reason."""
    timings: dict[str, ProviderTiming] = {}
    failed: set[str] = set()

    def skip(provider: Provider, exc: Exception) -> bool:
        failed.add(provider.name)
        timings.pop(provider.name, None)
        skips.add("sweep", provider.name, case.label, short_reason(exc), note)
        cleanup(device)
        return isinstance(exc, ProviderUnavailable) or gpu_alive(device)

    # Every provider made and called once before the rounds, so no round times a GPU that sat
    # idle while a provider compiled; after a long priming the GPU is warmed up again.
    primed_at = time.perf_counter()
    for provider in providers:
        try:
            timing = ProviderTiming(provider, case, inputs, mode=mode, device=device)
            timing.prime()
            timings[provider.name] = timing
        except Exception as exc:  # noqa: BLE001 - a failing provider never stops the sweep
            if not skip(provider, exc):
                return [], False
    if time.perf_counter() - primed_at > PRIME_IDLE_S:
        warm_up_gpu(device, REWARM_S)

    for round_index in range(rounds):
        # Every other round in reverse order, so that no provider always comes first: our
        # providers' first round read 2-6% faster than their later ones while FA4's, timed
        # after them, did not (H200, session 15); with reversed rounds a provider's place
        # still moves its time by several percent (session 16), hence an even default.
        ordered = providers if round_index % 2 == 0 else list(reversed(providers))
        for provider in ordered:
            if provider.name in failed:
                continue
            try:
                timing = timings[provider.name]
                idle_gpu(device, idle_s)
                # The settling calls are the timer's warm-up (back to back, untimed).
                timing.time(timer, warmup / rounds + settle_ms, rep / rounds)
            except Exception as exc:  # noqa: BLE001 - a failing provider never stops the sweep
                if not skip(provider, exc):
                    return [], False
    measured: list[tuple[Provider, Measurement]] = []
    for provider in providers:
        timing = timings.pop(provider.name, None)
        if timing is None:
            continue
        try:
            measured.append((provider, timing.finish(repeats)))
        except Exception as exc:  # noqa: BLE001
            if not skip(provider, exc):
                return measured, False
    return measured, True


def run_sweep(
    cases: Sequence[Case],
    make_providers: ProviderFactory,
    *,
    meta: dict[str, Any],
    mode: str,
    warmup: float,
    rep: float,
    repeats: int,
    seed: int,
    device: Any,
    timer: Timer,
    deadline: Deadline,
    skips: Skips,
    on_config: Callable[[list[dict[str, Any]]], None] | None = None,
    rounds: int = 1,
    idle_s: float = 0.0,
    settle_ms: float = 0.0,
) -> list[dict[str, Any]]:
    """Time every provider on every case; returns the rows of bench.csv.

    With ``rounds`` > 1 the providers of a case are timed in interleaved rounds (all once, then
    all again in reverse order, ...), each round with ``warmup / rounds`` and ``rep / rounds``
    ms, and a row's ``ms`` is the median of its rounds (``ms_rounds`` lists them): about the
    same total timing as one round (plus the timer's own estimate per round), and no provider
    favoured by its place in the sequence. ``idle_s``: seconds of GPU idleness before each
    provider's turn (``timing.idle_gpu``), so that none inherits the clock that the power draw
    of the one before left. ``settle_ms``: ms of the provider's own calls, back to back and
    untimed, before each of its turns, so that it is timed at the clock its own power draw
    sustains (the power cap's, on a GPU that reaches it). ``on_config`` is called with all
    rows so far after each case (the caller rewrites its files).
    """
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, got {rounds}")
    if settle_ms < 0:
        raise ValueError(f"settle_ms must be >= 0, got {settle_ms}")
    rows: list[dict[str, Any]] = []
    progress = Progress(len(cases), f"bench {mode}")
    try:
        for case in cases:
            if not deadline.allows("report"):
                progress.note(f"deadline reached: {len(cases) - progress.count} configs not run")
                break
            started = time.monotonic()
            inputs = Inputs(case, device, seed)
            flops = attention_flops(
                case.batch, case.seqlen, case.seqlen, case.heads, case.headdim, case.causal, mode
            )
            measured, alive = _time_case(
                case, make_providers(case), inputs, mode=mode, warmup=warmup, rep=rep,
                rounds=rounds, repeats=repeats, timer=timer, device=device, skips=skips,
                note=progress.note, idle_s=idle_s, settle_ms=settle_ms,
            )  # fmt: skip
            done = [
                {
                    **meta,
                    "mode": mode,
                    **_case_fields(case),
                    "provider": provider.name,
                    "deterministic": provider.deterministic,
                    "schedule": m.schedule,
                    "ms": m.ms,
                    "tflops": tflops(flops, m.ms),
                    "bitwise_repeatable": m.bitwise_repeatable,
                    "kernel": m.kernel,
                    "ms_rounds": " ".join(f"{t:.4f}" for t in m.ms_rounds),
                }
                for provider, m in measured
            ]
            if not alive:
                progress.note("the CUDA context is broken: stopping the sweep")
                return rows
            del inputs
            cleanup(device)
            rows.extend(done)
            progress.done(_config_line(case, done, time.monotonic() - started))
            if on_config is not None:
                on_config(rows)
    finally:
        progress.close()
    return rows


def run_determinism(
    cases: Sequence[Case],
    make_providers: ProviderFactory,
    *,
    meta: dict[str, Any],
    repeats: int,
    seed: int,
    device: Any,
    deadline: Deadline,
    skips: Skips,
) -> list[dict[str, Any]]:
    """The paper's Table 1: max |delta| of dq, dk, dv over ``repeats`` backward calls."""
    rows: list[dict[str, Any]] = []
    for case in cases:
        if not deadline.allows("report"):
            print("deadline reached: determinism table cut short")
            break
        inputs = Inputs(case, device, seed)
        for provider in make_providers(case):
            try:
                with provider.context():
                    fn = provider.make(case, device)
                    q, k, v, dout = inputs.get(provider.layout)
                    leaves = [x.detach().requires_grad_() for x in (q, k, v)]
                    diffs, equal = repeat_diffs(fn, leaves, dout, repeats)
                    schedule = launched_schedule(provider, "bwd")
            except Exception as exc:  # noqa: BLE001
                skips.add("determinism", provider.name, case.label, short_reason(exc), print)
                cleanup(device)
                if not isinstance(exc, ProviderUnavailable) and not gpu_alive(device):
                    print("the CUDA context is broken: stopping the determinism table")
                    return rows
                continue
            rows.append(
                {
                    **meta,
                    **_case_fields(case),
                    "provider": provider.name,
                    "deterministic": provider.deterministic,
                    "schedule": schedule,
                    "repeats": repeats,
                    "max_diff_dq": diffs[0],
                    "max_diff_dk": diffs[1],
                    "max_diff_dv": diffs[2],
                    "bitwise_repeatable": equal,
                }
            )
        del inputs
        cleanup(device)
        print(f"  determinism {case.label}: {len(rows)} rows so far", flush=True)
    return rows
