"""GPU probe (session 7): host microseconds per call of each layer of one backward, from
``torch.autograd.grad`` down to the compiled kernel call, for the hopper and triton backends
(d128, full mask, batch 32 x 512 tokens x 16 heads: a shape whose kernels take ~0.6 ms, so a
slower host leaves the GPU idle).

Each layer is called 100 times with no synchronisation inside the loop (launches only queue),
after 10 warm-up calls. Run from the repository root on a GPU (the CuTe-DSL kit installed for
the hopper rows)::

    OUT=out PYTHONPATH=$PWD python3 tools/probe_host_layers.py   # writes out/dev3.json
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable

import torch

import dash_attn.backends.hopper.launch as hopper_launch
import dash_attn.backends.triton.launch as triton_launch
from dash_attn import dash_attn_func, dispatch
from dash_attn.backends.tables import device_tables
from dash_attn.backends.triton.bwd import attn_bwd_preprocess
from dash_attn.backends.triton.dq_cast import scale_cast
from dash_attn.errors import record_status

BATCH, SEQLEN, HEADS, HEADDIM = 32, 512, 16, 128


def host_us(fn: Callable[[], object], calls: int = 100) -> float:
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    host = (time.perf_counter() - start) / calls * 1e6
    torch.cuda.synchronize()
    return host


def layers(backend: str, x: list[torch.Tensor]) -> dict[str, Callable[[], object]]:
    q, k, v, dout = x
    # "hopper+cute": the hopper backend with its CuTe-DSL preprocess and cast
    # (hopper.launch.CUTE_PRE_POST, session 12).
    hopper_launch.CUTE_PRE_POST = backend == "hopper+cute"
    backend = backend.removesuffix("+cute")
    scale = HEADDIM**-0.5
    qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
    out = dash_attn_func(qg, kg, vg, backend=backend)
    torch.autograd.grad(out, (qg, kg, vg), dout, retain_graph=True)
    plan = dispatch.last_launch_info()
    o = out.detach()
    _, lse = torch.ops.dash_attn.fwd(q, k, v, False, scale, backend)
    module = hopper_launch if backend == "hopper" else triton_launch
    rows_pad = plan.spec.q_tiles * plan.tiles.block_m
    lse2, delta = attn_bwd_preprocess(o, dout, lse, rows_pad)
    tables = device_tables(plan.schedule, q.device)
    acc = torch.zeros(BATCH, SEQLEN, HEADS, HEADDIM, device="cuda")
    flag = acc.new_zeros((), dtype=torch.int32)
    options = dict(causal=False, softmax_scale=scale, deterministic=True, schedule="auto",
                   sm_margin=0, backend=backend)  # fmt: skip
    found = {
        "autograd.grad": lambda: torch.autograd.grad(out, (qg, kg, vg), dout, retain_graph=True),
        "torch.ops.dash_attn.bwd": lambda: torch.ops.dash_attn.bwd(
            dout, q, k, v, o, lse, False, scale, True, "auto", 0, backend
        ),
        "dispatch.backward": lambda: dispatch.backward(dout, q, k, v, o, lse, **options),
        "backend.run_backward": lambda: module.run_backward(plan, dout, q, k, v, o, lse, scale),
        "preprocess": lambda: attn_bwd_preprocess(o, dout, lse, rows_pad),
        "scale_cast": lambda: scale_cast(acc, scale, torch.bfloat16),
        "torch_cast": lambda: (acc * scale).to(torch.bfloat16),
        "record_status": lambda: record_status(flag, "never raised", False),
    }
    if backend == "hopper" and not hopper_launch.CUTE_PRE_POST:
        found["main"] = lambda: hopper_launch._main(plan, q, k, v, dout, lse2, delta, tables, scale)
    return found


def main() -> None:
    gen = torch.Generator(device="cuda").manual_seed(0)
    shape = (BATCH, SEQLEN, HEADS, HEADDIM)
    x = [torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(4)]
    rows = []
    for backend in ("hopper", "hopper+cute", "triton"):
        for name, fn in layers(backend, x).items():
            try:
                result: float | str = host_us(fn)
            except Exception as exc:  # a probe: record the failure and go on
                result = repr(exc)[:200]
            rows.append({"backend": backend, "layer": name, "host_us": result})
            print(json.dumps(rows[-1]), flush=True)
    hopper_launch.CUTE_PRE_POST = False
    with open(os.path.join(os.environ["OUT"], "dev3.json"), "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
