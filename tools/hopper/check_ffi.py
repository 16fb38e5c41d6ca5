"""GPU check of the TVM-FFI launch of the Hopper backward (bwd_launch variants t128_ffi and
fast_ffi) against the launch it replaces (t128_lt / fast_lt: the same kernel).

Run on an H100/H200 from the repository root::

    PYTHONPATH=$PWD python3 tools/hopper/check_ffi.py [--batch 2 --seqlen 1000 --heads 4
        --head-dim 128 --full --non-det --calls 100]

1. A forward and backward through the public API (backend "hopper", schedule "auto") gives the
   plan (``dash_attn.last_launch_info()``); the main kernel's inputs (lse2, delta, tables) are
   rebuilt from it as ``backends.backward.run_backward`` builds them.
2. Host cost per call, ``time.perf_counter`` over ``--calls`` calls without a sync inside the
   loop (launches only queue): the whole ``hopper_bwd_main`` (checks, allocations, launch) and
   the compiled kernel call alone, for the old and the FFI variant.
3. Bitwise check: dq_acc, dk, dv of the FFI launch ``torch.equal`` to the old launch's, and
   no timed-out wait (status[1] == 0) in either.
4. Whole backward (``loss.backward()``) wall time per call with each variant shipped (the
   dict ``hopper.BWD_VARIANT`` patched for the run), synchronised at the end.
5. The forward's two launches (``fwd.TVM_FFI_LAUNCH`` False / True): host cost per call and
   ``torch.equal`` out and lse.

Prints one line per measurement and exits non-zero if a check fails.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable

import cuda.bindings.driver as cuda
import torch
from cutlass import Float32, Int32, Int64

import dash_attn
from dash_attn.backends import hopper
from dash_attn.backends.hopper import bwd_launch
from dash_attn.backends.hopper import fwd as hfwd
from dash_attn.backends.hopper.fwd import hopper_fwd
from dash_attn.backends.tables import device_tables
from dash_attn.backends.triton.bwd import attn_bwd_preprocess
from dash_attn.plan import BackwardPlan
from dash_attn.schedule import TABLE_FIELDS, Dispatch

# The FFI launch of each shipped variant (same kernel options and tiles).
FFI_OF = {"t128_lt": "t128_ffi", "fast_lt": "fast_ffi"}


def _per_call_us(fn: Callable[[], object], calls: int) -> float:
    """Host microseconds per call of ``fn`` (a warm-up call first; one sync before and after
    the timed loop, none inside)."""
    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    host = time.perf_counter() - start
    torch.cuda.synchronize()
    return host / calls * 1e6


def _main_kwargs(plan: BackwardPlan, softmax_scale: float, variant: str) -> dict:
    """hopper_bwd_main's keyword arguments for ``plan`` (as backends.hopper.launch._main)."""
    spec, tiles = plan.spec, plan.tiles
    return dict(
        block_m=tiles.block_m, block_n=tiles.block_n, num_workers=plan.grid,
        q_tiles=spec.q_tiles, kv_tiles=spec.kv_tiles, num_chains=spec.num_chains,
        causal=spec.mask.causal, softmax_scale=softmax_scale,
        deterministic=plan.deterministic, dynamic=plan.dispatch is Dispatch.DYNAMIC,
        timeout_ns=int(plan.timeout_s * 1e9), variant=variant,
    )  # fmt: skip


