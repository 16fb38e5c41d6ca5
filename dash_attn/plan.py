"""Shape to launch: one frozen ``BackwardPlan`` decides everything that sets the backward's bits.

Pure Python, like the schedule engine (no torch, no triton): the custom op, the CLI's analysis,
the benchmark model and the tuning tools all build plans through :func:`make_backward_plan`, so
they talk about the same tiles, schedule tables and worker count as the kernel that runs.

What decides the bits of dq (the summation order of every dQ tile) is the schedule's tables, and
they are a function of the problem, the schedule name, the tiles and the worker count. All four
are explicit inputs here and fields of the plan; nothing is read from the environment except the
documented wait bound (``DASH_ATTN_TIMEOUT_S``, read once at import), which changes no bits.

Worked example: 8 query heads sharing 2 KV heads, 1000 queries and keys, causal, on an H200::

    >>> problem = Problem(batch=2, seqlen_q=1000, seqlen_k=1000, heads=8, kv_heads=2,
    ...                   headdim=128, mask=CAUSAL)
    >>> plan = make_backward_plan(problem, device=H200, backend="triton")
    >>> plan.schedule.name, plan.tiles.label, plan.spec.q_tiles, plan.spec.kv_tiles
    ('symmetric_shift', '64x128w8s3a', 16, 8)
    >>> plan.gqa_split, plan.spec.kv_heads  # one chain per q head: the schedule of 8 kv heads
    (True, 8)
    >>> plan.grid  # static dispatch: 2 batches x 8 q heads x 4 pairs of KV tiles, one worker each
    64
    >>> make_backward_plan(problem, device=H200, backend="triton", gqa_split=False).grid
    16

(``auto`` is ``symmetric_shift`` for every causal shape: with ``invariant=True``, the default, it
depends on the mask only. ``invariant=False`` lets the DAG model pick with the worker count.
With ``gqa_split=False`` a chain walks the 4 q heads of its kv head, 2 x 2 x 4 pairs of chains.)
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, field
from functools import lru_cache

from .backends import BACKEND_NAMES, choose_backend
from .backends.hopper import POLLED_CAST_HEADDIMS, POLLED_CAST_SMS
from .backends.hopper import nondet_auto_schedule as hopper_nondet_auto_schedule
from .backends.hopper import nondet_counts_adds as hopper_nondet_counts_adds
from .backends.triton.tiles import BackwardTiles
from .schedule import CAUSAL, FULL, Dispatch, Mask, Schedule, ScheduleSpec, make_schedule
from .schedule.generators import auto_schedule_name
from .schedule.invariant import lanes_per_group

__all__ = [
    "CAUSAL",
    "DQ_REDUCE_MODES",
    "FULL",
    "H200",
    "INTERPRETER",
    "BackwardPlan",
    "DeviceInfo",
    "Problem",
    "analysis_device",
    "backward_spec",
    "first_blocked_program",
    "kernel_sums_dkv",
    "make_backward_plan",
    "resolve_gqa_split",
]

# A correct schedule waits microseconds; the bound only turns a deadlock (SMs taken by a
# concurrent kernel, a broken table) into an error instead of a frozen GPU. Changes no bits.
DEFAULT_TIMEOUT_S = float(os.environ.get("DASH_ATTN_TIMEOUT_S", "10"))
DQ_REDUCE_MODES = ("auto", "atomic", "tma")
DTYPES = ("float16", "bfloat16")
# What ``auto`` runs in Triton's interpreter when its static schedule would block there.
INTERPRETER_AUTO_SCHEDULE = "descending"
# What ``auto`` runs when its order-invariant shift schedule needs more workers than there are.
FEW_WORKERS_AUTO_SCHEDULE = "descending"


@dataclass(frozen=True)
class Problem:
    """The row-level shape of one attention call (what ``dash_attn_func`` validated).

    Attributes:
        batch, seqlen_q, seqlen_k, heads, kv_heads, headdim: as flash-attn's
            ``(batch, seqlen, nheads, headdim)`` layout; ``heads % kv_heads == 0``.
        mask: ``FULL``, ``CAUSAL`` (bottom-right aligned) or a sliding window
            (``Mask(causal, window_left, window_right)``, flash-attn's ``window_size``).
        dtype: ``"bfloat16"`` or ``"float16"`` (torch's names without the prefix).
        tma_aligned: the tensors' base pointers and outer strides are 16-byte aligned, as
            the hopper kernels' TMA loads need (contiguous tensors always are).
        seqlens: packed variable-length sequences (``dash_attn_varlen_func``): every sequence's
            ``(seqlen_q, seqlen_k)``. Then ``batch`` is their number and ``seqlen_q``/``seqlen_k``
            are the longest. None for the padded ``(batch, seqlen, ...)`` layout.
    """

    batch: int
    seqlen_q: int
    seqlen_k: int
    heads: int
    kv_heads: int
    headdim: int
    mask: Mask = FULL
    dtype: str = "bfloat16"
    tma_aligned: bool = True
    seqlens: tuple[tuple[int, int], ...] | None = None

    def __post_init__(self) -> None:
        for name in ("batch", "seqlen_q", "seqlen_k", "heads", "kv_heads", "headdim"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"Problem.{name} must be an int >= 1, got {value!r}")
        if self.heads % self.kv_heads:
            raise ValueError(
                f"Problem.heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})"
            )
        if not isinstance(self.mask, Mask):
            raise TypeError(f"Problem.mask must be a Mask, got {type(self.mask).__name__}")
        if self.dtype not in DTYPES:
            raise ValueError(f"Problem.dtype must be one of {list(DTYPES)}, got {self.dtype!r}")
        if self.seqlens is not None:
            self._check_seqlens()

    def _check_seqlens(self) -> None:
        seqlens = self.seqlens
        if not isinstance(seqlens, tuple) or len(seqlens) != self.batch:
            raise ValueError(
                f"Problem.seqlens must be a tuple of batch ({self.batch}) (seqlen_q, seqlen_k) "
                f"pairs, got {seqlens!r}"
            )
        for pair in seqlens:
            if not (
                isinstance(pair, tuple)
                and len(pair) == 2
                and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in pair)
            ):
                raise ValueError(
                    f"Problem.seqlens entries must be (int >= 0, int >= 0), got {pair!r}"
                )
        # (At least 1, as Problem.packed makes them: every q or every k sequence may be empty.)
        longest = (max(1, *(q for q, _ in seqlens)), max(1, *(k for _, k in seqlens)))
        if longest != (self.seqlen_q, self.seqlen_k):
            raise ValueError(
                f"Problem.seqlen_q/seqlen_k must be the longest of seqlens {longest}, got "
                f"({self.seqlen_q}, {self.seqlen_k})"
            )

    @classmethod
    def packed(
        cls,
        seqlens: tuple[tuple[int, int], ...],
        heads: int,
        kv_heads: int,
        headdim: int,
        mask: Mask = FULL,
        dtype: str = "bfloat16",
        tma_aligned: bool = True,
    ) -> Problem:
        """The Problem of packed sequences (``dash_attn_varlen_func``): the batch and the
        longest lengths follow from ``seqlens``.

        >>> Problem.packed(((100, 100), (300, 300)), heads=4, kv_heads=4, headdim=64).seqlen_q
        300
        """
        seqlens = tuple((int(q), int(k)) for q, k in seqlens)
        if not seqlens:
            raise ValueError("Problem.packed needs at least one sequence")
        return cls(
            batch=len(seqlens),
            seqlen_q=max(1, max(q for q, _ in seqlens)),
            seqlen_k=max(1, max(k for _, k in seqlens)),
            heads=heads,
            kv_heads=kv_heads,
            headdim=headdim,
            mask=mask,
            dtype=dtype,
            tma_aligned=tma_aligned,
            seqlens=seqlens,
        )

    @property
    def is_varlen(self) -> bool:
        return self.seqlens is not None

    def sequence_lengths(self) -> tuple[tuple[int, int], ...]:
        """Every sequence's ``(seqlen_q, seqlen_k)`` (``batch`` equal pairs when not packed)."""
        if self.seqlens is not None:
            return self.seqlens
        return ((self.seqlen_q, self.seqlen_k),) * self.batch

    def flops(self, mode: str = "bwd") -> float:
        """Matmul FLOPs of the forward (``"fwd"``) or backward (``"bwd"``, 2.5x the forward).

        Full and causal count ``seqlen_q * seqlen_k`` pairs per sequence, halved for causal as
        the flash-attn benchmarks count them; a sliding window counts the pairs it keeps.
        """
        pairs = sum(_attended_pairs(sq, sk, self.mask) for sq, sk in self.sequence_lengths())
        fwd = 4.0 * self.heads * self.headdim * pairs
        return fwd * 2.5 if mode == "bwd" else fwd


def _attended_pairs(seqlen_q: int, seqlen_k: int, mask: Mask) -> float:
    """(query, key) pairs one head of one sequence computes, as the benchmarks count them."""
    if mask.kind != "local":
        return seqlen_q * seqlen_k / (2 if mask.causal else 1)
    left, right = mask.window
    shift = seqlen_k - seqlen_q
    rows = range(seqlen_q)
    count = 0
    for m in rows:
        lo = 0 if left < 0 else max(0, m + shift - left)
        hi = seqlen_k - 1 if right < 0 else min(seqlen_k - 1, m + shift + right)
        count += max(0, hi - lo + 1)
    return float(count)


@dataclass(frozen=True)
class DeviceInfo:
    """What a plan needs to know about the GPU it runs on.

    Attributes:
        sm_count: multiprocessors (the persistent grid's upper bound).
        capability: ``(major, minor)``; ``None`` for Triton's CPU interpreter.
        name: for reports only.
    """

    sm_count: int
    capability: tuple[int, int] | None
    name: str = ""

    @property
    def is_interpreter(self) -> bool:
        return self.capability is None

    @property
    def has_tma(self) -> bool:
        """Hopper or newer, run by compiled kernels (bulk tensor copies and reductions)."""
        return self.capability is not None and self.capability >= (9, 0)


# The machines of the paper and of this repo's benchmarks (the CLI's default), and the
# interpreter, which runs programs one after another: a few workers keep the persistent loop honest.
H200 = DeviceInfo(sm_count=132, capability=(9, 0), name="NVIDIA H200")
INTERPRETER = DeviceInfo(sm_count=4, capability=None, name="Triton interpreter")


@dataclass(frozen=True)
class BackwardPlan:
    """Everything the backward launch needs, decided once per (problem, options, device).

    Attributes:
        problem: the row-level shape.
        device: the GPU it was made for.
        schedule: the schedule's tables (``schedule.spec`` is the tile-level problem).
        tiles: block sizes and pipeline options of the kernel (block sizes set the tiles, and so
            the summation order; the other options give the same bits).
        backend: ``"triton"`` or ``"hopper"``; ``backend_reason`` says why.
        deterministic: fixed-order dQ sums (else arrival order, same tables).
        dq_reduce: ``"tma"`` (bulk reductions, Hopper) or ``"atomic"``: same bits either way.
        grid: programs launched (static dispatch: the busy workers; dynamic: min(workers, chains)).
        timeout_s: bound of every dQ wait (and, with ``dkv_sum``, dK/dV wait).
        gqa_split: grouped-query attention run as one chain per (q head, KV tile) instead of
            per (kv head, KV tile): the schedule is the one of ``heads`` kv heads and every
            chain reads its q head's K/V (``h // group``). ``group`` times more chains fill the
            GPU where a few kv heads leave SMs idle. The ``group`` chains of one (kv head, KV
            tile) are added in q-head order: by the deterministic hopper kernel itself, each
            chain adding its fp32 dK/dV into an fp32 accumulator after the previous one
            (``spec.dkv_sum_group``, FA4-det's memory: dK/dV of the kv heads in fp32); else
            each chain writes a 16-bit partial and a pass after the kernel sums each kv head's
            ``group`` partials in fp32 (``group`` times dK/dV's memory).
        cast_sms: SMs the main kernel leaves free to the dQ cast, which then runs beside it
            instead of after it (0: after it). A deterministic hopper plan (or a
            non-deterministic one whose kernel counts its dQ adds,
            ``hopper.nondet_counts_adds``) with static dispatch and order-invariant tables at
            a head dim of ``hopper.POLLED_CAST_HEADDIMS``, made
            with ``sm_margin=0``, runs on ``hopper.POLLED_CAST_SMS`` workers fewer where its
            busiest worker gets no more steps there (or its grid already leaves that many
            idle): the same bits (the tables do not depend on the worker count), the same
            length of the main kernel, and SMs free for the cast. (On the CuTe host path, the
            default; with ``DASH_ATTN_CUTE_PRE_POST=0`` the Triton cast runs after the kernel
            on the same tables.)
    """

    problem: Problem
    device: DeviceInfo
    schedule: Schedule = field(compare=False)
    tiles: BackwardTiles
    backend: str
    backend_reason: str
    deterministic: bool
    dq_reduce: str
    grid: int
    timeout_s: float
    gqa_split: bool = False
    cast_sms: int = 0

    def __post_init__(self) -> None:
        # A plan made by hand (experiments, tests) gets the checks make_backward_plan's own
        # plans pass by construction: the polled cast waits on per-tile counts of static
        # deterministic tables and on SMs the grid leaves free.
        if self.cast_sms < 0:
            raise ValueError(f"cast_sms must be >= 0, got {self.cast_sms}")
        if self.cast_sms == 0:
            return
        why = None
        p = self.problem
        if self.backend != "hopper":
            why = f"backend {self.backend!r} runs its cast after the kernel"
        elif not (
            self.deterministic or hopper_nondet_counts_adds(p.headdim, p.mask.causal, p.seqlen_k)
        ):
            why = "the plan is non-deterministic and its kernel does not count its dQ adds"
        elif (tables := _why_tables_cannot_poll(self.schedule)) is not None:
            why = tables
        elif self.grid + self.cast_sms > self.device.sm_count:
            why = (
                f"grid {self.grid} + {self.cast_sms} cast SMs exceed the device's "
                f"{self.device.sm_count} SMs"
            )
        if why is not None:
            raise ValueError(f"cast_sms={self.cast_sms} needs a polled dQ cast, but {why}")

    @property
    def spec(self) -> ScheduleSpec:
        return self.schedule.spec

    @property
    def dkv_sum(self) -> bool:
        """The kernel adds a GQA group's dK/dV in q-head order itself (``gqa_split``)."""
        return self.spec.dkv_sum_group > 1

    @property
    def schedule_name(self) -> str:
        return self.schedule.name

    @property
    def dispatch(self) -> Dispatch:
        return self.schedule.dispatch

    @property
    def workers(self) -> int:
        """SMs the schedule was made for (``sm_count - sm_margin``)."""
        return self.spec.workers

    @property
    def invariant(self) -> bool:
        """Summation orders depend on each sequence alone (not on batch, heads or workers)."""
        return self.spec.invariant

    def describe(self) -> str:
        """One line for logs and error messages."""
        p = self.problem
        mode = "det" if self.deterministic else "non-det"
        order = "invariant" if self.invariant else "worker-dependent"
        shape = f"varlen {p.batch} seqs max" if p.is_varlen else f"b{p.batch}"
        split = ""
        if self.gqa_split:
            split = ", dk/dv summed in the kernel" if self.dkv_sum else ", dk/dv per q head"
        if self.cast_sms:
            split += f", dq cast beside it on {self.cast_sms} SMs"
        return (
            f"{self.backend} backward, schedule {self.schedule.name!r} ({self.dispatch.value}, "
            f"{self.grid} programs of {self.workers} workers, {order} order), tiles "
            f"{self.tiles.label}, dq {self.dq_reduce}{split}, {mode}; {shape} sq{p.seqlen_q} "
            f"sk{p.seqlen_k} h{p.heads}/{p.kv_heads} d{p.headdim} {p.mask.name} {p.dtype}"
        )


def analysis_device(workers: int) -> DeviceInfo:
    """A Hopper GPU with ``workers`` SMs: the device of the CLI's and the model's analyses."""
    return DeviceInfo(sm_count=workers, capability=(9, 0), name=f"{workers}-SM Hopper")


def backward_spec(
    problem: Problem,
    tiles: BackwardTiles,
    workers: int,
    invariant: bool = True,
    gqa_split: bool = False,
    dkv_sum: bool = False,
) -> ScheduleSpec:
    """The tile-level problem a backward with ``tiles`` runs on ``workers`` SMs; with
    ``gqa_split`` that of one kv head per q head (``BackwardPlan.gqa_split``), whose dK/dV the
    kernel adds per group with ``dkv_sum`` (``ScheduleSpec.dkv_sum_group``)."""
    group = problem.heads // problem.kv_heads
    if dkv_sum and not (gqa_split and group > 1):
        raise ValueError("dkv_sum adds the dK/dV of a GQA split: it needs gqa_split and GQA")
    if gqa_split:
        problem = dataclasses.replace(problem, kv_heads=problem.heads)
    if dkv_sum:
        spec = backward_spec(problem, tiles, workers, invariant, gqa_split=False)
        return dataclasses.replace(spec, dkv_sum_group=group)
    if problem.seqlens is not None:
        return ScheduleSpec.from_seqlens(
            seqlens=problem.seqlens,
            q_heads=problem.heads,
            kv_heads=problem.kv_heads,
            block_m=tiles.block_m,
            block_n=tiles.block_n,
            mask=problem.mask,
            workers=workers,
            invariant=invariant,
        )
    spec = ScheduleSpec.from_shape(
        batch=problem.batch,
        seqlen_q=problem.seqlen_q,
        seqlen_k=problem.seqlen_k,
        q_heads=problem.heads,
        kv_heads=problem.kv_heads,
        block_m=tiles.block_m,
        block_n=tiles.block_n,
        mask=problem.mask,
        workers=workers,
    )
    return spec if spec.invariant == invariant else dataclasses.replace(spec, invariant=invariant)


def resolve_gqa_split(heads: int, kv_heads: int, gqa_split: bool | None = None) -> bool:
    """Whether a backward runs one chain per q head (``BackwardPlan.gqa_split``): ``gqa_split``
    (None: yes) wherever there is a group to split, ``heads > kv_heads``.

    >>> resolve_gqa_split(28, 4), resolve_gqa_split(28, 4, False), resolve_gqa_split(8, 8, True)
    (True, False, False)
    """
    if gqa_split is not None and not isinstance(gqa_split, bool):
        raise TypeError(f"gqa_split must be a bool or None, got {type(gqa_split).__name__}")
    return heads > kv_heads and gqa_split is not False


def kernel_sums_dkv(backend: str, deterministic: bool, gqa_split: bool) -> bool:
    """Whether the kernel adds a split GQA group's dK/dV itself (``BackwardPlan.dkv_sum``):
    the deterministic hopper kernel does; the non-deterministic one and the Triton kernels
    write per-q-head partials that a pass after the kernel adds.

    >>> kernel_sums_dkv("hopper", True, True), kernel_sums_dkv("triton", True, True)
    (True, False)
    """
    return gqa_split and deterministic and backend == "hopper"


def _auto_fallback(spec: ScheduleSpec) -> str:
    """``auto``, unless its order-invariant shift schedule needs more co-resident workers for
    one (sequence, kv head) than this launch has (at most ``WAVE``: only with an ``sm_margin``
    close to the SM count, or in the interpreter): then ``descending``, invariant too and
    without that need. The bits then differ from a launch with enough workers."""
    name = auto_schedule_name(spec)
    shift_family = spec.invariant and name in ("shift", "symmetric_shift", "shift_descending")
    if shift_family and lanes_per_group(name, spec.kv_tiles) > spec.workers:
        return FEW_WORKERS_AUTO_SCHEDULE
    return "auto"


def first_blocked_program(schedule: Schedule) -> int | None:
    """The first program of a deterministic backward by ``schedule`` that would wait forever if
    programs ran one after another in program-id order, as Triton's interpreter runs them; None
    if every wait is met (always so for dynamic dispatch: a chain only waits on chains with a
    smaller ticket, which ran earlier). Replays the tables: program ``p`` runs static worker
    ``p``'s chains; a step whose dQ tile has not yet received ``rank`` contributions blocks."""
    if schedule.dispatch is Dispatch.DYNAMIC:
        return None
    dq_tile, rank, start = schedule.step_dq_tile(), schedule.step_rank, schedule.chain_start
    added: dict[int, int] = {}
    for program in range(len(schedule.worker_start) - 1):
        for chain in schedule.worker_chains(program):
            for step in range(int(start[chain]), int(start[chain + 1])):
                tile = int(dq_tile[step])
                if added.get(tile, 0) != int(rank[step]):
                    return program
                added[tile] = added.get(tile, 0) + 1
    return None


def _grid(schedule: Schedule) -> int:
    spec = schedule.spec
    if schedule.dispatch is Dispatch.DYNAMIC:
        # Tickets run over ``order``, which lists the chains that exist (packed sequences leave
        # padding chains of the tile grid out of it).
        return max(1, min(spec.workers, len(schedule.order)))
    # Program w runs worker w's list: launch up to the last worker with work (a prefix in
    # practice: round-robin dealing and the invariant placement both fill idle workers first).
    start = schedule.worker_start
    busy = [w for w in range(spec.workers) if start[w + 1] > start[w]]
    return busy[-1] + 1 if busy else 1


@lru_cache(maxsize=256)
def make_backward_plan(
    problem: Problem,
    *,
    device: DeviceInfo,
    schedule: str = "auto",
    deterministic: bool = True,
    sm_margin: int = 0,
    backend: str = "auto",
    tiles: BackwardTiles | None = None,
    dq_reduce: str = "auto",
    timeout_s: float = DEFAULT_TIMEOUT_S,
    invariant: bool = True,
    gqa_split: bool | None = None,
) -> BackwardPlan:
    """The plan of one backward (cached: the same arguments give the same plan object).

    Args:
        problem: the shape, mask and dtype.
        device: the GPU (``DeviceInfo``; ``H200`` for analysis, ``INTERPRETER`` for the CPU).
        schedule: ``"auto"`` or a registered schedule name that fits the mask. ``"auto"`` is
            ``auto_schedule_name``'s, except for a non-deterministic hopper plan of a padded
            batch, which takes ``descending`` where ``hopper.NONDET_DESCENDING_MIN_SEQLEN_K``
            lists its head dim and key length (no order to keep; measured faster there).
        deterministic: fixed-order dQ sums.
        sm_margin: SMs left to concurrent kernels; the schedule is made for the rest.
        backend: ``"auto"``, ``"triton"`` or ``"hopper"``.
        tiles: other tiles than the backend's table (experiments: block sizes change the bits).
        dq_reduce: ``"auto"`` (``"tma"`` where the device has TMA), ``"tma"`` or ``"atomic"``.
        timeout_s: bound of every dQ (and in-kernel dK/dV) wait, in seconds.
        invariant: the summation order of every dQ tile (and the visiting order of every KV
            tile) depends only on its own sequence's lengths, the mask, the tiles and the
            schedule name: not on the batch, the other sequences of a pack, the heads, the
            worker count or ``sm_margin`` (the default). False lets the shift schedules follow
            the worker count (the order changes with sm_margin and the GPU's SM count).
        gqa_split: grouped-query attention with one chain per q head (``BackwardPlan.gqa_split``
            says what that does). None (the default) splits whenever ``heads > kv_heads``: a
            rule of the head counts alone, so it keeps the order-invariance contract. False
            keeps one chain per kv head (no partials: less memory, fewer chains); it changes
            dk/dv's bits. Without GQA there is nothing to split and it has no effect.

    Raises:
        ValueError: sm_margin leaves no SM, an option out of range, or a schedule that does not
            fit the mask; NotImplementedError: a head dim the backend has no tiles for, a
            backend asked for by name that cannot run here, or (Triton's interpreter) a
            deterministic static schedule that would block there, where ``auto`` takes
            ``INTERPRETER_AUTO_SCHEDULE`` instead.
    """
    if isinstance(sm_margin, bool) or not isinstance(sm_margin, int) or sm_margin < 0:
        raise ValueError(f"sm_margin must be an int >= 0, got {sm_margin!r}")
    workers = device.sm_count - sm_margin
    if workers < 1:
        raise ValueError(
            f"sm_margin ({sm_margin}) leaves no multiprocessor of the {device.sm_count} of "
            f"{device.name or 'this device'} for the backward"
        )
    if backend not in ("auto", *BACKEND_NAMES):
        raise ValueError(f"backend must be one of {['auto', *BACKEND_NAMES]}, got {backend!r}")
    if dq_reduce not in DQ_REDUCE_MODES:
        raise ValueError(f"dq_reduce must be one of {list(DQ_REDUCE_MODES)}, got {dq_reduce!r}")
    if dq_reduce == "auto":
        dq_reduce = "tma" if device.has_tma else "atomic"
    elif dq_reduce == "tma" and not device.has_tma:
        raise ValueError(
            f"dq_reduce='tma' needs a Hopper (sm_90) or newer GPU run by compiled kernels; "
            f"{device.name or 'this device'} has none: use 'atomic' or 'auto'"
        )
    if not (isinstance(timeout_s, (int, float)) and math.isfinite(timeout_s) and timeout_s > 0):
        raise ValueError(f"timeout_s must be a positive number of seconds, got {timeout_s!r}")

    chosen, reason, default_tiles = choose_backend(problem, device, backend, dq_reduce)
    if chosen == "hopper" and dq_reduce == "atomic":
        raise ValueError(
            "dq_reduce='atomic' is an option of the Triton backend; the hopper kernels add dQ "
            "by TMA bulk reductions: use backend='triton' with it, or dq_reduce='auto'"
        )
    tiles = default_tiles if tiles is None else tiles.for_dq_reduce(dq_reduce)
    if not isinstance(invariant, bool):
        raise TypeError(f"invariant must be a bool, got {type(invariant).__name__}")
    split = resolve_gqa_split(problem.heads, problem.kv_heads, gqa_split)
    dkv_sum = kernel_sums_dkv(chosen, deterministic, split)
    spec = backward_spec(problem, tiles, workers, invariant, split, dkv_sum)
    name = schedule
    if schedule == "auto":
        name = _auto_fallback(spec)
        if chosen == "hopper" and not deterministic and problem.seqlens is None:
            # Non-det sums follow arrival order: where the hopper kernels were measured faster
            # with dynamic tickets, auto takes them (``hopper.NONDET_DESCENDING_MIN_SEQLEN_K``).
            fast = hopper_nondet_auto_schedule(
                problem.headdim, problem.mask.causal, problem.seqlen_k
            )
            name = fast or name
    sched = make_schedule(name, spec)
    if device.is_interpreter and deterministic:
        # The interpreter runs programs one after another, so a static worker that waits for a
        # later worker's dQ contribution waits forever (the bounded wait then gives up). Dynamic
        # dispatch never does; ``auto`` takes one, a named static schedule is refused.
        blocked = first_blocked_program(sched)
        if blocked is not None and schedule == "auto":
            sched = make_schedule(INTERPRETER_AUTO_SCHEDULE, spec)
        elif blocked is not None:
            raise NotImplementedError(
                f"schedule {schedule!r} cannot run deterministically in Triton's interpreter for "
                f"this shape: the interpreter runs the programs one after another, and program "
                f"{blocked} would wait for a dQ contribution of a later program, which cannot run "
                "before it ends. Use a dynamic schedule ('fa3', 'descending'), 'auto', or "
                "deterministic=False."
            )
    cast_sms = 0
    # (Not where the caller keeps SMs for other kernels: the cast's CTAs would take them.) The
    # cast counts each tile's releases: det kernels and counted non-det ones give them.
    polled = (
        chosen == "hopper"
        and sm_margin == 0
        and (
            deterministic
            or hopper_nondet_counts_adds(problem.headdim, problem.mask.causal, problem.seqlen_k)
        )
    )
    if polled and problem.headdim in POLLED_CAST_HEADDIMS:
        sched, cast_sms = _leave_sms_to_the_cast(sched)
    return BackwardPlan(
        problem=problem,
        device=device,
        schedule=sched,
        tiles=tiles,
        backend=chosen,
        backend_reason=reason,
        deterministic=deterministic,
        dq_reduce=dq_reduce,
        grid=_grid(sched),
        timeout_s=float(timeout_s),
        gqa_split=split,
        cast_sms=cast_sms,
    )


def _why_tables_cannot_poll(sched: Schedule) -> str | None:
    """Why a polled dQ cast cannot run beside ``sched``'s tables, or None: it counts each
    tile's turns from static tables, and its counters would overlap the semaphores of
    in-kernel dK/dV sums."""
    if sched.dispatch is not Dispatch.STATIC:
        return f"schedule {sched.name!r} dispatches dynamically"
    if sched.spec.dkv_sum_group > 1:
        return "the kernel sums dk/dv itself (gqa_split): the cast's counters would overlap"
    return None


def _leave_sms_to_the_cast(sched: Schedule) -> tuple[Schedule, int]:
    """``(schedule, free SMs)`` for a dQ cast beside the main kernel: ``sched`` where its grid
    already leaves ``POLLED_CAST_SMS`` of its workers idle, else ``sched`` made again on that
    many workers fewer where no worker then gets more steps (the same length, the same bits;
    tables a step or more longer with the cast beside them measured slower, H200, session 55).
    Only for order-invariant tables (others change bits with the worker count) with static
    dispatch (dynamic tickets measured slower on fewer workers) and no in-kernel dK/dV sums
    (whose semaphores the cast's counter would overlap). ``(sched, 0)`` where none applies."""
    spec = sched.spec
    fewer = spec.workers - POLLED_CAST_SMS
    if not (spec.invariant and _why_tables_cannot_poll(sched) is None and fewer >= 1):
        return sched, 0
    if _grid(sched) > fewer:
        try:
            lean = make_schedule(sched.name, dataclasses.replace(spec, workers=fewer))
        except ValueError:
            # A group's lanes do not fit on that many workers (a GPU of few SMs, e.g. a MIG
            # slice of 16): the tables keep every worker and the cast runs after them.
            return sched, 0
        if lean.busiest_worker_steps() > sched.busiest_worker_steps():
            return sched, 0
        sched = lean
    return sched, spec.workers - _grid(sched)
