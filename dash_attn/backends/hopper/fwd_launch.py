"""Compile and launch the Hopper forward (``fwd.HopperFwd``) from torch tensors.

``compile_fwd`` builds one kernel per (head dim, dtype, mask, warpgroups, options) from
symbolic stand-ins (no GPU needed; sm_90a), kept in memory and, through TVM-FFI, in the disk
cache (``kernel_cache``); ``hopper_fwd`` checks its arguments, allocates out and LSE and
launches, with the persistent causal kernel's tile lists made once per shape.
"""

from __future__ import annotations

import importlib.util
import math
import shutil
import tempfile
import threading
import time
from typing import Any

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import numpy as np
import torch
from cutlass import Float32, Int32, Int64
from cutlass.cute.runtime import make_fake_stream

from ...device import device_info
from ..tables import upload_once
from . import kernel_cache
from ._cute_utils import SMEM_LIMIT
from ._tensor_args import TORCH_TO_CUTLASS, fake_tensor, outer_strides, tma_view
from .fwd import (
    CONSUMER_REGS,
    LOG2_E,
    SUPPORTED_HEAD_DIMS,
    TILE_N,
    HopperFwd,
    fwd_smem_bytes,
)
from .fwd_tiles import causal_tile_lists

# How hopper_fwd launches (read at every call, so it can be flipped at run time): False, from
# plain numbers (addresses, sizes, strides: ``__call__``; cutlass-dsl packs each in Python);
# True, through TVM-FFI (``call_tensors`` compiled with --enable-tvm-ffi from symbolic fake
# tensors, called with the torch tensors and torch's current stream taken from the
# environment; needs apache-tvm-ffi). True since the GPU run that compared the two (same bits,
# host time per call 220 -> 41 us: benchmarks/results/h200/session7-2e5d3d2/ffi/, in git
# history at e17a55e).
TVM_FFI_LAUNCH = True

_CACHE: dict[tuple[int, torch.dtype, bool, bool, int, bool, bool], Any] = {}
_CACHE_LOCK = threading.Lock()


def _fake_fwd_args(dtype: type[cutlass.Numeric], head_dim: int) -> tuple:
    """Symbolic stand-ins for q, k, v, out (b, s, h, head_dim) and lse (b, h, s_q) fp32, in
    ``HopperFwd.call_tensors``'s order: every size but the head dim and every stride but the
    unit last one are runtime values, so one kernel serves every shape and layout. The
    16-bit tensors promise a 16-byte aligned base and 16-byte multiple strides (what TMA
    needs and hopper_fwd checks), the LSE 4 bytes, as the plain-number launch does."""

    return (
        *(fake_tensor(dtype, 4, head_dim, 16) for _ in range(4)),
        fake_tensor(Float32, 3, cute.sym_int(), 4),
    )


def _launch_args(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    scale_log2: float,
    max_ctas: int,
) -> tuple:
    """The host function's arguments: addresses, sizes, strides, scale, the persistent grid's
    bound (all plain numbers)."""
    batch, seqlen_q, heads, _ = q.shape
    return (
        q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), lse.data_ptr(),
        batch, seqlen_q, k.shape[1], heads, k.shape[2],
        *outer_strides(q), *outer_strides(k), *outer_strides(v),
        scale_log2, max_ctas,
    )  # fmt: skip


def _check_config(head_dim: int, dtype: torch.dtype) -> None:
    if head_dim not in SUPPORTED_HEAD_DIMS:
        raise NotImplementedError(
            f"head_dim={head_dim} not supported by the Hopper forward; "
            f"supported: {SUPPORTED_HEAD_DIMS}"
        )
    if dtype not in TORCH_TO_CUTLASS:
        raise ValueError(f"dtype={dtype} not supported; use torch.bfloat16 or torch.float16")


