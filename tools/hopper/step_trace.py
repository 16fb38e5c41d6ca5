"""Where the MMA warpgroups' step waits, per warpgroup: the hopper backward compiled with
``HopperAttnBwd(step_trace=N)`` (each MMA warp writes its SM clock at the places of a step that
``bwd_step.TRACE_POINTS`` names, for each CTA's first N steps) runs once in place of the
shipped kernel, and the stamps are summarised.

    python tools/hopper/step_trace.py --headdim 64 4096:full [--modes det,nondet] [--suffix _xt48]

Each config is ``seqlen:mask[:kv_heads]`` at the sweep's sizes, as ``variant_ab``'s (hidden
2048, 16k tokens), bf16.
Per config and mode: for each interval between consecutive points (and from a step's end to
the next step's top), the mean and median cycles of each warpgroup over the traced steps (a
warpgroup reaches a point when the last of its four warps does), its share of the step, and at
the dS barrier which warpgroup arrives last and by how many cycles. (The stamps past the dS
and dQ-buffer barriers are taken without waiting for them, ``bwd_step.TRACE_POINTS``' comment:
the waits there are counted in the next interval, "ds_pass -> dq_wait" and "dq_pass -> end".)
Needs an sm_90 GPU and the CuTe-DSL kit; the kernels are the shipped ones with the stamps
added (their other code is the same, so the times are theirs within the stamps' cost).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from dash_attn.backends.hopper.bwd_step import TRACE_POINTS  # noqa: E402
from tools.hopper.variant_ab import Config, parse_config  # noqa: E402

SUFFIX = "_tr"
WARPS = 4  # per warpgroup


def clock_delta(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``b - a`` of 32-bit clock readings (as int64), taken modulo 2**32 into [-2**31, 2**31):
    the clock wraps every ~2 s."""
    return (b - a + 2**31) % 2**32 - 2**31


def words_needed(ctas: int, steps: int) -> int:
    """Int32 words of the trace buffer (the kernel's layout, ``StepMixin._trace``)."""
    return ctas * 2 * steps * len(TRACE_POINTS) * WARPS


def warpgroup_points(words: np.ndarray, ctas: int, steps: int) -> np.ndarray:
    """[cta, warpgroup, step, point] clock of the warpgroup's last warp at each point (the
    warps' 32-bit clocks unwrapped against the warpgroup's first warp's)."""
    stamps = words.astype(np.int64).reshape(ctas, 2, steps, len(TRACE_POINTS), WARPS)
    base = stamps[..., :1]
    return base[..., 0] + clock_delta(base, stamps).max(axis=-1)


def stamped_points(words: np.ndarray, ctas: int, steps: int) -> list[str]:
    """The ``TRACE_POINTS`` the kernel stamped (``bwd_step.FINE_POINTS`` only at hd 64): those
    with a nonzero word."""
    stamps = words.reshape(ctas, 2, steps, len(TRACE_POINTS), WARPS)
    return [name for i, name in enumerate(TRACE_POINTS) if stamps[..., i, :].any()]


def intervals(stamped: list[str]) -> list[tuple[str, str]]:
    """Consecutive pairs of the stamped points, then the last one to the next step's top."""
    pairs = list(zip(stamped[:-1], stamped[1:], strict=True))
    return [*pairs, (stamped[-1], "next " + stamped[0])]


def summarise(points: np.ndarray, steps_run: np.ndarray, stamped: list[str] | None = None) -> str:
    """The intervals' table and the dS barrier's arrival order, over every CTA's traced steps
    but its last (whose slot the kernel reuses for later steps): ``steps_run`` [cta] counts
    the steps each CTA ran (its stamps hold min(steps_run, N) steps). ``stamped``: the points
    the kernel stamped (``stamped_points``; all by default)."""
    ctas, _, steps, _ = points.shape
    kept = np.minimum(steps_run, steps) - 1  # the last traced step is overwritten by later ones
    mask = np.arange(steps)[None, :] < kept[:, None]  # [cta, step]
    diff = clock_delta
    index = {name: i for i, name in enumerate(TRACE_POINTS)}
    step_total = [None, None]
    rows = []
    for wg in (0, 1):
        p = points[:, wg]
        whole = diff(p[:, :-1, index["top"]], p[:, 1:, index["top"]])
        step_total[wg] = whole[mask[:, 1:] & mask[:, :-1]]
    for start, end in intervals(list(TRACE_POINTS) if stamped is None else stamped):
        cells = []
        for wg in (0, 1):
            p = points[:, wg]
            if end.startswith("next "):
                values = diff(p[:, :-1, index[start]], p[:, 1:, index[TRACE_POINTS[0]]])
                values = values[mask[:, 1:] & mask[:, :-1]]
            else:
                values = diff(p[..., index[start]], p[..., index[end]])[mask]
            share = 100 * values.mean() / max(step_total[wg].mean(), 1)
            cells.append(f"{values.mean():.0f} / {np.median(values):.0f} ({share:.0f}%)")
        rows.append(f"| {start} -> {end} | {cells[0]} | {cells[1]} |")
    lines = [
        "| interval | wg0 mean / median cycles (share) | wg1 |",
        "| :-- | --: | --: |",
        *rows,
        f"| step (top -> next top) | {step_total[0].mean():.0f} / {np.median(step_total[0]):.0f}"
        f" | {step_total[1].mean():.0f} / {np.median(step_total[1]):.0f} |",
    ]
    arrive = index["ds_arrive"]
    lag = diff(points[:, 0, :, arrive], points[:, 1, :, arrive])[mask]  # > 0: wg1 later
    lines.append(
        f"\nAt the dS barrier wg1 arrives last in {100 * (lag > 0).mean():.0f}% of steps; "
        f"the later warpgroup arrives {np.abs(lag).mean():.0f} cycles after the other "
        f"(median {np.median(np.abs(lag)):.0f}, 90th percentile "
        f"{np.percentile(np.abs(lag), 90):.0f}); {int(mask.sum())} steps of {ctas} CTAs."
    )
    return "\n".join(lines)


