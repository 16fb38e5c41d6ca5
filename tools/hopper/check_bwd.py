"""GPU check of the Hopper CuTe-DSL backward (dash_attn/backends/hopper): numerics, bitwise
reproducibility per schedule, non-deterministic mode, forced timeouts, and timing.

Run on an H100/H200 from the repository root::

    PYTHONPATH=$PWD python3 tools/hopper/check_bwd.py --out OUT_DIR

``--variants t128_fq,t128_fq2`` instead compares kernel variants (bwd_launch.VARIANTS) side by
side: numerics and 3 bitwise repeats for every schedule on a few shapes (det and non-det), a
forced timeout, then timing on the 8 benchmark shapes (det and non-det, and FA4 if importable),
within a global time budget; it ends with a variant x shape table.

``--dry-run`` needs no GPU: it builds every case's schedule tables, compiles the kernels for
sm_90a from CPU tensors and runs the CPU reference on a small shape. Every case is wrapped so a
failure is recorded and the rest still run; the end prints a compact table and writes
``check_bwd.json`` and ``check_bwd.csv`` under ``--out``.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import math
import os
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from dash_attn.backends.hopper import bwd_launch, bwd_variant
from dash_attn.backends.triton.bwd import attn_bwd_preprocess
from dash_attn.schedule import (
    TABLE_FIELDS,
    Dispatch,
    Mask,
    Schedule,
    ScheduleSpec,
    applicable_schedules,
    make_schedule,
)

TIMEOUT_NS = 10 * 10**9
TIME_BUDGET_S = 330.0  # the whole script must stay under 6 minutes


@dataclasses.dataclass(frozen=True)
class Shape:
    batch: int
    seqlen_q: int
    seqlen_k: int
    heads: int
    kv_heads: int
    head_dim: int

    @property
    def label(self) -> str:
        kv = f"/{self.kv_heads}" if self.kv_heads != self.heads else ""
        return (
            f"b{self.batch} sq{self.seqlen_q} sk{self.seqlen_k} h{self.heads}{kv} d{self.head_dim}"
        )


# Not tile multiples; GQA; seqlen_q != seqlen_k both ways.
NUMERIC_SHAPES = [
    Shape(2, 1000, 1000, 4, 4, 128),
    Shape(2, 333, 333, 4, 4, 64),
    Shape(1, 700, 700, 8, 2, 128),
    Shape(2, 300, 1000, 4, 4, 64),
    Shape(2, 1000, 300, 4, 2, 128),
]
# --variants: small shapes, every one not a tile multiple, hd 64 (where tiles differ) first.
VARIANT_NUMERIC_SHAPES = [
    Shape(1, 700, 700, 8, 2, 64),
    Shape(2, 300, 1000, 4, 4, 64),
    Shape(2, 1000, 300, 4, 2, 128),
    Shape(1, 700, 700, 8, 2, 128),
    Shape(2, 333, 1000, 4, 4, 128),
]
VARIANTS_BUDGET_S = 270.0  # --variants: everything, compiles included, under 5 minutes
TIMING_SHAPES = [  # 16k tokens each; most informative first (late ones may be skipped)
    Shape(2, 8192, 8192, 16, 16, 128),
    Shape(8, 2048, 2048, 16, 16, 128),
    Shape(8, 2048, 2048, 16, 16, 64),
    Shape(2, 8192, 8192, 16, 16, 64),
]


# ----------------------------------------------------------------------------- GPU watchdog

_LOG: Log | None = None  # set in main(); flushed if the GPU hangs


def wait_gpu(timeout_s: float = 60.0, what: str = "kernel") -> None:
    """torch.cuda.synchronize() with a deadline: a hang inside a CTA (an mbarrier that never
    completes has no timeout) writes the log so far and exits instead of burning GPU time."""
    event = torch.cuda.Event()
    event.record()
    start = time.monotonic()
    while not event.query():
        if time.monotonic() - start > timeout_s:
            print(f"HANG: {what} did not finish within {timeout_s} s; exiting", flush=True)
            if _LOG is not None:
                _LOG.rows.append({"kind": "hang", "case": what, "ok": False})
                _LOG.write()
                print(_LOG.summary(), flush=True)
            os._exit(3)
        time.sleep(0.001)


# ----------------------------------------------------------------------------- problem setup


def make_inputs(shape: Shape, dtype: torch.dtype, device: str, seed: int = 0) -> dict:
    gen = torch.Generator(device=device).manual_seed(seed)

    def rand(*size: int) -> torch.Tensor:
        return torch.randn(*size, generator=gen, device=device, dtype=torch.float32).to(dtype)

    s = shape
    return {
        "q": rand(s.batch, s.seqlen_q, s.heads, s.head_dim),
        "k": rand(s.batch, s.seqlen_k, s.kv_heads, s.head_dim),
        "v": rand(s.batch, s.seqlen_k, s.kv_heads, s.head_dim),
        "dout": rand(s.batch, s.seqlen_q, s.heads, s.head_dim),
    }


def attention_ref(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention in the inputs' dtype (upcast them for fp32), returning (out, lse natural log,
    (batch, heads, seqlen_q)). Rows that see no key give out = 0, lse = -inf."""
    group = q.shape[2] // k.shape[2]
    qt = q.transpose(1, 2)
    kt = k.transpose(1, 2).repeat_interleave(group, dim=1)
    vt = v.transpose(1, 2).repeat_interleave(group, dim=1)
    scores = (qt @ kt.transpose(-1, -2)).float() * scale
    if causal:
        sq, sk = q.shape[1], k.shape[1]
        rows = torch.arange(sq, device=q.device)[:, None]
        cols = torch.arange(sk, device=q.device)[None, :]
        scores = scores.masked_fill(cols > rows + (sk - sq), float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    safe = torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)
    p = torch.exp(scores - safe[..., None]).to(q.dtype)
    out = (p @ vt).transpose(1, 2).contiguous()
    return out, lse


