"""Tuning probe: a per-step timeline of the real backward, next to the DAG model's.

Builds a tracing variant of the backward kernel (source edits, like probe_protocol.py) that
stores, for every step, %globaltimer at the step's start (t0), before the wait for its turn (t1),
after it (t2) and after its dQ add (t3), plus the program id and SM. Then, per config and
schedule: how the time splits into compute / wait / add / gaps, where the waits happen (first
steps of a chain or steady state, which wave), and a Gantt chart of the measured timeline beside
the simulated one with c and r taken from the trace. A developer tool for one device call; on a
CPU machine it runs under TRITON_INTERPRET=1 with a logical clock (to check that it works).

    PYTHONPATH=$PWD python3 benchmarks/probe_trace.py --out-dir $OUT [--configs 128:f:4096]
    TRITON_INTERPRET=1 PYTHONPATH=$PWD python3 benchmarks/probe_trace.py --smoke --out-dir /tmp/t

t1 is read before the dQ add's matmul result is waited for, so "wait" is pure spinning and the
matmul tail is counted in "add".
"""

from __future__ import annotations

import argparse
import os
import pathlib
import tempfile

import numpy as np
import torch

# probe_protocol sits beside this file (python3 benchmarks/probe_trace.py puts it on sys.path).
from probe_common import probe_configs  # noqa: E402
from probe_protocol import KERNEL_SOURCE, load_variant_source  # noqa: E402

import dash_attn.runtime as runtime
from dash_attn import dash_attn_func
from dash_attn.schedule import SimResult, make_schedule, simulate
from dash_attn.schedule.plot import plot_gantt
from dash_attn.tiles import kernel_schedule_spec

FIELDS = 6  # t0, t1, t2, t3, program id, SM id

TRACE_HELPERS = """

TRACE_BUFFER = [None]


@triton.jit
def _trace_clock(step, phase, TIMED_WAIT: tl.constexpr):
    if TIMED_WAIT:
        return tl.inline_asm_elementwise(
            "mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1
        )
    else:
        return tl.full([], step, dtype=tl.int64) * 4 + phase


@triton.jit
def _trace_smid(TIMED_WAIT: tl.constexpr):
    if TIMED_WAIT:
        return tl.inline_asm_elementwise(
            "mov.u32 $0, %smid;", "=r", [], dtype=tl.int32, is_pure=False, pack=1
        ).to(tl.int64)
    else:
        return tl.program_id(0).to(tl.int64)
"""

# The non-deterministic branch's dQ add, the last statement of a step.
ELSE_ADD = (
    "            else:\n"
    "                _add_dq(\n"
    "                    DQ_DESC, dq_ptrs, dq_part, qo_mask, b, h, q_tile, BLOCK_M, HEAD_DIM_PAD, "
    "DQ_TMA\n"
    "                )\n"
)

EDITS = [
    ("    SEM, STATUS,\n    CHAIN_START,", "    SEM, STATUS, TRACE,\n    CHAIN_START,"),
    (
        "        for step in range(step_lo, step_hi):\n",
        "        for step in range(step_lo, step_hi):\n"
        "            trace_t0 = _trace_clock(step, 0, TIMED_WAIT)\n",
    ),
    (
        "            if DETERMINISTIC:\n"
        "                failed = _wait_for_turn(sem_ptr, seen, rank, timeout, TIMED_WAIT)\n",
        "            trace_t1 = _trace_clock(step, 1, TIMED_WAIT)\n"
        "            trace_t2 = trace_t1\n"
        "            if DETERMINISTIC:\n"
        "                failed = _wait_for_turn(sem_ptr, seen, rank, timeout, TIMED_WAIT)\n"
        "                trace_t2 = _trace_clock(step, 2, TIMED_WAIT)\n",
    ),
    (
        ELSE_ADD,
        ELSE_ADD + "            trace_t3 = _trace_clock(step, 3, TIMED_WAIT)\n"
        f"            trace_at = TRACE + step * {FIELDS}\n"
        "            tl.store(trace_at, trace_t0)\n"
        "            tl.store(trace_at + 1, trace_t1)\n"
        "            tl.store(trace_at + 2, trace_t2)\n"
        "            tl.store(trace_at + 3, trace_t3)\n"
        "            tl.store(trace_at + 4, pid.to(tl.int64))\n"
        "            tl.store(trace_at + 5, _trace_smid(TIMED_WAIT))\n",
    ),
    (
        "        sem, status,\n        tables[",
        "        sem, status, TRACE_BUFFER[0],\n        tables[",
    ),
]


def traced_backward(q, k, v, dout, causal: bool, deterministic: bool, schedule: str, module):
    """One backward through the tracing kernel; returns the ``[S, 6]`` int64 trace."""
    batch, seqlen, heads, headdim = q.shape
    spec = kernel_schedule_spec(
        batch, seqlen, k.shape[1], heads, k.shape[2], headdim, causal, runtime.sm_count(q.device)
    )
    sched = make_schedule(schedule, spec)
    trace = torch.full((sched.num_steps, FIELDS), -1, dtype=torch.int64, device=q.device)
    module.TRACE_BUFFER[0] = trace
    shipped = runtime.attn_bwd_main
    runtime.attn_bwd_main = module.attn_bwd_main
    try:
        q, k, v = (x.detach().clone().requires_grad_() for x in (q, k, v))
        out = dash_attn_func(q, k, v, causal=causal, deterministic=deterministic, schedule=schedule)
        out.backward(dout)
        if q.is_cuda:
            torch.cuda.synchronize()
    finally:
        runtime.attn_bwd_main = shipped
    return sched, trace.cpu().numpy()


