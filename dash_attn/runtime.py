"""Host side of the backward: pick the schedule, upload its tables, launch, and report failures.

Everything here runs eagerly inside the ``dash_attn::bwd`` custom op, so torch.compile treats it
as one opaque call.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass

import torch

from .kernels.bwd import attn_bwd_main, attn_bwd_preprocess, tma_loadable
from .kernels.utils import is_interpreter, sm_count
from .schedule import Dispatch, Schedule, ScheduleSpec, make_schedule
from .tiles import BackwardTiles, backward_tiles
from .tiles import kernel_schedule_spec as schedule_spec

# A correct schedule waits microseconds; this bound only exists to turn a deadlock (for instance
# SMs taken by a concurrent kernel) into an error instead of a frozen GPU.
DEFAULT_TIMEOUT_S = float(os.environ.get("DASH_ATTN_TIMEOUT_S", "10"))
# The interpreter has no clock: bound the number of polls (checked every 256 polls).
INTERPRETER_MAX_POLLS = 512
DQ_REDUCE_MODES = ("auto", "atomic", "tma")


def _has_tma(device: torch.device) -> bool:
    """Whether ``device`` is a Hopper or newer GPU run by compiled kernels (TMA hardware)."""
    if device.type != "cuda" or is_interpreter():
        return False
    major, _ = torch.cuda.get_device_capability(device)
    return major >= 9


def _no_tma(variable: str, device: torch.device, elsewhere: str) -> ValueError:
    """The error for ``variable=tma`` on a device without TMA (``elsewhere``: what else works)."""
    if device.type == "cuda" and not is_interpreter():
        major, _ = torch.cuda.get_device_capability(device)
        return ValueError(
            f"{variable}=tma needs a Hopper (sm_90) or newer GPU; {device} is sm_{major}x"
        )
    return ValueError(f"{variable}=tma needs a CUDA GPU{elsewhere}")


def dq_reduce_mode(device: torch.device) -> str:
    """How the backward adds dQ partials on ``device``: "tma" or "atomic".

    ``DASH_ATTN_DQ_REDUCE`` (a tuning knob) picks: "auto" (the default) is "tma" on Hopper and
    newer GPUs, where it measured 4-9% faster at head dim 128 (benchmarks/NOTES.md), else
    "atomic". "atomic": vector fp32 atomics from every thread. "tma": one TMA bulk tensor
    reduction per step. Both add the same partials in the same order, so they give the same bits.
    """
    mode = os.environ.get("DASH_ATTN_DQ_REDUCE", "auto") or "auto"
    if mode not in DQ_REDUCE_MODES:
        raise ValueError(
            f"DASH_ATTN_DQ_REDUCE must be one of {list(DQ_REDUCE_MODES)}, got {mode!r}"
        )
    if mode == "auto":
        return "tma" if _has_tma(device) else "atomic"
    if mode == "tma" and not _has_tma(device):
        raise _no_tma(
            "DASH_ATTN_DQ_REDUCE",
            device,
            " (Triton's interpreter has no bulk reductions); unset it or use 'atomic'",
        )
    return mode


QO_LOAD_MODES = ("pointer", "tma")


def qo_load_mode(device: torch.device) -> str:
    """How the backward loads Q, dO, LSE and delta on ``device``: "pointer" or "tma".

    ``DASH_ATTN_QO_LOAD`` (a tuning knob, default "pointer"): "tma" loads them with TMA through
    tensor descriptors (Hopper or newer GPUs, and Triton's interpreter, which emulates them) and
    reads the step tables one step ahead. Both load the same values: same results, bit for bit.
    Not yet measured on a GPU (benchmarks/NOTES.md), hence not the default.
    """
    mode = os.environ.get("DASH_ATTN_QO_LOAD", "pointer") or "pointer"
    if mode not in QO_LOAD_MODES:
        raise ValueError(f"DASH_ATTN_QO_LOAD must be one of {list(QO_LOAD_MODES)}, got {mode!r}")
    # Triton's interpreter emulates descriptor loads (the CPU tests run this path).
    if mode == "tma" and not (_has_tma(device) or is_interpreter()):
        raise _no_tma("DASH_ATTN_QO_LOAD", device, " or Triton's interpreter")
    return mode


@dataclass(frozen=True)
class LaunchInfo:
    """What the last backward ran: for debugging and for benchmarks to record."""

    schedule: str
    dispatch: str
    spec: ScheduleSpec
    tiles: BackwardTiles
    workers: int
    deterministic: bool
    dq_reduce: str = "atomic"
    qo_load: str = "pointer"


_last_launch: LaunchInfo | None = None
_tables_cache: dict[tuple[str, ScheduleSpec, torch.device], dict[str, torch.Tensor]] = {}
_pending_lock = threading.Lock()
# launch number -> (pinned host copy of the error flag, event after the copy, error message)
_pending: dict[int, tuple[torch.Tensor, torch.cuda.Event, str]] = {}
_launches = 0


def last_launch_info() -> LaunchInfo | None:
    """The schedule, tiles and worker count of the most recent backward launch."""
    return _last_launch


def device_tables(schedule: Schedule, device: torch.device) -> dict[str, torch.Tensor]:
    """The schedule's int32 tables on ``device``, uploaded once per (schedule, spec, device)."""
    key = (schedule.name, schedule.spec, device)
    tables = _tables_cache.get(key)
    if tables is None:
        names = ("chain_start", "step_q_head", "step_q_tile", "step_rank", "order", "worker_start")
        tables = {
            name: torch.from_numpy(getattr(schedule, name).copy()).to(device) for name in names
        }
        if len(_tables_cache) >= 64:
            _tables_cache.pop(next(iter(_tables_cache)))
        _tables_cache[key] = tables
    return tables


def check_errors(synchronize: bool = True) -> None:
    """Raise RuntimeError if an earlier backward gave up waiting for its dQ order.

    Backward launches do not synchronise with the host: their error flag is copied back
    asynchronously and looked at by the next dash-attn backward. ``synchronize=True`` waits for
    every launch so far, so the answer is final.
    """
    with _pending_lock:
        pending = list(_pending.items())
    failure = None
    for launch, (flag, event, description) in pending:
        if synchronize:
            event.synchronize()
        elif not event.query():
            continue
        with _pending_lock:
            _pending.pop(launch, None)
        if failure is None and int(flag.item()) != 0:
            failure = description
    if failure is not None:
        raise RuntimeError(failure)


def _record_status(status: torch.Tensor, description: str, sync: bool) -> None:
    global _launches
    if status.device.type != "cuda":
        if int(status[1].item()) != 0:
            raise RuntimeError(description)
        return
    if torch.cuda.is_current_stream_capturing():
        return
    host = torch.empty((), dtype=torch.int32, pin_memory=True)
    host.copy_(status[1], non_blocking=True)
    event = torch.cuda.Event()
    event.record()
    with _pending_lock:
        _launches += 1
        _pending[_launches] = (host, event, description)
    check_errors(synchronize=sync)


def attn_bwd(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    *,
    causal: bool,
    softmax_scale: float,
    deterministic: bool,
    schedule: str,
    sm_margin: int,
    schedule_override: Schedule | None = None,
    sync_check: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Attention backward through the table-driven persistent kernel.

    ``schedule_override`` runs a hand-made Schedule (tests use it to feed a broken table).
    ``sync_check`` waits for the kernel and raises at once on a timed-out wait (default: only
    under the interpreter or with DASH_ATTN_SYNC_CHECK=1).
    """
    global _last_launch
    check_errors(synchronize=False)
    batch, seqlen_q, heads, headdim = q.shape
    _, seqlen_k, kv_heads, _ = k.shape
    dq_reduce = dq_reduce_mode(q.device)
    tiles = backward_tiles(headdim, dq_reduce)
    workers = sm_count(q.device) - sm_margin
    if workers < 1:
        raise ValueError(
            f"sm_margin ({sm_margin}) leaves no multiprocessor of the {sm_count(q.device)} on "
            f"{q.device} for the backward"
        )
    if schedule_override is not None:
        sched = schedule_override
    else:
        spec = schedule_spec(batch, seqlen_q, seqlen_k, heads, kv_heads, headdim, causal, workers)
        sched = make_schedule(schedule, spec)
    spec = sched.spec
    dynamic = sched.dispatch is Dispatch.DYNAMIC
    if dynamic:
        grid = min(spec.workers, spec.num_chains)
    else:
        # Static lists are dealt round-robin, so the busy workers are the first ones.
        grid = int((sched.worker_start[1:] > sched.worker_start[:-1]).sum())
    interpret = is_interpreter()
    timed = not interpret
    timeout = INTERPRETER_MAX_POLLS if interpret else int(DEFAULT_TIMEOUT_S * 1e9)
    tables = device_tables(sched, q.device)
    # TMA needs 16-byte aligned tensors; odd views fall back to pointer loads (same values).
    qo_tma = qo_load_mode(q.device) == "tma" and tma_loadable(q) and tma_loadable(dout)

    lse2, delta = attn_bwd_preprocess(out, dout, lse, spec.q_tiles * tiles.block_m)
    dq_acc, dk, dv, status = attn_bwd_main(
        q, k, v, dout, lse2, delta, tables,
        tiles=tiles, num_workers=grid,
        q_tiles=spec.q_tiles, kv_tiles=spec.kv_tiles, num_chains=spec.num_chains,
        causal=causal, softmax_scale=softmax_scale,
        deterministic=deterministic, dynamic=dynamic,
        timed_wait=timed, timeout=timeout,
        cooperative=(not dynamic) and q.device.type == "cuda",
        dq_tma=dq_reduce == "tma",
        qo_tma=qo_tma,
    )  # fmt: skip
    dq = (dq_acc * softmax_scale).to(q.dtype)
    _last_launch = LaunchInfo(
        schedule=sched.name,
        dispatch=sched.dispatch.value,
        spec=spec,
        tiles=tiles,
        workers=grid,
        deterministic=deterministic,
        dq_reduce=dq_reduce,
        qo_load="tma" if qo_tma else "pointer",
    )
    if deterministic:
        description = (
            f"dash-attn backward: a dQ wait timed out (schedule {sched.name!r}, "
            f"{sched.dispatch.value} dispatch on {grid} workers, q {tuple(q.shape)}, "
            f"k {tuple(k.shape)}, causal={causal}); its gradients were poisoned with NaN. "
            "Likely causes: SMs held by a concurrent kernel (raise sm_margin) or a broken schedule."
        )
        if sync_check is None:
            sync_check = interpret or os.environ.get("DASH_ATTN_SYNC_CHECK", "0") == "1"
        _record_status(status, description, sync_check)
    return dq, dk, dv
