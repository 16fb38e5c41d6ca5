"""Order-invariant static schedules: one canonical layout per (sequence, kv head), then placement.

Why. A ``shift`` schedule's summation order is the order in which contributions *arrive* in its
layout (``generators``: arrival ranks). Computed over the whole launch, that layout, and so the
dQ bits, change with the worker count, the batch, the heads and the other sequences of a pack.
Here the layout that defines the order belongs to one (sequence, kv head) *group* alone:

1. Canonical layout. The group's units (chains, or pairs of chains for ``symmetric_shift``) are
   dealt round-robin to ``V = min(units, WAVE)`` virtual lanes, and the generator's
   worker-dependent rule (``legacy_*``) is run on that one sequence, one head and ``V`` workers.
   Its Q-tile orders and arrival ranks (ties by lane) are a function of the sequence's lengths,
   the tile sizes, the mask and ``WAVE`` only: a constant, not a property of the GPU.
2. Heads. A chain of a GQA group runs every query head of its kv head; its steps go Q tile
   major, heads inner (``q0h0, q0h1, ..., q1h0, ...``), and every head gets the canonical ranks.
   A step at canonical depth ``t`` of head ``h`` then sits at depth ``G t + h`` of its lane, an
   increasing function of ``t`` for each head, so the canonical layout's properties (no cycle,
   no wait in the unit-cost model) hold for any group size ``G``.
3. Placement, by rounds. Round ``k`` of a group is its ``k``-th unit on every lane: up to ``V``
   units that the canonical layout runs side by side, after round ``k - 1``. Rounds are placed
   round-major (round 0 of every group, then round 1, ...); each takes the workers with the least
   nominal load (ties to the lower index) and starts, nominally, at the largest of their loads
   and not before its group's previous round has ended (a nominal gap: the worker runs ahead and
   waits at a semaphore). Each worker appends the units to its list in placement order. Placing
   rounds rather than whole lanes keeps the unit of packing one chain (or pair) long, so that
   ``V`` need not divide the worker count (``tools/invariance_model.py`` measured both).
   The lanes are not in lockstep, though: a lane whose units are short can reach a dQ tile in
   round ``k + 1`` before a slower lane reaches it in round ``k`` (typically around a long causal
   sequence's last, partial round), and then that tile's round-``k`` contribution waits on a
   round-``k + 1`` one. Placed round by round, a worker holding both deadlocked (e.g. 3 x 207 x
   14868 tokens, causal, 64 x 128 tiles, 132 workers; until session 44). So such rounds are
   merged (``merged_rounds``): a merged round holds each lane's units of those rounds, in order,
   as one unit of placement; where no such wait exists every round stands alone.

Deadlock freedom. Order the steps by (placement index of their (merged) round, canonical depth,
lane). A worker edge inside a unit goes one canonical depth on; between two units of a worker it
goes to a later placement. A rank edge joins two steps of one group: inside a round it goes to a
smaller (depth, lane) of the canonical layout, between rounds to an earlier round (merging makes
sure of it), placed earlier. Every wait goes to a smaller key, so the wait graph has no cycle,
provided the units of a round run on distinct co-resident workers: a group needs ``V <=
workers`` (``ValueError`` otherwise). ``validate`` checks the result independently.

Only the dispatch (which worker runs which lane) depends on the worker count and the other
groups; it changes no bit.

Mixed launches (``mixed_invariant_schedule``, the full mask's ``auto`` for a pack of long and
short sequences): a long sequence's groups take ``descending``'s tables (a function of the
sequence alone) and are placed first, chain by chain in KV order; every rank edge of such a
group goes from KV tile ``j - 1`` to ``j``, placed earlier, so the argument above holds for the
mix with any number of co-resident workers for those groups.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import lru_cache

import numpy as np

from .types import Dispatch, Schedule, ScheduleSpec

WAVE = 16
"""Lanes of a canonical layout at most: a constant of the engine, not of the GPU. It must stay
at or below the worker count of every machine that should reproduce the bits (114 SMs on an H100
PCIe, minus any ``sm_margin``). Chosen with ``tools/invariance_model.py wave`` (DAG model, paper
grid, c = 1, r = 0.3; benchmarks/results/model/invariance_wave.csv.gz): against the
worker-dependent tables, WAVE 8, 16, 32 and 64 lose nothing at 132 workers (48: up to 25%,
96: up to 25%); at 114 workers 8 and 16 lose least (geometric mean 5.5%, at most 11%: a round
of 16 units leaves 114 mod 16 = 2 workers per level to the next round), 32 loses 11.7% (at
most 22%), 64 23% (at most 78%). 16 rather than 8 halves a long sequence's chain of rounds when
few (sequence, kv head) groups share the GPU.