def compile_fwd(
    head_dim: int,
    dtype: torch.dtype,
    causal: bool,
    *,
    keep_ptx: bool = False,
    consumer_wgs: int = 2,
    persistent: bool = False,
    tvm_ffi: bool | None = None,
    p_smem: bool = False,
    tile_n: int | None = None,
    skip_unit_rescale: bool = True,
    lpt_order: bool = False,
) -> Any:
    """Compile (or fetch from the in-memory cache) the kernel for one (head_dim, dtype, causal).

    Compiles from small CPU tensors whose layouts are marked fully dynamic, so the result serves
    every batch / seqlen / heads / stride; the real tensors only differ in runtime values. Always
    targets sm_90a (explicitly, so this also works on a machine without a GPU).
    keep_ptx=True keeps the PTX text (`.__ptx__`) and the cubin (`.__cubin__`) on the result for
    inspection (tests, ``tools/hopper/fwd_sass.py``).
    consumer_wgs=3 is the 192-row tile for hd 64, and hd 96 with p_smem (FA4's choices); the
    backend runs it from ``FWD_3WG_MIN_SEQLEN`` query tokens on (``launch.forward_consumer_wgs``).
    persistent: one CTA per SM walking tiles (``HopperFwd``; head dims <= 128; causal: from
    the host's tile lists, TVM-FFI entry only).
    tvm_ffi: compile the TVM-FFI entry (``call_tensors`` from symbolic fake tensors, stream
    from the environment) instead of the plain-number one; None follows ``TVM_FFI_LAUNCH``,
    except for the persistent causal kernel, whose tile lists have the TVM-FFI entry only.
    p_smem: P through shared memory (``HopperFwd``); with it consumer_wgs=3 compiles at hd 96
    too. The backend sets it for its 192-row hd-96 kernel (``FWD_P_SMEM_HEADDIMS``).
    tile_n: keys per block, a multiple of 16 up to 256 (default ``TILE_N[head_dim]``, what the
    backend runs); a width whose tiles do not fit in shared memory raises ValueError.
    skip_unit_rescale: a step leaves O unscaled where its warp's factors are all 1.0
    (``HopperFwd``; the default, what the backend runs; False only for A/B: the same bits).
    lpt_order: the per-tile causal kernel launches its tiles in L2 groups, longest first
    (``HopperFwd``; the same bits).
    """
    if tvm_ffi is None:
        tvm_ffi = TVM_FFI_LAUNCH or (persistent and causal)
    _check_config(head_dim, dtype)
    if consumer_wgs not in CONSUMER_REGS:
        raise ValueError(f"consumer_wgs={consumer_wgs} not supported; use 2 or 3")
    if consumer_wgs == 3 and head_dim != 64 and not (head_dim == 96 and p_smem):
        # 160 registers per consumer thread: hd 96 spills with P in registers (ptxas: 240 B),
        # larger head dims more.
        raise NotImplementedError(
            f"consumer_wgs=3 is implemented for head_dim 64 (and 96 with p_smem), not {head_dim}"
        )
    if persistent and causal and not tvm_ffi:
        raise NotImplementedError(
            "the persistent causal forward takes its tile lists through the TVM-FFI entry "
            "only (tvm_ffi=True)"
        )
    if tvm_ffi and importlib.util.find_spec("tvm_ffi") is None:
        raise ImportError(
            "the TVM-FFI launch of the Hopper forward (tvm_ffi=True or TVM_FFI_LAUNCH) needs "
            "apache-tvm-ffi: pip install 'apache-tvm-ffi>=0.1.15,<0.2'"
        )
    if tile_n is None:
        tile_n = TILE_N[head_dim]
    key = (head_dim, dtype, bool(causal), keep_ptx, consumer_wgs, bool(persistent), bool(tvm_ffi))
    if p_smem:
        key += ("p_smem",)
    if tile_n != TILE_N[head_dim]:
        key += (f"n{tile_n}",)
    if not skip_unit_rescale:
        key += ("rescale_always",)
    if lpt_order and causal and not persistent:
        key += ("lpt_order",)
    with _CACHE_LOCK:
        hit = _CACHE.get(key)
        if hit is not None:
            return hit
        cutlass_dtype = TORCH_TO_CUTLASS[dtype]
        kernel = HopperFwd(
            cutlass_dtype, head_dim, bool(causal), consumer_wgs, bool(persistent), bool(p_smem),
            tile_n, bool(skip_unit_rescale), bool(lpt_order),
        )  # fmt: skip
        # The width's checks, on a cache miss only (every forward call comes through here);
        # after HopperFwd, which refuses the configs that do not exist (persistent hd > 128).
        if tile_n % 16 or not 16 <= tile_n <= 256:
            raise ValueError(f"tile_n must be a multiple of 16 in [16, 256], got {tile_n}")
        smem = fwd_smem_bytes(head_dim, consumer_wgs, tile_n, persistent, p_smem)
        if smem > SMEM_LIMIT:
            raise ValueError(
                f"tile_n={tile_n} at head_dim={head_dim} with {consumer_wgs} consumer "
                f"warpgroups (persistent={persistent}, p_smem={p_smem}) needs {smem} bytes of "
                f"shared memory, more than the {SMEM_LIMIT} a CTA may have"
            )
        options = "--gpu-arch sm_90a"
        if tvm_ffi:
            # Fake tensors, the scale a typed placeholder, the stream the caller's current one
            # (TVM-FFI reads torch's current stream of the tensors' device at every call).
            entry = kernel.call_tensors
            args = (*_fake_fwd_args(cutlass_dtype, head_dim), Float32(1.0), Int32(1))
            if kernel.tile_list:
                lists = tuple(fake_tensor(Int32, 1, cute.sym_int(), 4) for _ in range(2))
                entry = kernel.call_tensors_tiled
                args = (*args[:5], *lists, *args[5:])
            stream = make_fake_stream(use_tvm_ffi_env_stream=True)
            options += " --enable-tvm-ffi"
        else:
            # Every argument is a typed runtime value (no tensor needed, so this runs without a
            # GPU); the values themselves are placeholders that nothing is specialised on.
            entry = kernel
            args = (
                *(Int64(0) for _ in range(5)),  # q, k, v, out, lse addresses
                *(Int32(1) for _ in range(5)),  # batch, seqlen_q, seqlen_k, heads, kv_heads
                *(Int64(8) for _ in range(9)),  # (b, s, h) strides of q, k, v
                Float32(1.0),
                Int32(1),  # max_ctas
            )
            stream = cuda.CUstream(0)
        dump_dir = None
        if keep_ptx:
            # --keep-ptx also writes a file; keep it out of the caller's cwd and delete it
            # (the text stays on the result as .__ptx__).
            dump_dir = tempfile.mkdtemp(prefix="dash_attn_fwd_ptx_")
            options += f" --keep-ptx --keep-cubin --dump-dir {dump_dir}"
        try:
            if tvm_ffi and not keep_ptx:  # through the disk cache (kernel_cache)
                compiled = kernel_cache.cached_compile(
                    ("fwd", *key), lambda: cute.compile(entry, *args, stream, options=options)
                )
            else:
                compiled = cute.compile(entry, *args, stream, options=options)
        finally:
            if dump_dir is not None:
                shutil.rmtree(dump_dir, ignore_errors=True)
        _CACHE[key] = compiled
        return compiled