def _kernel_call(
    variant: str, tensors: tuple, tables: dict[str, torch.Tensor], kwargs: dict
) -> Callable[[], object]:
    """The compiled kernel call alone (no checks, no allocation) as hopper_bwd_main makes it,
    on preallocated outputs (the results are not looked at)."""
    q, k, v, dout, lse2, delta = tensors
    batch, seqlen_q, heads, head_dim = q.shape
    dq_acc = torch.zeros((batch, seqlen_q, heads, head_dim), device=q.device)
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    flags = torch.zeros(2 + batch * heads * kwargs["q_tiles"], device=q.device, dtype=torch.int32)
    outs = (dq_acc, dk, dv, flags)
    compiled = bwd_launch.compile_bwd(
        q, k, v, dout, lse2, delta, *outs, tables, causal=kwargs["causal"],
        deterministic=kwargs["deterministic"], block_m=kwargs["block_m"],
        block_n=kwargs["block_n"], variant=variant,
    )  # fmt: skip
    scalars = bwd_launch._scalar_args(
        kwargs["q_tiles"], kwargs["kv_tiles"], kwargs["num_chains"], kwargs["num_workers"],
        kwargs["dynamic"], kwargs["softmax_scale"], kwargs["timeout_ns"],
    )  # fmt: skip
    mode = bwd_launch._launch_mode(variant)
    if mode == "tvm_ffi":
        args = (*tensors, *outs, *(tables[name] for name in TABLE_FIELDS), *scalars)

        def call_ffi() -> None:
            # The semaphores and the ticket counter start at zero in every launch (without this
            # a deterministic rerun waits for ranks that have passed, until its timeout).
            flags.zero_()
            compiled(*args)

        return call_ffi

    def call() -> None:
        # What hopper_bwd_main does per call on the other paths: the arguments and the stream.
        flags.zero_()
        stream = cuda.CUstream(torch.cuda.current_stream(q.device).cuda_stream)
        if mode == "ints":
            compiled(*bwd_launch._int_args(*tensors, *outs, tables), *scalars, stream)
        else:
            compiled(
                *bwd_launch._kernel_args(*tensors, *outs, tables),
                Int32(scalars[0]), Int32(scalars[1]), Int32(scalars[2]), Int32(scalars[3]),
                Int32(scalars[4]), Float32(scalars[5]), Int64(scalars[6]), stream,
            )  # fmt: skip

    return call


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seqlen", type=int, default=1000)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--head-dim", type=int, default=128, choices=hopper.BWD_HEADDIMS)
    parser.add_argument("--full", action="store_true", help="no causal mask")
    parser.add_argument("--non-det", action="store_true", help="deterministic=False")
    parser.add_argument("--calls", type=int, default=100)
    args = parser.parse_args()
    causal, det = not args.full, not args.non_det

    torch.manual_seed(0)
    shape = (args.batch, args.seqlen, args.heads, args.head_dim)
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    dout = torch.randn_like(q)
    scale = args.head_dim**-0.5

    # 1. The plan of this shape, from one public forward + backward.
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    out_api = dash_attn.dash_attn_func(
        qg, kg, vg, causal=causal, deterministic=det, backend="hopper"
    )
    out_api.backward(dout)
    plan = dash_attn.last_launch_info()
    if plan is None or plan.backend != "hopper":
        raise SystemExit(f"the backward did not run on the hopper backend: {plan}")
    old = hopper.BWD_VARIANT[args.head_dim]
    new = FFI_OF[old]
    print(f"plan: {plan.describe()}")
    print(f"variants: {old} (old) vs {new} (TVM-FFI)")

    out, lse = hopper_fwd(q, k, v, causal=causal, softmax_scale=scale)
    lse2, delta = attn_bwd_preprocess(out, dout, lse, plan.spec.q_tiles * plan.tiles.block_m)
    tables = device_tables(plan.schedule, q.device)
    tensors = (q, k, v, dout, lse2, delta)

    # 2. Host cost per call.
    for variant in (old, new):
        kwargs = _main_kwargs(plan, scale, variant)
        main_us = _per_call_us(
            lambda kw=kwargs: bwd_launch.hopper_bwd_main(*tensors, tables, **kw), args.calls
        )
        kernel_us = _per_call_us(_kernel_call(variant, tensors, tables, kwargs), args.calls)
        print(
            f"host us/call {variant:9s}: hopper_bwd_main {main_us:8.1f}, "
            f"compiled call {kernel_us:8.1f}"
        )

    # 3. Bitwise equality of the two launches.
    results = {}
    for variant in (old, new):
        results[variant] = bwd_launch.hopper_bwd_main(
            *tensors, tables, **_main_kwargs(plan, scale, variant)
        )
    torch.cuda.synchronize()
    failures = []
    for name, a, b in zip(("dq_acc", "dk", "dv"), results[old][:3], results[new][:3], strict=True):
        equal = torch.equal(a, b)
        print(f"{name}: torch.equal(old, ffi) = {equal}")
        if not equal:
            failures.append(name)
    for variant in (old, new):
        if int(results[variant][3][1]) != 0:
            failures.append(f"{variant} timed out")
    if any(not torch.isfinite(t).all() for t in results[new][:3]):
        failures.append("non-finite gradients")

    # 4. The whole backward with each variant shipped.
    for variant in (old, new):
        hopper.BWD_VARIANT[args.head_dim] = variant
        try:
            out_api = dash_attn.dash_attn_func(
                qg, kg, vg, causal=causal, deterministic=det, backend="hopper"
            )

            def backward(o: torch.Tensor = out_api) -> None:
                torch.autograd.grad(o, (qg, kg, vg), dout, retain_graph=True)

            backward()
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(args.calls):
                backward()
            torch.cuda.synchronize()
            wall = (time.perf_counter() - start) / args.calls * 1e6
        finally:
            hopper.BWD_VARIANT[args.head_dim] = old
        print(f"whole backward {variant:9s}: {wall:8.1f} us/call (wall, synchronised at the end)")

    # 5. The forward's two launches (fwd.TVM_FFI_LAUNCH): host cost per call and bitwise out/lse.
    fwd_results = {}
    for ffi in (False, True):
        hfwd.TVM_FFI_LAUNCH = ffi
        try:
            host_us = _per_call_us(
                lambda: hopper_fwd(q, k, v, causal=causal, softmax_scale=scale), args.calls
            )
            fwd_results[ffi] = hopper_fwd(q, k, v, causal=causal, softmax_scale=scale)
        finally:
            hfwd.TVM_FFI_LAUNCH = False
        print(f"host us/call forward {'tvm_ffi' if ffi else 'ints':7s}: {host_us:8.1f}")
    torch.cuda.synchronize()
    for name, a, b in zip(("out", "lse"), fwd_results[False], fwd_results[True], strict=True):
        equal = torch.equal(a, b)
        print(f"forward {name}: torch.equal(ints, ffi) = {equal}")
        if not equal:
            failures.append(f"forward {name}")

    print("FAILED: " + ", ".join(failures) if failures else "OK")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