The price (``tools/invariance_model.py groups``, invariance_few_groups.csv): a group's rounds run
one after another on at most WAVE workers (a shift round adds to every dQ tile until its last
step, so the next round cannot overlap it). With few groups, e.g. one 16k sequence with 1..4 kv
heads (GQA, or tensor parallelism), the GPU is mostly idle: full mask +100% (4 kv heads) to
+700% (1 kv head) at 132 workers, causal +50% to +200%, where ``descending`` (invariant too,
dynamic) stays within 1% for the full mask. ``invariant=False`` keeps the worker-dependent
tables for such shapes."""


@dataclass(frozen=True)
class CanonicalLayout:
    """The order-defining layout of one sequence's (one kv head's) chains.

    Attributes:
        lanes: per virtual lane, the KV tiles of its chains in execution order.
        q_order: per KV tile, the Q tiles it visits (one query head).
        ranks: per KV tile, the rank of each of those contributions in its dQ tile's sum.
        rounds: the units of placement: per round (consecutive rounds merged where one waits
            on a later one, ``merged_rounds``), each lane's chains of it in execution order.
    """

    lanes: tuple[tuple[int, ...], ...]
    q_order: tuple[np.ndarray, ...]
    ranks: tuple[np.ndarray, ...]
    rounds: tuple[tuple[tuple[int, ...], ...], ...] = ()

    def unit_steps(self, unit: tuple[int, ...]) -> int:
        """Steps of a unit (its chains) for one query head."""
        return sum(len(self.q_order[j]) for j in unit)


Generator = Callable[[ScheduleSpec], Schedule]


def sequence_spec(spec: ScheduleSpec, batch: int, lanes: int) -> ScheduleSpec:
    """One sequence of ``spec``, one head, ``lanes`` workers, worker-dependent rules: the spec
    whose legacy schedule is the canonical layout of ``batch``'s groups."""
    q_tiles, kv_tiles = spec.seq_tiles(batch)
    seqlens = None if spec.seqlens is None else (spec.seqlens[batch],)
    return replace(
        spec,
        batch=1,
        q_heads=1,
        kv_heads=1,
        q_tiles=max(q_tiles, 1),
        kv_tiles=max(kv_tiles, 1),
        workers=lanes,
        seqlens=seqlens,
        invariant=False,
        dkv_sum_group=1,
    )


def units_per_group(name: str, kv_tiles: int) -> int:
    """Units of one group: chains for ``shift``, long/short pairs for ``symmetric_shift``."""
    return (kv_tiles + 1) // 2 if name == "symmetric_shift" else kv_tiles


LaneCap = Callable[[int], int]
"""A lane cap per sequence, for studies (``tools/invariance_model.py lanes``): the sequence's KV
tiles -> the most lanes of its canonical layout. A function of the sequence alone, so the order
still depends on nothing else; the generators never pass one (they use ``WAVE``)."""


def lanes_per_group(name: str, kv_tiles: int, wave: int | LaneCap = WAVE) -> int:
    """``V = min(units, wave)``: the virtual lanes (and real workers) a group uses. A callable
    ``wave`` is asked for the cap of this sequence: ``V = min(units, wave(kv_tiles))``.

    Raises:
        ValueError: a callable ``wave`` returned a cap below one lane.
    """
    if callable(wave):
        cap = wave(kv_tiles)
        if cap < 1:
            raise ValueError(f"a lane cap must be at least 1, got {cap} for {kv_tiles} KV tiles")
        return min(units_per_group(name, kv_tiles), cap)
    return min(units_per_group(name, kv_tiles), wave)


