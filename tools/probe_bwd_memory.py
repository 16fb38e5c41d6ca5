"""GPU probe: the extra memory of one deterministic backward, dash-attn's hopper backend beside
FlashAttention-4 (issue #10's target: no more than FA4's fp32 dQ accumulator and semaphores).

For each shape, the peak of ``torch.cuda.max_memory_allocated()`` during
``torch.autograd.grad(out, (q, k, v), dout)`` minus what was allocated before the call. Both
providers return dq, dk and dv of the same sizes, so the difference between the two columns is
the difference of their workspaces (dash-attn: LSE2, delta, the fp32 dQ accumulator in
fragment order and one semaphore per dQ tile; FA4: the same kinds, plus fp32 dK/dV
accumulators and their semaphores under GQA. dash-attn's GQA split adds, deterministic, fp32
dK/dV accumulators of the kv heads and two semaphores per (kv head, KV tile), as FA4; the
non-deterministic backward's split writes 16-bit dK/dV partials per q head instead (a column of
its own), and a column without the split shows what either costs). Schedule tables (dash-attn,
kept on the device per schedule) are uploaded by a warm-up call and are not in the peak; their
size is a column of its own. Run from the repository root on an sm_90 GPU with the
CuTe-DSL/FA4 kit installed::

    OUT=out PYTHONPATH=$PWD python3 tools/probe_bwd_memory.py   # writes out/bwd_memory.csv
"""

from __future__ import annotations

import csv
import os
from collections.abc import Callable

import torch

from dash_attn import dash_attn_func, last_launch_info
from dash_attn.backends.tables import device_tables

# (batch, seqlen, heads, kv_heads, head_dim, causal): the sweep's 16k tokens x hidden 2048 at
# three lengths, and two GQA shapes.
SHAPES = [
    (b, s, 2048 // d, 2048 // d, d, causal)
    for d in (64, 128)
    for causal in (False, True)
    for b, s in ((32, 512), (8, 2048), (2, 8192))
] + [(1, 8192, 32, 8, 128, True), (1, 8192, 28, 4, 128, True), (4, 2048, 16, 4, 128, False)]


def peak_extra_bytes(backward: Callable[[], object]) -> int:
    backward()  # warm-up: compiles, tables, the caching allocator's pools
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    backward()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - before


def measure(
    batch: int, seqlen: int, heads: int, kv_heads: int, head_dim: int, causal: bool, fa4
) -> dict[str, object]:
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (
        torch.randn(
            batch, seqlen, h, head_dim, device="cuda", dtype=torch.bfloat16, generator=gen
        ).requires_grad_()
        for h in (heads, kv_heads, kv_heads)
    )
    dout = torch.randn_like(q)
    row: dict[str, object] = {
        "batch": batch, "seqlen": seqlen, "heads": heads, "kv_heads": kv_heads,
        "head_dim": head_dim, "causal": causal,
        "grads_bytes": sum(t.numel() * t.element_size() for t in (q, k, v)),
    }  # fmt: skip
    out = dash_attn_func(q, k, v, causal=causal, backend="hopper")
    row["dash_hopper_det_bytes"] = peak_extra_bytes(
        lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
    )
    tables = device_tables(last_launch_info().schedule, q.device)
    row["dash_tables_bytes"] = sum(t.numel() * t.element_size() for t in tables.values())
    # GQA: the default splits by q head (deterministic: fp32 dK/dV sums in the kernel; non-det:
    # 16-bit partials per q head); without the split, neither.
    row["dash_hopper_det_nosplit_bytes"] = ""
    row["dash_hopper_nondet_bytes"] = ""
    if heads != kv_heads:
        nondet = dash_attn_func(q, k, v, causal=causal, backend="hopper", deterministic=False)
        row["dash_hopper_nondet_bytes"] = peak_extra_bytes(
            lambda: torch.autograd.grad(nondet, (q, k, v), dout, retain_graph=True)
        )
        whole = dash_attn_func(q, k, v, causal=causal, backend="hopper", gqa_split=False)
        row["dash_hopper_det_nosplit_bytes"] = peak_extra_bytes(
            lambda: torch.autograd.grad(whole, (q, k, v), dout, retain_graph=True)
        )
    row["fa4_det_bytes"] = ""
    if fa4 is not None:
        out4 = fa4(q, k, v, causal=causal, deterministic=True)
        out4 = out4[0] if isinstance(out4, tuple) else out4
        row["fa4_det_bytes"] = peak_extra_bytes(
            lambda: torch.autograd.grad(out4, (q, k, v), dout, retain_graph=True)
        )
    return row


def main() -> None:
    try:
        from flash_attn.cute import flash_attn_func as fa4
    except ImportError:
        fa4 = None
    rows = []
    for shape in SHAPES:
        rows.append(measure(*shape, fa4))
        print(rows[-1], flush=True)
    path = os.path.join(os.environ.get("OUT", "."), "bwd_memory.csv")
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


if __name__ == "__main__":
    main()