@contextlib.contextmanager
def traced_kernels(steps: int, trace, suffix: str = "") -> Iterator[None]:
    """Within it the hopper backward runs ``<shipped variant><suffix>_tr`` (``step_trace=
    steps``; ``suffix`` names a variant of the shipped kernel, as ``variant_ab``'s) and passes
    ``trace`` (fp32, ``words_needed`` long) as the kernel's dK/dV-sum buffer."""
    from dash_attn.backends.hopper import bwd_launch
    from dash_attn.backends.hopper import launch as hopper_launch
    from tools.hopper.bwd_probe import kernel_variant

    added = [name for name in bwd_launch.VARIANTS if not name.endswith(SUFFIX)]
    for name in added:
        bwd_launch.VARIANTS[name + SUFFIX] = {**bwd_launch.VARIANTS[name], "step_trace": steps}
    shipped_launch = bwd_launch.BwdLaunch.launch

    def launch(self, *args, **kwargs):
        return shipped_launch(self, *args, dkv_scratch=trace, **kwargs)

    bwd_launch.BwdLaunch.launch = launch
    hopper_launch._launches.clear()
    try:
        with kernel_variant(lambda name: name + suffix + SUFFIX):
            yield
    finally:
        bwd_launch.BwdLaunch.launch = shipped_launch
        hopper_launch._launches.clear()
        for name in added:
            bwd_launch.VARIANTS.pop(name + SUFFIX, None)


def run(cfg: Config, head_dim: int, det: bool, steps: int, suffix: str = "") -> str:
    import torch

    from dash_attn import dash_attn_func, last_launch_info
    from tools.hopper.variant_ab import config_inputs

    q, k, v, dout, _ = config_inputs(cfg, head_dim, rule_max=0)
    ctas = torch.cuda.get_device_properties(0).multi_processor_count
    trace = torch.zeros(words_needed(ctas, steps), device="cuda", dtype=torch.int32)
    with traced_kernels(steps, trace.view(torch.float32), suffix):
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        for _ in range(2):  # the first call compiles and warms up; the second is kept
            out = dash_attn_func(*leaves, causal=cfg.causal, deterministic=det, backend="hopper")
            torch.autograd.grad(out, leaves, dout)
        torch.cuda.synchronize()
        info = last_launch_info()
    words = trace.cpu().numpy()
    points = warpgroup_points(words, ctas, steps)
    # Steps each CTA ran: those whose top stamp of warp 0 is set (a CTA's later steps overwrite
    # its last slot, so a CTA that ran more than N steps counts N).
    tops = words.reshape(ctas, 2, steps, len(TRACE_POINTS), WARPS)[:, 0, :, 0, 0]
    steps_run = (tops != 0).sum(axis=1)
    active = steps_run > 1
    variant = f" (variant <shipped>{suffix})" if suffix else ""
    head = f"## d{head_dim} {cfg.label} {'det' if det else 'non-det'}{variant}: {info}\n"
    return head + summarise(points[active], steps_run[active], stamped_points(words, ctas, steps))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("configs", nargs="+", help="seqlen:full|causal[:kv_heads]")
    parser.add_argument("--headdim", type=int, default=128)
    parser.add_argument("--modes", default="det,nondet", help="det, nondet or both")
    parser.add_argument("--steps", type=int, default=1024, help="steps traced per CTA")
    parser.add_argument(
        "--suffix", default="", help="trace the variant <shipped variant><suffix> instead"
    )
    args = parser.parse_args(argv)
    modes = args.modes.split(",")
    if not modes or any(m not in ("det", "nondet") for m in modes):
        parser.error(f"--modes {args.modes!r}: want det, nondet or det,nondet")
    if args.steps < 2:
        parser.error("--steps must be at least 2")
    try:
        configs = [parse_config(text, args.headdim) for text in args.configs]
    except ValueError as err:
        parser.error(str(err))
    if args.suffix:
        from dash_attn.backends.hopper import bwd_launch, bwd_variant

        for cfg in configs:
            for mode in modes:
                shipped = bwd_variant(args.headdim, cfg.causal, cfg.seqlen, mode == "det")
                if shipped + args.suffix not in bwd_launch.VARIANTS:
                    parser.error(f"--suffix {args.suffix!r}: no variant {shipped + args.suffix!r}")
    for cfg in configs:
        for mode in modes:
            print(run(cfg, args.headdim, mode == "det", args.steps, args.suffix), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
