"""Helpers shared by the test suites (CPU, interpreter and GPU) and the benchmarks."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
import torch

__all__ = [
    "BandMask",
    "assert_close_to_ref",
    "band_plan",
    "bitwise_equal",
    "make_qkv",
    "max_abs_diff",
    "repeat_equal",
]


def make_qkv(
    batch: int,
    seqlen_q: int,
    seqlen_k: int,
    heads: int,
    kv_heads: int,
    headdim: int,
    dtype: torch.dtype,
    device: torch.device | str,
    seed: int,
    requires_grad: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Fresh standard-normal q, k, v in the flash-attn layout.

    Values are drawn on the CPU from a generator seeded with ``seed`` (in float64 for float64,
    else float32, then rounded to ``dtype``), so the same seed gives the same inputs on every
    device and no call disturbs the global RNG.

    Return:
        q: (batch, seqlen_q, heads, headdim); k, v: (batch, seqlen_k, kv_heads, headdim); leaf
        tensors on ``device`` with ``requires_grad`` as asked.
    """
    gen = torch.Generator(device="cpu").manual_seed(seed)
    draw_dtype = torch.float64 if dtype == torch.float64 else torch.float32

    def draw(*shape: int) -> torch.Tensor:
        x = torch.randn(shape, generator=gen, dtype=draw_dtype)
        return x.to(device=device, dtype=dtype).requires_grad_(requires_grad)

    q = draw(batch, seqlen_q, heads, headdim)
    k = draw(batch, seqlen_k, kv_heads, headdim)
    v = draw(batch, seqlen_k, kv_heads, headdim)
    return q, k, v


def max_abs_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| in float64; equal entries (infinities included) count as 0, NaN as inf."""
    a64, b64 = a.detach().double(), b.detach().double()
    diff = torch.where(a64 == b64, 0.0, (a64 - b64).abs())
    diff = torch.nan_to_num(diff, nan=float("inf"))
    return diff.max().item() if diff.numel() else 0.0


def assert_close_to_ref(
    name: str,
    got: torch.Tensor,
    ref_fp32: torch.Tensor,
    ref_same_dtype: torch.Tensor,
    *,
    factor: float = 2.0,
    atol: float,
) -> None:
    """The flash-attn error rule: a kernel may be off the fp32 reference by at most ``factor`` times
    what a PyTorch computation in the kernel's own dtype is off, plus ``atol``.

    ``max |got - ref_fp32| <= factor * max |ref_same_dtype - ref_fp32| + atol``

    Arguments:
        name: what is compared (``"dq"``, ``"lse"``, ...), for the message.
        got: the kernel's result.
        ref_fp32: the upcast reference (``attention_ref(..., upcast=True)``).
        ref_same_dtype: the reference computed in the input dtype (``upcast=False``).
    Raises:
        AssertionError: shapes differ or the rule fails; the message shows both errors.
    """
    if got.shape != ref_fp32.shape or ref_same_dtype.shape != ref_fp32.shape:
        raise AssertionError(
            f"{name}: shapes differ: got {tuple(got.shape)}, ref_fp32 {tuple(ref_fp32.shape)}, "
            f"ref_same_dtype {tuple(ref_same_dtype.shape)}"
        )
    err = max_abs_diff(got, ref_fp32)
    base = max_abs_diff(ref_same_dtype, ref_fp32)
    bound = factor * base + atol
    if not err <= bound:
        raise AssertionError(
            f"{name}: max |got - ref| = {err:.3e} exceeds {factor} * max |same_dtype - ref| "
            f"({base:.3e}) + atol ({atol:.1e}) = {bound:.3e}"
        )


_SAME_SIZE_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def grad_step(
    fn: Callable[..., torch.Tensor], leaves: Sequence[torch.Tensor], dout: torch.Tensor
) -> Callable[[], tuple[torch.Tensor, ...]]:
    """One step of ``fn``: ``(out, *grads)`` with ``out = fn(*leaves)`` and the gradients of the
    leaves for ``dout`` (returned, not accumulated into ``.grad``: every call does the same
    work, eagerly or replayed from a graph)."""

    def step() -> tuple[torch.Tensor, ...]:
        out = fn(*leaves)
        return (out, *torch.autograd.grad(out, tuple(leaves), dout))

    return step


def capture_grad_step(
    fn: Callable[..., torch.Tensor], leaves: Sequence[torch.Tensor], dout: torch.Tensor
) -> tuple[Callable[[], None], tuple[torch.Tensor, ...]]:
    """``grad_step(fn, leaves, dout)`` captured in a CUDA graph as torch documents it (two
    warm-up steps on a side stream first): ``(replay, outputs)``, where ``outputs`` are the
    graph's ``(out, *grads)`` that every replay rewrites, and ``replay`` keeps the graph, the
    leaves and dout alive (a replay reads them where they were at capture). ``leaves`` must
    not have been used by an eager backward: autograd keeps the stream of a leaf's first
    backward, and a capture that has to wait for the default stream fails."""
    step = grad_step(fn, leaves, dout)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = step()
    keep = (graph, tuple(leaves), dout)
    return (lambda: keep[0].replay()), outputs


def hopper_gap(q: torch.Tensor, k: torch.Tensor, causal: bool) -> str | None:
    """Why the hopper backend cannot run attention of q and k with this mask here, or None."""
    from .backends import hopper_unsupported
    from .device import device_info
    from .dispatch import problem_of
    from .schedule import Mask

    return hopper_unsupported(problem_of(q, k, Mask(causal=causal)), device_info(q.device))


def broken_ranks(plan):
    """``plan`` with every dQ rank + 1 and its schedule named ``broken``: no dQ tile's first
    turn ever comes, so a deterministic backward of it times out (the tests of the bounded
    wait: an error instead of a hang)."""
    import dataclasses

    schedule = dataclasses.replace(
        plan.schedule, name="broken", step_rank=plan.schedule.step_rank + 1
    )
    return dataclasses.replace(plan, schedule=schedule)


def bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """``torch.equal`` on the raw bits: NaN equals the same NaN, 0.0 differs from -0.0."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.is_floating_point():
        bits = _SAME_SIZE_INT[a.element_size()]
        return torch.equal(a.view(bits), b.view(bits))
    return torch.equal(a, b)