def reference_grads(inputs: dict, causal: bool, scale: float, dtype: torch.dtype) -> tuple:
    """(dq, dk, dv) by autograd through attention_ref computed in ``dtype``."""
    q, k, v = (inputs[n].detach().to(dtype).requires_grad_() for n in ("q", "k", "v"))
    out, _ = attention_ref(q, k, v, causal, scale)
    grads = torch.autograd.grad(out, (q, k, v), inputs["dout"].to(dtype))
    return tuple(g.float() for g in grads)


def schedule_for(
    shape: Shape, causal: bool, name: str, workers: int, variant: str | None = None
) -> Schedule:
    """The schedule ``name`` built with the tiles that ``variant`` (default: the shipped one)
    runs at this head dim."""
    variant = variant or bwd_variant(shape.head_dim, causal)
    block_m, block_n = bwd_launch.variant_tiles(variant, shape.head_dim)
    spec = ScheduleSpec.from_shape(
        batch=shape.batch, seqlen_q=shape.seqlen_q, seqlen_k=shape.seqlen_k,
        q_heads=shape.heads, kv_heads=shape.kv_heads, block_m=block_m, block_n=block_n,
        mask=Mask(causal=causal), workers=workers,
    )  # fmt: skip
    return make_schedule(name, spec)


def grid_of(sched: Schedule) -> int:
    """Worker count to launch, as dash_attn.plan does."""
    spec = sched.spec
    if sched.dispatch is Dispatch.DYNAMIC:
        return min(spec.workers, spec.num_chains)
    return int((sched.worker_start[1:] > sched.worker_start[:-1]).sum())


def device_tables(sched: Schedule, device: str) -> dict[str, torch.Tensor]:
    return {name: torch.from_numpy(getattr(sched, name).copy()).to(device) for name in TABLE_FIELDS}