def summarize(label: str, sched, trace: np.ndarray) -> tuple[str, SimResult]:
    if (trace < 0).any():
        raise RuntimeError(f"{label}: {(trace[:, 0] < 0).sum()} steps left no trace")
    t0, t1, t2, t3, pid, _ = (trace[:, i] for i in range(FIELDS))
    origin = t0.min()
    us = 1e-3 if os.environ.get("TRITON_INTERPRET", "0") in ("", "0") else 1.0  # ns -> us
    t0, t1, t2, t3 = ((t - origin) * us for t in (t0, t1, t2, t3))
    compute, wait, add = t1 - t0, t2 - t1, t3 - t2
    span = float(t3.max())
    workers = int(pid.max()) + 1
    # Gap: time between a step's end and the same program's next step start (chain switches).
    order = np.lexsort((t0, pid))
    same = pid[order][1:] == pid[order][:-1]
    gaps = (t0[order][1:] - t3[order][:-1])[same]
    within = np.arange(len(t0)) - sched.chain_start[sched.step_chain()]
    first = within < 2
    busy = workers * span
    lines = [
        f"{label}: {len(t0)} steps on {workers} programs, span {span:.1f} us",
        f"  share of program time: compute {compute.sum() / busy:6.1%}"
        f"  wait {wait.sum() / busy:6.1%}  add {add.sum() / busy:6.1%}"
        f"  gaps {gaps.sum() / busy:6.1%}",
        f"  per step (median / p90 us): compute {np.median(compute):.2f} / "
        f"{np.percentile(compute, 90):.2f}  wait {np.median(wait):.2f} / "
        f"{np.percentile(wait, 90):.2f}  add {np.median(add):.2f} / {np.percentile(add, 90):.2f}",
        f"  steps that waited > 0.5 us: {np.mean(wait > 0.5):.1%}; of the wait time, "
        f"{wait[first].sum() / max(wait.sum(), 1e-9):.1%} in a chain's first two steps",
    ]
    # Which part of the run waits: split the span into 8 equal windows.
    window = np.minimum((t1 / max(span, 1e-9) * 8).astype(int), 7)
    per_window = np.bincount(window, weights=wait, minlength=8) / max(wait.sum(), 1e-9)
    lines.append("  wait by eighth of the run: " + " ".join(f"{x:.0%}" for x in per_window))
    measured = SimResult(
        makespan=span,
        critical_path=span,
        critical_steps=np.zeros(0, dtype=np.int64),
        lower_bound=float((compute + add).sum() / workers),
        bubble_fraction=1.0 - float((compute + add).sum()) / busy,
        worker=pid.astype(np.int64),
        compute_start=t0,
        compute_end=t1,
        reduce_start=t2,
        reduce_end=t3,
    )
    return "\n".join(lines), measured


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--configs", default="128:f:4096,128:c:4096")
    parser.add_argument("--out-dir", type=pathlib.Path, required=True)
    parser.add_argument("--smoke", action="store_true", help="tiny shapes (interpreter check)")
    args = parser.parse_args()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    interpret = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
    device = "cpu" if interpret else "cuda"
    dtype = torch.float16 if interpret else torch.bfloat16
    report = []
    with tempfile.TemporaryDirectory(dir=KERNEL_SOURCE.parent) as tmp:
        module = load_variant_source("trace", EDITS, pathlib.Path(tmp), extra_source=TRACE_HELPERS)
        for config in probe_configs(args.configs):
            item, causal = config.label, config.causal
            q, k, v, dout = config.inputs(device, dtype, small=args.smoke)
            batch, seqlen, heads, headdim = q.shape
            spec = kernel_schedule_spec(
                batch, seqlen, seqlen, heads, heads, headdim, causal, runtime.sm_count(q.device)
            )
            names = ["descending"] if interpret else ["auto", "fa3"]
            panels = []
            for name in names:
                for deterministic in (True, False):
                    if not interpret:  # compile and warm up outside the traced call
                        traced_backward(q, k, v, dout, causal, deterministic, name, module)
                    sched, trace = traced_backward(
                        q, k, v, dout, causal, deterministic, name, module
                    )
                    label = f"{item} {sched.name} {'det' if deterministic else 'nondet'}"
                    text, measured = summarize(label, sched, trace)
                    print(text, flush=True)
                    report.append(text)
                    if deterministic:
                        c = float(np.median(measured.compute_end - measured.compute_start))
                        r = float(np.median(measured.reduce_end - measured.reduce_start))
                        model = simulate(sched, c, r)
                        report.append(
                            f"  model with c={c:.2f}, r={r:.2f}: span {model.makespan:.1f}, "
                            f"wait share {model.wait_time / (spec.workers * model.makespan):.1%}"
                        )
                        print(report[-1], flush=True)
                        panels += [(sched, model), (sched, measured)]
            if panels:
                path = args.out_dir / f"trace_{item.replace(':', '_')}.png"
                plot_gantt(
                    panels, path, title=f"{item}: model (c, r from the trace) vs measured",
                    max_workers=24,
                )  # fmt: skip
                print(f"wrote {path}")
    (args.out_dir / "trace_summary.txt").write_text("\n".join(report) + "\n")


if __name__ == "__main__":
    main()