@lru_cache(maxsize=256)
def canonical_layout(name: str, seq_spec: ScheduleSpec, legacy: Generator) -> CanonicalLayout:
    """Run the worker-dependent generator on the one-sequence spec and keep its order."""
    virtual = legacy(seq_spec)
    steps = [virtual.chain_steps(j) for j in range(seq_spec.kv_tiles)]
    q_order = tuple(np.array([q for _, q, _ in s], dtype=np.int64) for s in steps)
    ranks = tuple(np.array([r for _, _, r in s], dtype=np.int64) for s in steps)
    lanes = tuple(tuple(virtual.worker_chains(w)) for w in range(seq_spec.workers))
    # Units: a chain (shift) or a long chain with its short partner (symmetric_shift), which
    # the legacy generator deals round-robin: lane l holds units l, l + V, ...
    first_short = (seq_spec.kv_tiles + 1) // 2 if name == "symmetric_shift" else seq_spec.kv_tiles
    lane_units = []
    for lane in lanes:
        units: list[list[int]] = []
        for j in lane:
            if units and j >= first_short:
                units[-1].append(j)
            else:
                units.append([j])
        lane_units.append(units)
    depth = max((len(units) for units in lane_units), default=0)
    rounds = tuple(
        tuple(
            tuple(j for unit in units[first : last + 1] for j in unit)
            for units in lane_units
            if first < len(units)
        )
        for first, last in merged_rounds(lane_units, depth, q_order, ranks)
    )
    return CanonicalLayout(lanes=lanes, q_order=q_order, ranks=ranks, rounds=rounds)


def merged_rounds(
    lane_units: Sequence[Sequence[Sequence[int]]],
    depth: int,
    q_order: Sequence[np.ndarray],
    ranks: Sequence[np.ndarray],
) -> list[tuple[int, int]]:
    """The rounds ``(first, last)`` that placement takes as one: consecutive rounds ``k`` (the
    ``k``-th unit of every lane) merged wherever a contribution of round ``k`` waits on one of a
    later round ``k' > k``, which happens because the lanes are not in lockstep: a lane whose
    units are short reaches a dQ tile in its next unit before a slower lane reaches it in its
    current one (e.g. the last, partial round of a long causal sequence). A merged round is
    placed like a round, each lane's units of it in order on one worker, so every wait goes to
    the same or an earlier (merged) round: the module's deadlock argument. Without such waits
    every round stands alone (the placement of the rounds themselves)."""
    round_of = np.full(len(ranks), -1, dtype=np.int64)
    for units in lane_units:
        for k, unit in enumerate(units):
            round_of[list(unit)] = k
    chains = [j for j in range(len(ranks)) if round_of[j] >= 0]
    if not chains:
        return [(k, k) for k in range(depth)]
    tiles = np.concatenate([q_order[j] for j in chains])
    order_ranks = np.concatenate([ranks[j] for j in chains])
    rounds = np.repeat(round_of[chains], [len(ranks[j]) for j in chains])
    # Consecutive ranks of one dQ tile: the later (waiting) one waits on the earlier.
    by_rank = np.lexsort((order_ranks, tiles))
    tiles, rounds = tiles[by_rank], rounds[by_rank]
    waited, waiting = rounds[:-1], rounds[1:]
    backward = (tiles[1:] == tiles[:-1]) & (waited > waiting)
    reach = np.arange(depth)  # the last round that round k must share a placement with
    np.maximum.at(reach, waiting[backward], waited[backward])
    merged: list[tuple[int, int]] = []
    first = 0
    while first < depth:
        last, k = int(reach[first]), first
        while k <= last:
            last = max(last, int(reach[k]))
            k += 1
        merged.append((first, last))
        first = last + 1
    return merged


def group_layout(
    name: str, spec: ScheduleSpec, batch: int, legacy: Generator, wave: int | LaneCap = WAVE
) -> CanonicalLayout:
    """The canonical layout of sequence ``batch`` (shared by its kv heads)."""
    kv_tiles = spec.seq_tiles(batch)[1]
    if kv_tiles == 0:
        return CanonicalLayout(lanes=(), q_order=(), ranks=())
    lanes = lanes_per_group(name, kv_tiles, wave)
    return canonical_layout(name, sequence_spec(spec, batch, lanes), legacy)


def place_rounds(
    rounds: list[list[list[int]]], workers: int, load: np.ndarray | None = None
) -> list[list[list[int]]]:
    """The worker of every unit: ``rounds[g][k][u]`` is the length (steps) of unit ``u`` of
    round ``k`` of group ``g``; returns the same nesting with workers (see the module).
    ``load``: the workers' nominal loads before these rounds (updated in place); zeros if None.

    Raises:
        ValueError: a round has more units than there are workers.
    """
    load = np.zeros(workers, dtype=np.int64) if load is None else load
    group_free = [0] * len(rounds)  # nominal end of each group's latest round
    placement: list[list[list[int]]] = [[] for _ in rounds]
    depth = max((len(group) for group in rounds), default=0)
    for k in range(depth):
        for g, group in enumerate(rounds):
            if k >= len(group):
                continue
            lengths = np.asarray(group[k], dtype=np.int64)
            if len(lengths) > workers:
                raise ValueError(
                    f"an order-invariant schedule needs {len(lengths)} co-resident workers for "
                    f"one (sequence, kv head), but the backward has {workers} (the GPU's SMs "
                    "minus sm_margin): lower sm_margin, or pass invariant=False"
                )
            chosen = np.lexsort((np.arange(workers), load))[: len(lengths)]
            start = max(int(load[chosen].max()), group_free[g])
            load[chosen] = start + lengths
            group_free[g] = start + int(lengths.max())
            placement[g].append(chosen.tolist())
    return placement