class Problem:
    """Inputs, forward (plain torch, fp32 softmax) and preprocess for one (shape, causal)."""

    def __init__(self, shape: Shape, causal: bool, dtype: torch.dtype, device: str) -> None:
        self.shape, self.causal, self.dtype, self.device = shape, causal, dtype, device
        self.timing = False  # inside timing loops the watchdog waits once per loop
        # Tables uploaded once per schedule: a pageable host-to-device copy per call would
        # wait for the previous kernel and put host time into the timings.
        self._tables: dict[int, tuple[Schedule, dict[str, torch.Tensor]]] = {}
        self.scale = 1.0 / math.sqrt(shape.head_dim)
        self.inputs = make_inputs(shape, dtype, device)
        with torch.no_grad():
            out, lse = attention_ref(
                *(self.inputs[n].float() for n in ("q", "k", "v")), causal, self.scale
            )
        self.out = out.to(dtype)
        self.lse = lse.contiguous()
        # Rows padded to a multiple of 640 = lcm(64, 80, 128): enough for every variant's
        # block_m (q_tiles * block_m rows).
        self.rows_pad = -(-shape.seqlen_q // 640) * 640
        self.lse2, self.delta = attn_bwd_preprocess(
            self.out, self.inputs["dout"], self.lse, self.rows_pad
        )

    def tables(self, sched: Schedule) -> dict[str, torch.Tensor]:
        if id(sched) not in self._tables:
            self._tables[id(sched)] = (sched, device_tables(sched, self.device))
        return self._tables[id(sched)][1]

    def run(
        self,
        sched: Schedule,
        deterministic: bool,
        timeout_ns: int = TIMEOUT_NS,
        preprocess: bool = False,
        variant: str | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """One backward: (dq in dtype, dk, dv, status). ``preprocess`` re-runs the Triton
        preprocess (timing of the whole backward). ``sched`` must be built for ``variant``'s
        tiles (schedule_for(..., variant=variant))."""
        spec = sched.spec
        variant = variant or bwd_variant(
            self.shape.head_dim, self.causal, self.shape.seqlen_k, deterministic
        )
        block_m, block_n = bwd_launch.variant_tiles(variant, self.shape.head_dim)
        if preprocess:
            self.lse2, self.delta = attn_bwd_preprocess(
                self.out, self.inputs["dout"], self.lse, self.rows_pad
            )
        dq_acc, dk, dv, status = bwd_launch.hopper_bwd_main(
            self.inputs["q"], self.inputs["k"], self.inputs["v"], self.inputs["dout"],
            self.lse2, self.delta, self.tables(sched),
            block_m=block_m, block_n=block_n, num_workers=grid_of(sched),
            q_tiles=spec.q_tiles, kv_tiles=spec.kv_tiles, num_chains=spec.num_chains,
            causal=self.causal, softmax_scale=self.scale, deterministic=deterministic,
            dynamic=sched.dispatch is Dispatch.DYNAMIC, timeout_ns=timeout_ns, variant=variant,
        )  # fmt: skip
        if not self.timing:
            wait_gpu(60.0, f"{self.shape.label} {sched.name} det={deterministic}")
        dq = bwd_launch.cast_dq(
            dq_acc, self.scale, self.dtype, seqlen_q=self.shape.seqlen_q, block_m=block_m
        )
        return dq, dk, dv, status


def max_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.float() - b.float()).abs().max().item()


def check_numerics(prob: Problem, got: tuple, refs: dict) -> dict:
    """flash-attn rule: error <= 2x the error of the same computation in the low precision
    dtype by PyTorch, plus the rounding error of the dtype at the gradient's magnitude."""
    row: dict[str, Any] = {}
    ok = True
    for name, g, r32, rlo in zip(
        ("dq", "dk", "dv"), got[:3], refs["fp32"], refs["low"], strict=True
    ):
        err = max_err(g, r32)
        base = max_err(rlo, r32)
        rounded = r32.to(prob.dtype)
        atol = 2 * (rounded + 0.3 - 0.3 - rounded).float().abs().max().item() + 1e-5
        row[f"{name}_err"] = err
        row[f"{name}_pt_err"] = base
        finite = bool(torch.isfinite(g).all())
        ok = ok and finite and err <= 2 * base + atol
    row["status"] = int(got[3][1].item())
    ok = ok and row["status"] == 0
    row["ok"] = ok
    return row


# ----------------------------------------------------------------------------- the checks


class Log:
    def __init__(self, out_dir: Path, deadline: float) -> None:
        self.out_dir, self.deadline, self.rows = out_dir, deadline, []

    def case(self, kind: str, label: str, fn: Callable[[], dict]) -> None:
        if time.monotonic() > self.deadline:
            self.rows.append({"kind": kind, "case": label, "ok": None, "note": "skipped (time)"})
            return
        start = time.monotonic()
        try:
            row = fn()
        except Exception as exc:  # one failure must not hide the others
            row = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
            traceback.print_exc()
        row = {"kind": kind, "case": label, **row, "secs": round(time.monotonic() - start, 2)}
        self.rows.append(row)
        print(json.dumps(row, default=str), flush=True)
        self.write()  # incremental: a later hang or kill keeps what ran

    def write(self) -> None:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        (self.out_dir / "check_bwd.json").write_text(json.dumps(self.rows, indent=1, default=str))
        keys = sorted({k for row in self.rows for k in row})
        with open(self.out_dir / "check_bwd.csv", "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=keys)
            writer.writeheader()
            writer.writerows(self.rows)

    def summary(self) -> str:
        lines = [f"{'kind':<10} {'case':<58} {'ok':<5} detail"]
        for row in self.rows:
            detail = row.get("error") or row.get("note") or ""
            if "tflops" in row:
                detail = f"{row['tflops']:.1f} TFLOPS ({row['ms']:.3f} ms)"
            elif "dq_err" in row:
                detail = (
                    f"dq {row['dq_err']:.2e}/{row['dq_pt_err']:.2e} dk {row['dk_err']:.2e}/"
                    f"{row['dk_pt_err']:.2e} dv {row['dv_err']:.2e}/{row['dv_pt_err']:.2e}"
                )
            elif "repeats" in row:
                detail = f"{row['repeats']} repeats bitwise equal: {row['ok']}"
            lines.append(f"{row['kind']:<10} {row['case']:<58} {row['ok']!s:<5} {detail}")
        return "\n".join(lines)


def numerics_and_repeats(log: Log, workers: int, dtype: torch.dtype, repeats: int) -> None:
    for shape in NUMERIC_SHAPES:
        for causal in (False, True):
            tag = f"{shape.label} {'causal' if causal else 'full'}"
            try:
                prob = Problem(shape, causal, dtype, "cuda")
                refs = {
                    "fp32": reference_grads(prob.inputs, causal, prob.scale, torch.float32),
                    "low": reference_grads(prob.inputs, causal, prob.scale, dtype),
                }
            except Exception as exc:
                log.rows.append({"kind": "setup", "case": tag, "ok": False, "error": repr(exc)})
                traceback.print_exc()
                continue
            for name in applicable_schedules(schedule_for(shape, causal, "fa3", workers).spec):
                sched = schedule_for(shape, causal, name, workers)

                def det_case(sched: Schedule = sched, prob: Problem = prob, refs: dict = refs):
                    first = prob.run(sched, True)
                    wait_gpu(60.0, "check")
                    row = check_numerics(prob, first, refs)
                    same = True
                    for _ in range(repeats - 1):
                        again = prob.run(sched, True)
                        same = same and all(
                            torch.equal(a, b) for a, b in zip(first[:3], again[:3], strict=True)
                        )
                    row["repeats"] = repeats
                    row["bitwise"] = same
                    row["ok"] = row["ok"] and same
                    return row

                log.case("det", f"{tag} {name}", det_case)

            sched = schedule_for(shape, causal, "fa3", workers)
            log.case(
                "nondet",
                f"{tag} fa3",
                lambda s=sched, p=prob, r=refs: check_numerics(p, p.run(s, False), r),
            )


def forced_timeout(log: Log, workers: int, dtype: torch.dtype) -> None:
    """A rank that never arrives must raise status[1] and poison dQ with NaN, not hang."""
    shape = Shape(1, 512, 512, 2, 2, 128)

    def case(name: str) -> dict:
        prob = Problem(shape, False, dtype, "cuda")
        sched = schedule_for(shape, False, name, workers)
        rank = sched.step_rank.copy()
        rank[0] += 1000  # the first step of chain 0 waits for a turn that never comes
        broken = dataclasses.replace(sched, step_rank=rank)
        start = time.monotonic()
        dq, dk, dv, status = prob.run(broken, True, timeout_ns=50_000_000)
        wait_gpu(60.0, "check")
        secs = time.monotonic() - start
        flag = int(status[1].item())
        nan = bool(torch.isnan(dq).any())
        return {"status": flag, "dq_has_nan": nan, "wall_s": round(secs, 3),
                "ok": flag == 1 and nan and secs < 30}  # fmt: skip

    for name in ("shift", "fa3"):
        log.case("timeout", f"{shape.label} {name} rank+1000, 50 ms", lambda n=name: case(n))


def bench_ms(fn: Callable[[], Any], iters: int = 10) -> float:
    for _ in range(3):
        fn()
    wait_gpu(120.0, "timing warm-up")
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    wait_gpu(120.0, "timing loop")
    return start.elapsed_time(end) / iters


def timing(log: Log, workers: int, dtype: torch.dtype) -> None:
    try:
        from flash_attn.cute import flash_attn_func as fa4_func
    except Exception as exc:  # FA4 is optional
        fa4_func = None
        print(f"FA4 not importable ({exc!r}); timing dash-attn only", flush=True)
    for shape in TIMING_SHAPES:
        for causal in (False, True):
            s = shape
            # flash-attn convention (as FA4's numbers and the anchors): forward 4*b*h*sq*sk*d
            # (two matmuls), backward 2.5x that, halved for causal.
            flops = 2.5 * 4 * s.batch * s.heads * s.seqlen_q * s.seqlen_k * s.head_dim
            flops = flops / 2 if causal else flops
            tag = f"{shape.label} {'causal' if causal else 'full'}"
            try:
                prob = Problem(shape, causal, dtype, "cuda")
            except Exception as exc:
                log.rows.append({"kind": "setup", "case": tag, "ok": False, "error": repr(exc)})
                continue
            prob.timing = True
            name = "symmetric_shift" if causal else "shift"
            sched = schedule_for(shape, causal, name, workers)
            for det in (True, False):
                label = f"{tag} dash {name} {'det' if det else 'nondet'}"

                def ours(
                    det: bool = det, sched: Schedule = sched, prob: Problem = prob, flops=flops
                ) -> dict:
                    ms = bench_ms(lambda: prob.run(sched, det, preprocess=True))
                    status = int(prob.run(sched, det)[3][1].item())
                    return {"ms": ms, "tflops": flops / ms / 1e9, "status": status,
                            "ok": status == 0}  # fmt: skip

                log.case("time", label, ours)
                if fa4_func is None:
                    continue

                def fa4(
                    det: bool = det, prob: Problem = prob, causal: bool = causal, flops=flops
                ) -> dict:
                    q, k, v = (prob.inputs[n].detach().requires_grad_() for n in ("q", "k", "v"))
                    out = fa4_func(q, k, v, causal=causal, deterministic=det)
                    out = out[0] if isinstance(out, tuple) else out
                    dout = prob.inputs["dout"]
                    ms = bench_ms(
                        lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
                    )
                    return {"ms": ms, "tflops": flops / ms / 1e9, "ok": True}

                log.case("time", f"{tag} fa4 {'det' if det else 'nondet'}", fa4)
            del prob
            torch.cuda.empty_cache()


# ----------------------------------------------------------------------------- variants


def variants_numerics(
    log: Log, workers: int, dtype: torch.dtype, variants: list[str], repeats: int
) -> None:
    """Per variant: every schedule det with ``repeats`` bitwise repeats, fa3 non-det."""
    for shape in VARIANT_NUMERIC_SHAPES:
        for causal in (False, True):
            tag = f"{shape.label} {'causal' if causal else 'full'}"
            try:
                prob = Problem(shape, causal, dtype, "cuda")
                refs = {
                    "fp32": reference_grads(prob.inputs, causal, prob.scale, torch.float32),
                    "low": reference_grads(prob.inputs, causal, prob.scale, dtype),
                }
            except Exception as exc:
                log.rows.append({"kind": "setup", "case": tag, "ok": False, "error": repr(exc)})
                traceback.print_exc()
                continue
            for variant in variants:
                names = applicable_schedules(
                    schedule_for(shape, causal, "fa3", workers, variant).spec
                )
                for name in names:
                    sched = schedule_for(shape, causal, name, workers, variant)

                    def det_case(s: Schedule = sched, v: str = variant, p=prob, r=refs) -> dict:
                        first = p.run(s, True, variant=v)
                        row = check_numerics(p, first, r)
                        same = True
                        for _ in range(repeats - 1):
                            again = p.run(s, True, variant=v)
                            same = same and all(
                                torch.equal(a, b) for a, b in zip(first[:3], again[:3], strict=True)
                            )
                        row.update(variant=v, repeats=repeats, bitwise=same, ok=row["ok"] and same)
                        return row

                    log.case("vdet", f"{variant} {tag} {name}", det_case)
                sched = schedule_for(shape, causal, "fa3", workers, variant)

                def nondet_case(s: Schedule = sched, v: str = variant, p=prob, r=refs) -> dict:
                    return {**check_numerics(p, p.run(s, False, variant=v), r), "variant": v}

                log.case("vnondet", f"{variant} {tag} fa3", nondet_case)


def variants_timeout(log: Log, workers: int, dtype: torch.dtype, variants: list[str]) -> None:
    """Per variant and head dim: a rank that never arrives raises status[1] and poisons dQ."""
    for variant in variants:
        for head_dim in (64, 128):
            shape = Shape(1, 512, 512, 2, 2, head_dim)

            def case(shape: Shape = shape, variant: str = variant) -> dict:
                prob = Problem(shape, False, dtype, "cuda")
                sched = schedule_for(shape, False, "shift", workers, variant)
                rank = sched.step_rank.copy()
                rank[0] += 1000
                broken = dataclasses.replace(sched, step_rank=rank)
                start = time.monotonic()
                dq, _, _, status = prob.run(broken, True, timeout_ns=50_000_000, variant=variant)
                wait_gpu(60.0, "check")
                secs = time.monotonic() - start
                flag, nan = int(status[1].item()), bool(torch.isnan(dq).any())
                return {"variant": variant, "status": flag, "dq_has_nan": nan,
                        "ok": flag == 1 and nan and secs < 30}  # fmt: skip

            log.case("vtimeout", f"{variant} {shape.label} shift rank+1000", case)


def variants_timing(
    log: Log, workers: int, dtype: torch.dtype, variants: list[str], with_fa4: bool
) -> None:
    fa4_func = None
    if with_fa4:
        try:
            from flash_attn.cute import flash_attn_func as fa4_func
        except Exception as exc:  # FA4 is optional
            print(f"FA4 not importable ({exc!r}); timing dash-attn only", flush=True)
    # The 8 benchmark rows, most informative first (late ones may be skipped), and a small one
    # where host time per call shows: first for variants about host time.
    small = [(Shape(1, 1024, 1024, 16, 16, 128), False)]
    order = [(0, False), (2, False), (0, True), (2, True), (1, False), (3, False), (1, True),
             (3, True)]  # fmt: skip
    cases = [(TIMING_SHAPES[i], causal) for i, causal in order]
    cases = cases + small
    for shape, causal in cases:
        s = shape
        flops = 2.5 * 4 * s.batch * s.heads * s.seqlen_q * s.seqlen_k * s.head_dim
        flops = flops / 2 if causal else flops
        tag = f"{shape.label} {'causal' if causal else 'full'}"
        if time.monotonic() > log.deadline:
            who = ",".join(variants) or "fa4"
            log.rows.append(
                {"kind": "vtime", "case": f"{who} {tag}", "ok": None, "note": "skipped (time)"}
            )
            continue
        try:
            prob = Problem(shape, causal, dtype, "cuda")
        except Exception as exc:
            log.rows.append({"kind": "setup", "case": tag, "ok": False, "error": repr(exc)})
            continue
        prob.timing = True
        name = "symmetric_shift" if causal else "shift"
        for variant in variants:
            sched = schedule_for(shape, causal, name, workers, variant)
            for det in (True, False):

                def ours(
                    det: bool = det, s=sched, v: str = variant, p=prob, tag=tag, flops=flops
                ) -> dict:
                    ms = bench_ms(lambda: p.run(s, det, preprocess=True, variant=v))
                    status = int(p.run(s, det, variant=v)[3][1].item())
                    return {"variant": v, "shape": tag, "det": det, "ms": ms,
                            "tflops": flops / ms / 1e9, "status": status,
                            "ok": status == 0}  # fmt: skip

                log.case("vtime", f"{variant} {tag} {'det' if det else 'nondet'}", ours)
        if fa4_func is not None:
            for det in (True, False):

                def fa4(det: bool = det, p=prob, causal=causal, tag=tag, flops=flops) -> dict:
                    q, k, v = (p.inputs[n].detach().requires_grad_() for n in ("q", "k", "v"))
                    out = fa4_func(q, k, v, causal=causal, deterministic=det)
                    out = out[0] if isinstance(out, tuple) else out
                    dout = p.inputs["dout"]
                    ms = bench_ms(
                        lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
                    )
                    return {"variant": "fa4", "shape": tag, "det": det, "ms": ms,
                            "tflops": flops / ms / 1e9, "ok": True}  # fmt: skip

                log.case("vtime", f"fa4 {tag} {'det' if det else 'nondet'}", fa4)
        del prob
        torch.cuda.empty_cache()


def variants_table(rows: list[dict], variants: list[str]) -> str:
    """Variant x shape TFLOPS (det / nondet), then numerics ok/fail per variant."""
    cols = [*variants, "fa4"]
    timed = {(r["variant"], r["shape"], r["det"]): r for r in rows if "tflops" in r}
    shapes = list(dict.fromkeys(r["shape"] for r in rows if "tflops" in r))
    lines = [f"{'TFLOPS det/nondet':<36}" + "".join(f"{c:>16}" for c in cols)]
    for shape in shapes:
        cells = []
        for c in cols:
            vals = []
            for det in (True, False):
                r = timed.get((c, shape, det))
                vals.append("-" if r is None else f"{r['tflops']:.0f}{'' if r['ok'] else '!'}")
            cells.append("/".join(vals))
        lines.append(f"{shape:<36}" + "".join(f"{c:>16}" for c in cells))
    lines.append("")
    for v in variants:
        # (by case name: a case that raised has no "variant" field)
        checks = [
            r for r in rows
            if r["case"].startswith(v + " ") and r["kind"] in ("vdet", "vnondet", "vtimeout")
        ]  # fmt: skip
        bad = [r["case"] for r in checks if r.get("ok") is False]
        failed_timings = [
            r["case"] for r in rows
            if r["case"].startswith(v + " ") and r["kind"] == "vtime" and r.get("ok") is False
        ]  # fmt: skip
        skipped = sum(r.get("ok") is None for r in rows if r["case"].startswith(v + " "))
        lines.append(
            f"{v:<8} numerics/bitwise/timeout: {len(checks) - len(bad)}/{len(checks)} ok"
            + (f", {skipped} skipped (time)" if skipped else "")
            + (f"; FAILED: {bad[:6]}" if bad else "")
            + (f"; timings FAILED: {failed_timings[:4]}" if failed_timings else "")
        )
    return "\n".join(lines)


def dry_run_variants(log: Log, variants: list[str]) -> None:
    """CPU only: every variant compiled for sm_90a at both head dims, causal/full, det/nondet."""
    for variant in variants:
        for head_dim in (64, 128):
            for causal in (False, True):
                for det in (True, False):

                    def compile_case(v=variant, head_dim=head_dim, causal=causal, det=det):
                        start = time.monotonic()
                        bwd_launch.compile_bwd(
                            torch.bfloat16, head_dim, causal=causal, deterministic=det, variant=v
                        )
                        return {"compile_s": round(time.monotonic() - start, 2), "ok": True}

                    label = f"compile {variant} hd{head_dim} {'causal' if causal else 'full'} "
                    log.case("dry", label + ("det" if det else "nondet"), compile_case)


def run_variants_isolated(args: argparse.Namespace, variants: list[str], start: float) -> list:
    """Each variant in its own process (a hang or a sticky CUDA error of one variant must not
    cost the others their results), then FA4's timing; every child gets a fair share of what
    is left of the budget. Returns the children's rows."""
    rows: list[dict] = []
    deadline = start + args.budget
    # FA4's numbers are known (anchors); it gets a small reserve plus what the variants leave.
    with_fa4 = not (args.skip_timing or args.no_fa4)
    fa4_reserve = 30.0 if with_fa4 else 0.0
    jobs = [[v] for v in variants] + ([["fa4"]] if with_fa4 else [])
    for i, job in enumerate(jobs):
        name = job[0]
        left = deadline - time.monotonic()
        # FA4 (last) takes what is left; each variant an equal part of the rest.
        share = left if name == "fa4" else (left - fa4_reserve) / (len(variants) - i)
        if share < 15:
            rows.append({"kind": "child", "case": name, "ok": None, "note": "skipped (time)"})
            continue
        out = args.out / name
        cmd = [
            sys.executable, os.path.abspath(__file__), "--out", str(out), "--dtype", args.dtype,
            "--repeats", str(args.repeats), "--child-budget", str(share - 10),
        ]  # fmt: skip
        cmd += ["--fa4-only"] if name == "fa4" else ["--variants", name]
        if args.skip_timing:
            cmd.append("--skip-timing")
        print(f"== {name}: {share:.0f} s", flush=True)
        try:
            rc = subprocess.run(cmd, timeout=share + 20).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
        log_file = out / "check_bwd.json"
        if log_file.exists():
            rows += json.loads(log_file.read_text())
        if rc not in (0, 1):  # 1: some check failed (recorded in its rows)
            error = f"child exit {rc}" + (" (GPU hang)" if rc == 3 else "")
            rows.append({"kind": "child", "case": name, "variant": name, "ok": False,
                         "error": error})  # fmt: skip
    return rows


# ----------------------------------------------------------------------------- dry run


def dry_run(log: Log) -> None:
    """CPU only: every case's tables, the kernels compiled for sm_90a, the reference."""

    def tables() -> dict:
        count = 0
        for shape in NUMERIC_SHAPES + TIMING_SHAPES:
            for causal in (False, True):
                spec = schedule_for(shape, causal, "fa3", 132).spec
                for name in applicable_schedules(spec):
                    sched = schedule_for(shape, causal, name, 132)
                    assert grid_of(sched) <= 132
                    count += 1
        return {"schedules": count, "ok": True}

    log.case("dry", "schedule tables for every case", tables)
    for head_dim in (64, 128):
        for causal in (False, True):
            for det in (True, False):

                def compile_case(head_dim: int = head_dim, causal: bool = causal, det: bool = det):
                    start = time.monotonic()
                    bwd_launch.compile_bwd(
                        torch.bfloat16, head_dim, causal=causal, deterministic=det
                    )
                    return {"compile_s": round(time.monotonic() - start, 2), "ok": True}

                label = f"compile hd{head_dim} {'causal' if causal else 'full'} " + (
                    "det" if det else "nondet"
                )
                log.case("dry", label, compile_case)

    def reference() -> dict:
        shape = Shape(1, 70, 90, 2, 1, 64)
        x = make_inputs(shape, torch.float32, "cpu")
        dq, dk, dv = reference_grads(x, True, 0.125, torch.float32)
        return {"ok": bool(torch.isfinite(dq).all() and torch.isfinite(dk).all())}

    log.case("dry", "CPU reference grads (causal, GQA, sq != sk)", reference)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for the JSON/CSV log")
    parser.add_argument("--dry-run", action="store_true", help="CPU-only: tables and compiles")
    parser.add_argument("--repeats", type=int, default=10, help="bitwise repeats per schedule")
    parser.add_argument("--dtype", choices=("bfloat16", "float16"), default="bfloat16")
    parser.add_argument("--skip-timing", action="store_true")
    parser.add_argument(
        "--variants",
        help="comma-separated kernel variants to compare (bwd_launch.VARIANTS: "
        f"{','.join(bwd_launch.VARIANTS)}); replaces the default checks",
    )
    parser.add_argument(
        "--budget", type=float, default=VARIANTS_BUDGET_S,
        help="--variants: seconds for everything, compiles included",
    )  # fmt: skip
    parser.add_argument("--no-fa4", action="store_true", help="--variants: no FA4 timing")
    # Internal: one child of --variants (one variant, or FA4's timing) with its own budget.
    parser.add_argument("--child-budget", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--fa4-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    global _LOG
    start = time.monotonic()
    variants = args.variants.split(",") if args.variants else []
    for v in variants:
        bwd_launch.variant_tiles(v, 64)  # unknown names fail here, before any GPU work
    budget = VARIANTS_BUDGET_S if variants else TIME_BUDGET_S
    child = args.child_budget is not None
    if child:
        budget = args.child_budget
    log = _LOG = Log(args.out, start + budget)
    dtype = getattr(torch, args.dtype)
    if args.dry_run and variants:
        dry_run_variants(log, variants)
    elif args.dry_run:
        dry_run(log)
    elif (variants or args.fa4_only) and not child:
        log.rows = run_variants_isolated(args, variants, start)
    elif variants or args.fa4_only:
        if not torch.cuda.is_available():
            print("no CUDA device: use --dry-run", file=sys.stderr)
            return 2
        props = torch.cuda.get_device_properties(0)
        print(f"device: {props.name}, {props.multi_processor_count} SMs", flush=True)
        workers = props.multi_processor_count
        if args.fa4_only:
            variants_timing(log, workers, dtype, [], with_fa4=True)
        else:
            repeats = min(args.repeats, 3)
            # Timing before the (cheap, but last-resort) timeout check.
            variants_numerics(log, workers, dtype, variants, repeats)
            if not args.skip_timing:
                variants_timing(log, workers, dtype, variants, with_fa4=False)
            variants_timeout(log, workers, dtype, variants)
    else:
        if not torch.cuda.is_available():
            print("no CUDA device: use --dry-run", file=sys.stderr)
            return 2
        props = torch.cuda.get_device_properties(0)
        print(f"device: {props.name}, {props.multi_processor_count} SMs", flush=True)
        workers = props.multi_processor_count
        # Order: the cheap, most informative checks first; timing last (skipped when late).
        log.case("smoke", "first launch (compile + run)", lambda: _smoke(workers, dtype))
        other = torch.float16 if dtype == torch.bfloat16 else torch.bfloat16
        log.case("smoke", f"first launch {other}", lambda: _smoke(workers, other))
        forced_timeout(log, workers, dtype)
        numerics_and_repeats(log, workers, dtype, args.repeats)
        if not args.skip_timing:
            timing(log, workers, dtype)
    log.write()
    print(log.summary())
    if variants and not child:
        table = variants_table(log.rows, variants)
        (args.out / "variants_table.txt").write_text(table + "\n")
        print(table)
    print(f"total {time.monotonic() - start:.1f} s; log in {args.out}")
    failed = [row for row in log.rows if row.get("ok") is False]
    return 1 if failed else 0


def _smoke(workers: int, dtype: torch.dtype) -> dict:
    shape = Shape(1, 256, 256, 2, 2, 128)
    prob = Problem(shape, False, dtype, "cuda")
    refs = {
        "fp32": reference_grads(prob.inputs, False, prob.scale, torch.float32),
        "low": reference_grads(prob.inputs, False, prob.scale, dtype),
    }
    start = time.monotonic()
    got = prob.run(schedule_for(shape, False, "shift", workers), True)
    wait_gpu(60.0, "check")
    row = check_numerics(prob, got, refs)
    row["first_call_s"] = round(time.monotonic() - start, 2)
    return row


if __name__ == "__main__":
    sys.exit(main())