def repeat_equal(
    fn: Callable[[], torch.Tensor | Sequence[torch.Tensor]], n: int
) -> tuple[bool, float]:
    """Run ``fn`` ``n`` times; report whether every run is bitwise equal to the first.

    Equality is ``torch.equal`` on the raw bits (``bitwise_equal``), so it is strict even where
    ``==`` is lenient (signed zeros) or useless (NaN).

    ``fn`` returns a tensor or a sequence of tensors (e.g. ``(dq, dk, dv)``).

    Return:
        (all_equal, max_diff): ``bitwise_equal`` held for every output of every run, and the
        largest |difference| seen against the first run (0.0 when all equal, inf when a shape
        changed).
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")

    def as_tuple(result: torch.Tensor | Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        if isinstance(result, torch.Tensor):
            return (result.detach().clone(),)
        return tuple(t.detach().clone() for t in result)

    first = as_tuple(fn())
    all_equal, worst = True, 0.0
    for _ in range(n - 1):
        again = as_tuple(fn())
        if len(again) != len(first):
            raise ValueError(f"fn returned {len(again)} tensors, first run returned {len(first)}")
        for a, b in zip(first, again, strict=True):
            if not bitwise_equal(a, b):
                all_equal = False
                same_shape = a.shape == b.shape
                worst = max(worst, max_abs_diff(a, b) if same_shape else float("inf"))
    return all_equal, worst


# --- backward tables from the row rule alone (kernel tests independent of the schedule engine) ---


@dataclass(frozen=True)
class BandMask:
    """What the kernels read of a plan's mask: ``causal`` and ``window`` (left, right; -1 =
    unbounded), flash-attn semantics."""

    causal: bool = False
    window: tuple[int, int] = (-1, -1)


@dataclass(frozen=True)
class _BandSpec:
    """What the launchers read of a ScheduleSpec (hashable: the device-table cache keys on it)."""

    seqlens: tuple[tuple[int, int], ...]
    q_heads: int
    kv_heads: int
    q_tiles: int
    kv_tiles: int
    mask: BandMask
    block_m: int

    @property
    def num_chains(self) -> int:
        return len(self.seqlens) * self.kv_heads * self.kv_tiles


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _tiles_meet(seqlen_q: int, seqlen_k: int, mask: BandMask, block_m: int, block_n: int):
    """[q_tiles_b, kv_tiles_b] bool: Q tile i and KV tile j share a visible (row, key) pair."""
    from .reference.attention import visible_mask

    q_tiles, kv_tiles = _cdiv(seqlen_q, block_m), _cdiv(seqlen_k, block_n)
    visible = visible_mask(seqlen_q, seqlen_k, causal=mask.causal, window_size=mask.window)
    keep = np.ones((seqlen_q, seqlen_k), bool) if visible is None else visible.numpy()
    meets = np.zeros((q_tiles, kv_tiles), bool)
    for i, j in itertools.product(range(q_tiles), range(kv_tiles)):
        meets[i, j] = keep[i * block_m : (i + 1) * block_m, j * block_n : (j + 1) * block_n].any()
    return meets


def band_plan(
    seqlens: Sequence[tuple[int, int]],
    heads: int,
    kv_heads: int,
    headdim: int,
    mask: BandMask,
    *,
    device,
    descending: bool = False,
    static_workers: int = 0,
    dq_reduce: str = "atomic",
    deterministic: bool = True,
    timeout_s: float = 10.0,
) -> SimpleNamespace:
    """A stand-in for a ``BackwardPlan`` whose tables are built from the row rule alone, so that
    kernel tests pin the kernel to the varlen/window table contract rather than to one
    generator's output (and run before or without the schedule engine's varlen support).

    The tables follow the contract: on the padded tile grid, every KV tile of a sequence is a
    chain listed once in ``order`` (also with no step: the kernel must write dK = dV = 0);
    its steps are the Q tiles it meets, every q head of its group; a contribution's rank is its
    position among the KV tiles that actually contribute to that dQ tile, counted in ascending
    (or ``descending``) KV order, so every rank depends on the sequence's own geometry only.

    Dispatch: dynamic tickets in that KV order; ``static_workers`` > 0 deals whole (sequence,
    kv head) groups round-robin to that many static workers (every wait is then on the worker's
    own earlier chains, so it also completes in the interpreter's program order).

    Arguments:
        seqlens: (seqlen_q, seqlen_k) per sequence (a padded batch: all equal).
        mask: BandMask(causal, window).
        device: a ``plan.DeviceInfo`` (``INTERPRETER``, or the GPU's).
        dq_reduce: "atomic" or "tma" (Hopper).
    """
    from .backends.triton.tiles import backward_tiles
    from .schedule import Dispatch

    tiles = backward_tiles(headdim, dq_reduce)
    bm, bn = tiles.block_m, tiles.block_n
    group = heads // kv_heads
    q_tiles = max([_cdiv(sq, bm) for sq, _ in seqlens] + [1])
    kv_tiles = max([_cdiv(sk, bn) for _, sk in seqlens] + [1])
    spec = _BandSpec(tuple(map(tuple, seqlens)), heads, kv_heads, q_tiles, kv_tiles, mask, bm)
    steps: dict[int, list[tuple[int, int, int]]] = {}
    groups: list[list[int]] = []
    for b, (sq, sk) in enumerate(seqlens):
        meets = _tiles_meet(sq, sk, mask, bm, bn)
        kv_order = list(range(meets.shape[1]))
        if descending:
            kv_order.reverse()
        for kvh in range(kv_heads):
            chains = []
            for j in kv_order:
                chain = (b * kv_heads + kvh) * kv_tiles + j
                before = meets[:, j + 1 :] if descending else meets[:, :j]
                steps[chain] = [
                    (h, int(i), int(before[i].sum()))
                    for h in range(kvh * group, (kvh + 1) * group)
                    for i in np.flatnonzero(meets[:, j])
                ]
                chains.append(chain)
            groups.append(chains)
    chain_start, flat = [0], []
    for chain in range(spec.num_chains):
        flat += steps.get(chain, [])
        chain_start.append(len(flat))
    if static_workers:
        lists = [[c for g in groups[w::static_workers] for c in g] for w in range(static_workers)]
        order = [c for chains in lists for c in chains]
        worker_start = np.cumsum([0] + [len(chains) for chains in lists])
        dispatch = Dispatch.STATIC
    else:
        order = [c for g in groups for c in g]
        worker_start = [0, len(order)]
        dispatch = Dispatch.DYNAMIC
    columns = np.array(flat, dtype=np.int32).reshape(-1, 3)
    name = f"band-{'descending' if descending else 'ascending'}-{dispatch.value}"
    schedule = SimpleNamespace(
        name=name,
        spec=spec,
        dispatch=dispatch,
        chain_start=np.array(chain_start, np.int32),
        step_q_head=columns[:, 0].copy(),
        step_q_tile=columns[:, 1].copy(),
        step_rank=columns[:, 2].copy(),
        order=np.array(order, np.int32),
        worker_start=np.array(worker_start, np.int32),
    )
    return SimpleNamespace(
        spec=spec,
        schedule=schedule,
        schedule_name=name,
        tiles=tiles,
        device=device,
        backend="triton",
        deterministic=deterministic,
        dq_reduce=dq_reduce,
        timeout_s=timeout_s,
        dispatch=dispatch,
        gqa_split=False,  # one chain per kv head, walking its group's q heads
        grid=static_workers or min(device.sm_count, max(len(order), 1)),
        describe=lambda: f"test tables {name} (dash_attn.testing.band_plan)",
    )