def _group_block(
    layout: CanonicalLayout, group: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Steps of one group's chains in KV-tile order: Q tile major, heads inner (head ``h`` of
    canonical step ``t`` at depth ``G t + h``). Returns (q heads of kv head 0, Q tiles, ranks,
    steps per chain)."""
    empty = np.zeros(0, np.int64)
    if not layout.q_order:
        return empty, empty, empty, empty
    counts = np.array([len(q) for q in layout.q_order], dtype=np.int64)
    q_tiles = np.concatenate(layout.q_order)
    ranks = np.concatenate(layout.ranks)
    heads = np.tile(np.arange(group, dtype=np.int64), len(q_tiles))
    return heads, np.repeat(q_tiles, group), np.repeat(ranks, group), counts * group


def invariant_schedule(
    name: str, spec: ScheduleSpec, legacy: Generator, wave: int | LaneCap = WAVE
) -> Schedule:
    """The order-invariant version of a static generator (see the module docstring).

    ``wave`` other than ``WAVE`` is for studies of the constant (``tools/invariance_model.py``):
    the generators always use ``WAVE``, or the bits would depend on a caller's choice. A
    ``LaneCap`` gives each sequence its own cap from its KV tiles (``lanes`` study).
    """
    layouts = [group_layout(name, spec, b, legacy, wave) for b in range(spec.batch)]
    per_worker: list[list[int]] = [[] for _ in range(spec.workers)]
    _place_shift_groups(spec, layouts, list(range(spec.batch)), per_worker)
    blocks = _shared_blocks(layouts, spec.group_size)
    return _static_schedule(name, spec, [blocks[id(layout)] for layout in layouts], per_worker)


def mixed_invariant_schedule(
    name: str,
    spec: ScheduleSpec,
    walk_down: Callable[[int], bool],
    legacy_shift: Generator,
    descending: Generator,
) -> Schedule:
    """Each sequence ordered as ``shift`` or as ``descending``, in one static launch.

    ``walk_down(b)`` says which: True gives sequence ``b`` the tables ``descending(spec)`` has
    for it (every KV tile walks its Q range top-down, heads outer, ranks in KV order), False
    its ``shift`` canonical layout; either way the tables of ``b`` equal those that schedule
    gives it alone, so a sequence's bits are those of the named schedule.

    Placement: the ``descending`` groups first (their chains are the long ones), chain after
    chain in KV order, each to the least loaded worker (``place_chains``); then the shift
    groups' rounds as in ``invariant_schedule``, on top of those loads. A ``descending`` rank
    edge goes from KV tile ``j - 1`` to ``j``, placed earlier, so the module's deadlock argument
    holds for the mix; ``validate`` checks it. ``spec.invariant`` False caps the shift lanes at
    the worker count (so any worker count serves; the order then follows it).
    """
    down = [walk_down(b) for b in range(spec.batch)]
    walked = descending(spec) if any(down) else None
    # invariant=False lets the lanes follow the worker count (never more than there are).
    wave = WAVE if spec.invariant else min(WAVE, spec.workers)
    shift_batches = [b for b in range(spec.batch) if not down[b]]
    layouts = {b: group_layout("shift", spec, b, legacy_shift, wave) for b in shift_batches}
    shift_blocks = _shared_blocks(list(layouts.values()), spec.group_size)
    block_of = [
        _chains_block(walked, spec, b) if walked is not None and down[b]
        else shift_blocks[id(layouts[b])]
        for b in range(spec.batch)
    ]  # fmt: skip
    per_worker: list[list[int]] = [[] for _ in range(spec.workers)]
    load = np.zeros(spec.workers, dtype=np.int64)
    down_groups = [(b, g) for b in range(spec.batch) if down[b] for g in range(spec.kv_heads)]
    chain_workers = place_chains(
        [block_of[b][3].tolist() for b, _ in down_groups], spec.workers, load
    )
    for (b, g), workers in zip(down_groups, chain_workers, strict=True):
        for kv_tile, worker in enumerate(workers):
            per_worker[worker].append(spec.chain_id(b, g, kv_tile))
    _place_shift_groups(spec, layouts, shift_batches, per_worker, load)
    return _static_schedule(name, spec, block_of, per_worker)


def _chains_block(
    schedule: Schedule, spec: ScheduleSpec, batch: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``schedule``'s steps of sequence ``batch``'s chains of kv head 0, as ``_group_block``'s
    four arrays (q heads, Q tiles, ranks, steps per chain)."""
    first = spec.chain_id(batch, 0, 0)
    starts = schedule.chain_start[first : first + spec.seq_tiles(batch)[1] + 1]
    lo, hi = int(starts[0]), int(starts[-1])
    return (
        schedule.step_q_head[lo:hi],
        schedule.step_q_tile[lo:hi],
        schedule.step_rank[lo:hi],
        np.diff(starts),
    )