def _device_tile_lists(
    device: torch.device,
    head_dim: int,
    consumer_wgs: int,
    batch: int,
    heads: int,
    seqlen_q: int,
    seqlen_k: int,
    sm_count: int,
    tile_n: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The persistent causal kernel's tile lists on ``device`` (int32 tiles, starts), made and
    uploaded once per shape, as the backward's schedule tables (``tables.upload_once``)."""
    tile_m = 64 * consumer_wgs
    num_m_blocks = -(-seqlen_q // tile_m)

    def make() -> dict[str, np.ndarray]:
        lists = causal_tile_lists(
            num_m_blocks=num_m_blocks, heads=heads, batch=batch, tile_m=tile_m,
            tile_n=tile_n, seqlen_q=seqlen_q, seqlen_k=seqlen_k, head_dim=head_dim,
            workers=min(sm_count, num_m_blocks * heads * batch),
        )  # fmt: skip
        return {"tiles": lists.tiles, "starts": lists.starts}

    key = ("fwd_tiles", head_dim, tile_m, tile_n, batch, heads, seqlen_q, seqlen_k, sm_count)
    tables = upload_once(key, device, make)
    return tables["tiles"], tables["starts"]


def hopper_fwd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool,
    softmax_scale: float,
    consumer_wgs: int = 2,
    persistent: bool = False,
    p_smem: bool = False,
    tile_n: int | None = None,
    skip_unit_rescale: bool = True,
    lpt_order: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention forward on Hopper.

    q (b, sq, h, d), k/v (b, sk, hk, d), bf16/fp16; returns out like q and lse (b, h, sq) fp32
    in natural log. GQA: q head h reads kv head h // (heads // kv_heads).
    consumer_wgs: 2 (default, 128-row tiles) or 3 (192-row tiles: hd 64, and hd 96 with
    p_smem).
    persistent: one CTA per SM walking the tiles (head dims <= 128; causal: each CTA the list
    ``fwd_tiles.causal_tile_lists`` gives it, made once per shape).
    p_smem: P through shared memory (``compile_fwd``; the backend's choice at hd 96 with
    three warpgroups).
    tile_n: keys per block (``compile_fwd``; default the backend's width for the head dim).
    skip_unit_rescale, lpt_order: ``compile_fwd``'s (the same bits either way).
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 4:
            raise ValueError(
                f"{name} must be 4-D (batch, seqlen, heads, head_dim); got shape {tuple(t.shape)}"
            )
        if t.stride(-1) != 1:
            raise ValueError(f"{name} must have a unit-stride last dim; got strides {t.stride()}")
        if t.dtype != q.dtype:
            raise ValueError(f"{name}.dtype={t.dtype} differs from q.dtype={q.dtype}")
    batch, seqlen_q, heads, head_dim = q.shape
    if k.shape != v.shape:
        raise ValueError(f"k and v shapes differ: {tuple(k.shape)} vs {tuple(v.shape)}")
    if k.shape[0] != batch or k.shape[3] != head_dim:
        raise ValueError(f"k shape {tuple(k.shape)} incompatible with q shape {tuple(q.shape)}")
    kv_heads = k.shape[2]
    if kv_heads == 0 or heads % kv_heads != 0:
        raise ValueError(f"heads={heads} must be a multiple of kv_heads={kv_heads}")
    _check_config(head_dim, q.dtype)
    for name, t in (("q", q), ("k", k), ("v", v)):
        # TMA needs a 16-byte aligned base and 16-byte multiple strides (size-1 dims excepted,
        # see outer_strides); a violation would fault or read garbage, not raise.
        if t.data_ptr() % 16 or any(st * t.element_size() % 16 for st in outer_strides(t)):
            raise ValueError(
                f"{name} must be 16-byte aligned with 16-byte multiple strides for TMA; got "
                f"data_ptr % 16 = {t.data_ptr() % 16}, strides {t.stride()}"
            )
    if not (q.is_cuda and k.device == q.device and v.device == q.device):
        raise ValueError(
            f"q, k, v must be on one CUDA device; got {q.device}, {k.device}, {v.device}"
        )
    scale = float(softmax_scale)
    if not math.isfinite(scale) or scale <= 0.0:
        raise ValueError(f"softmax_scale must be a positive finite float; got {softmax_scale}")
    out = torch.empty((batch, seqlen_q, heads, head_dim), device=q.device, dtype=q.dtype)
    lse = torch.empty((batch, heads, seqlen_q), device=q.device, dtype=torch.float32)
    if out.numel() == 0 or k.shape[1] == 0:
        # Nothing to launch (a TMA descriptor cannot describe an empty dim): no keys means
        # every row is empty, out = 0 and lse = -inf by the contract.
        out.zero_()
        lse.fill_(float("-inf"))
        return out, lse
    # The entry follows TVM_FFI_LAUNCH (compile_fwd's default), but the persistent causal
    # kernel's is always TVM-FFI.
    compiled = compile_fwd(
        head_dim, q.dtype, bool(causal), consumer_wgs=consumer_wgs, persistent=persistent,
        p_smem=p_smem, tile_n=tile_n, skip_unit_rescale=skip_unit_rescale, lpt_order=lpt_order,
    )  # fmt: skip
    # The persistent grid's bound: one CTA per SM (the kernel takes a whole SM's registers).
    max_ctas = device_info(q.device).sm_count
    if persistent and causal:
        tiles, starts = _device_tile_lists(
            q.device, head_dim, consumer_wgs, batch, heads, seqlen_q, k.shape[1], max_ctas,
            TILE_N[head_dim] if tile_n is None else tile_n,
        )  # fmt: skip
        compiled(
            tma_view(q), tma_view(k), tma_view(v), out, lse, tiles, starts, scale * LOG2_E,
            starts.shape[0] - 1,
        )  # fmt: skip
        return out, lse
    if TVM_FFI_LAUNCH:
        # TVM-FFI launches on q's device, on torch's current stream there.
        compiled(tma_view(q), tma_view(k), tma_view(v), out, lse, scale * LOG2_E, max_ctas)
        return out, lse
    args = _launch_args(q, k, v, out, lse, scale * LOG2_E, max_ctas)
    stream = cuda.CUstream(torch.cuda.current_stream(q.device).cuda_stream)
    if q.device.index == torch.cuda.current_device():
        compiled(*args, stream)
    else:  # the module must load / launch in q's device context
        with torch.cuda.device(q.device):
            compiled(*args, stream)
    return out, lse


def compile_report(
    head_dim: int,
    dtype_name: str,
    causal: bool,
    consumer_wgs: int = 2,
    tvm_ffi: bool = False,
    persistent: bool = False,
    p_smem: bool = False,
    tile_n: int | None = None,
    skip_unit_rescale: bool = True,
    lpt_order: bool = False,
) -> tuple[str, float]:
    """(PTX, compile seconds) for one config; a top-level function so that tests and tools can
    run it in worker processes (compiles are CPU-bound, one config per process in parallel)."""
    start = time.perf_counter()
    compiled = compile_fwd(
        head_dim, getattr(torch, dtype_name), causal, keep_ptx=True, consumer_wgs=consumer_wgs,
        persistent=persistent, tvm_ffi=tvm_ffi, p_smem=p_smem, tile_n=tile_n,
        skip_unit_rescale=skip_unit_rescale, lpt_order=lpt_order,
    )  # fmt: skip
    return compiled.__ptx__ or "", time.perf_counter() - start