def place_chains(lengths: list[list[int]], workers: int, load: np.ndarray) -> list[list[int]]:
    """The worker of every chain of groups summed in KV order: ``lengths[g][j]`` is the steps of
    chain ``j`` of group ``g``. Group after group, chain after chain, each goes to the least
    loaded worker (ties to the lower index), where dynamic tickets would go if every step took
    the same time. ``load`` is updated in place."""
    placement: list[list[int]] = []
    for group in lengths:
        chosen = []
        for length in group:
            worker = int(np.argmin(load))  # the first of the least loaded
            load[worker] += length
            chosen.append(worker)
        placement.append(chosen)
    return placement


def _place_shift_groups(
    spec: ScheduleSpec,
    layouts: Sequence[CanonicalLayout] | dict[int, CanonicalLayout],
    batches: list[int],
    per_worker: list[list[int]],
    load: np.ndarray | None = None,
) -> None:
    """Place the rounds of the groups of ``batches`` (``place_rounds``) and append their
    chains to ``per_worker`` in placement order (round-major, as ``place_rounds`` goes)."""
    group = spec.group_size
    groups = [(b, g) for b in batches for g in range(spec.kv_heads)]
    if spec.dkv_sum_group > 1:
        groups.sort(key=lambda bg: int(spec.dkv_placement(bg[0], bg[1])))
    lengths_of = [
        [[layouts[b].unit_steps(unit) * group for unit in units] for units in layouts[b].rounds]
        for b, _ in groups
    ]
    placement = place_rounds(lengths_of, spec.workers, load)
    depth = max((len(layouts[b].rounds) for b in batches), default=0)
    for k in range(depth):
        for (b, g), workers in zip(groups, placement, strict=True):
            if k >= len(workers):
                continue
            for unit, worker in zip(layouts[b].rounds[k], workers[k], strict=True):
                per_worker[worker].extend(spec.chain_id(b, g, j) for j in unit)


def _shared_blocks(
    layouts: list[CanonicalLayout], group: int
) -> dict[int, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
    """One block of steps per distinct layout (equal sequences share their cached layout, so a
    pack builds each block once), keyed by ``id``."""
    blocks: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = {}
    for layout in layouts:
        if id(layout) not in blocks:
            blocks[id(layout)] = _group_block(layout, group)
    return blocks


def _static_schedule(
    name: str,
    spec: ScheduleSpec,
    block_of: list[tuple[np.ndarray, ...]],
    per_worker: list[list[int]],
) -> Schedule:
    """Assemble the tables: sequence ``b``'s block (kv head 0) shifted to each kv head's q
    heads, chains in id order; workers' lists concatenated."""
    group = spec.group_size
    lengths = np.zeros(spec.num_chains, dtype=np.int64)
    heads, tiles, ranks = [], [], []
    for b in range(spec.batch):
        block_heads, block_tiles, block_ranks, chain_lengths = block_of[b]
        for g in range(spec.kv_heads):
            first = spec.chain_id(b, g, 0)
            lengths[first : first + len(chain_lengths)] = chain_lengths
            heads.append(block_heads + g * group)
            tiles.append(block_tiles)
            ranks.append(block_ranks)
    empty = np.zeros(0, np.int64)
    return Schedule(
        name=name,
        spec=spec,
        dispatch=Dispatch.STATIC,
        chain_start=np.concatenate([[0], np.cumsum(lengths)]),
        step_q_head=np.concatenate(heads) if heads else empty,
        step_q_tile=np.concatenate(tiles) if tiles else empty,
        step_rank=np.concatenate(ranks) if ranks else empty,
        order=np.asarray([c for chains in per_worker for c in chains], dtype=np.int64),
        worker_start=np.concatenate([[0], np.cumsum([len(c) for c in per_worker])]),
    )
