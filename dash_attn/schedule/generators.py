"""Schedule generators: pure functions ``ScheduleSpec -> Schedule``, registered by name.

Every generator only decides two things: the Q-tile visiting order of each chain, and which worker
runs which chains in which order. The summation order of every dQ tile (the ranks) then follows from
one of two rules:

* ``kv_order``: contributions to a dQ tile are added in ascending KV-tile order (the FA3 rule);
  with dynamic dispatch in chain order, a rank predecessor always holds a smaller ticket. A rank
  counts only the KV tiles that contribute (``kv_tile - kv_tile_range(b, i)[0]``): under a
  window the first contributing tile of a dQ tile has rank 0, whatever its index.
* ``arrival``: contributions are added in the order they would arrive if every step took the same
  time: sorted by *depth* (the step's position in its worker's sequence), ties broken by worker.
  Every rank edge then goes from a depth to an equal or larger depth, so with all workers
  co-resident there is no cycle, and where no two workers touch the same dQ tile at the same depth
  the order adds no wait at all (the paper's Lemma 1).

Every chain walks the Q tiles its KV tile meets in its own sequence (``q_tile_range``: exact to
the token, so varlen packs and windows are served by the same code). Chains past a shorter
sequence's last KV tile (padding of the tile grid) have no step and are not dispatched; a KV tile
inside its sequence that no query sees has a chain of zero steps, dispatched all the same (the
kernel writes its dK = dV = 0).

Generators (paper section 3):

* ``fa3``: ascending Q tiles, ``kv_order`` ranks, dynamic dispatch (the FA3 deterministic baseline).
* ``descending``: descending Q tiles, ``kv_order`` ranks, dynamic dispatch. Under a band (local)
  mask, KV tile ``j + 1``'s band starts ``tile_ratio`` Q tiles above ``j``'s, so walking down it
  reaches each dQ tile after ``j`` did: the KV order is the arrival order (no wait in the model).
* ``shift``: full mask only; KV tile ``j`` starts at Q tile ``k mod M`` and wraps around, ``k`` its
  index among the tiles of its (batch, kv head) in the same wave (``k = j`` when the head fits in
  one wave), so the KV tiles running side by side touch different dQ tiles at every step; static
  dispatch.
* ``symmetric_shift``: causal only; KV tiles ``p`` and ``N - 1 - p`` run back to back on one worker
  (long column with short column: equal work per worker). KV tile ``p`` first walks the rectangle
  every concurrent long column covers, cyclically shifted, then the rest of its column ascending
  (the folded triangle); KV tile ``N - 1 - p`` then walks its column descending. Static dispatch.
* ``shift_descending``: full mask only; per sequence, ``descending``'s tables from
  ``DESCENDING_MIN_TASKS`` tile tasks and ``DESCENDING_MIN_AREA`` on and ``shift``'s below, in one
  static launch (``invariant.mixed_invariant_schedule``): what ``auto`` runs for a pack with both
  kinds.

Order invariance (``ScheduleSpec.invariant``, the default). ``fa3`` and ``descending`` are
invariant by construction (their orders and ranks depend on the sequence alone). The two shift
schedules define their waves on the real workers; by default they are rebuilt per (sequence,
kv head) on ``invariant.WAVE`` virtual lanes and placed on the workers afterwards
(``invariant.py``), and ``invariant=False`` keeps the worker-dependent tables (``legacy_*``).

``auto`` (``auto_schedule_name``): invariant specs: ``symmetric_shift`` (causal), ``descending``
(local), and for the full mask ``shift``, ``descending`` or ``shift_descending`` by the sequences'
tile tasks (``walks_down``). ``invariant=False``: the model's fastest applicable schedule
(c = r = 1, ties to the shift schedule of the mask, then ``descending``, then ``fa3``) up to
``AUTO_SIMULATE_MAX_TASKS`` tile tasks; past that, the mask's first of ``AUTO_PREFERENCE``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import lru_cache

import numpy as np

from .invariant import invariant_schedule, mixed_invariant_schedule
from .types import Dispatch, Mask, Schedule, ScheduleSpec, range_tables

RANK_KV_ORDER = "kv_order"
RANK_ARRIVAL = "arrival"


def build_schedule(
    name: str,
    spec: ScheduleSpec,
    dispatch: Dispatch | str,
    q_order: Callable[[int], Sequence[int] | np.ndarray],
    units: Sequence[Sequence[int]],
    rank_rule: str,
) -> Schedule:
    """Assemble a ``Schedule`` from visiting orders and a work split.

    Args:
        q_order: chain index -> the Q tiles it visits, in order (the same for each q head);
            called for live chains only (``kv_tile < kv_tiles_b``; padded chains have no step).
        units: groups of live chains executed back to back by one worker, in dispatch order.
            Static dispatch deals units round-robin to the ``spec.workers`` workers (worker ``w``
            runs units ``w, w + P, ...``); dynamic dispatch hands out the chains as tickets in
            this order.
        rank_rule: ``"kv_order"`` or ``"arrival"`` (see the module docstring).
    """
    dispatch = Dispatch(dispatch)
    group = spec.group_size
    tables = range_tables(spec)
    lengths = np.zeros(spec.num_chains, dtype=np.int64)
    heads: list[np.ndarray] = []
    tiles: list[np.ndarray] = []
    for chain in range(spec.num_chains):
        batch, kv_head, kv_tile = _chain_coords(spec, chain)
        if kv_tile >= tables.kv_tiles[batch]:
            continue  # padding of a shorter sequence: no step, not dispatched
        order = np.asarray(q_order(chain), dtype=np.int64)
        heads.append(np.repeat(np.arange(kv_head * group, (kv_head + 1) * group), len(order)))
        tiles.append(np.tile(order, group))
        lengths[chain] = len(order) * group
    chain_start = np.concatenate([[0], np.cumsum(lengths)])
    step_q_head = np.concatenate(heads) if heads else np.zeros(0, np.int64)
    step_q_tile = np.concatenate(tiles) if tiles else np.zeros(0, np.int64)

    flat = [chain for unit in units for chain in unit]
    if sorted(flat) != spec.live_chains().tolist():
        raise ValueError(f"{name}: units must list every live chain exactly once")
    if dispatch is Dispatch.STATIC:
        per_worker: list[list[int]] = [[] for _ in range(spec.workers)]
        for index, unit in enumerate(units):
            per_worker[index % spec.workers].extend(unit)
        order = [chain for chains in per_worker for chain in chains]
        worker_start = np.concatenate([[0], np.cumsum([len(c) for c in per_worker])])
    else:
        order = flat
        worker_start = np.array([0, len(flat)])

    schedule = Schedule(
        name=name,
        spec=spec,
        dispatch=dispatch,
        chain_start=chain_start,
        step_q_head=step_q_head,
        step_q_tile=step_q_tile,
        step_rank=np.zeros_like(step_q_tile),
        order=np.asarray(order, dtype=np.int64),
        worker_start=worker_start,
    )
    if rank_rule == RANK_KV_ORDER:
        ranks = kv_order_ranks(schedule)
    elif rank_rule == RANK_ARRIVAL:
        ranks = _arrival_ranks(schedule)
    else:
        raise ValueError(
            f"rank_rule must be {RANK_KV_ORDER!r} or {RANK_ARRIVAL!r}, got {rank_rule!r}"
        )
    object.__setattr__(schedule, "step_rank", np.ascontiguousarray(ranks, dtype=np.int32))
    schedule.step_rank.setflags(write=False)
    return schedule


def kv_order_ranks(schedule: Schedule) -> np.ndarray:
    """``[S]`` ranks in ascending KV-tile order: a step's KV tile minus the first KV tile that
    contributes to its dQ tile, so ranks count contributing tiles only (a window's dQ tile
    starts at rank 0 whatever its first KV tile)."""
    batch, kv_tile = schedule.step_batch_kv()
    first = range_tables(schedule.spec).kv_lo[batch, schedule.step_q_tile]
    return kv_tile - first


def step_depth_and_worker(schedule: Schedule) -> tuple[np.ndarray, np.ndarray]:
    """``[S]`` depth (position in its worker's step sequence) and worker of every step.

    For dynamic dispatch the worker is not known ahead of time; tickets are dealt round-robin as
    an approximation (exact when every chain has the same length).
    """
    spec = schedule.spec
    lengths = np.diff(schedule.chain_start)
    chain_depth = np.zeros(schedule.num_chains, dtype=np.int64)
    chain_worker = np.zeros(schedule.num_chains, dtype=np.int64)
    if schedule.dispatch is Dispatch.STATIC:
        for worker in range(spec.workers):
            lo, hi = schedule.worker_start[worker], schedule.worker_start[worker + 1]
            chains = schedule.order[lo:hi]
            chain_worker[chains] = worker
            chain_depth[chains] = np.concatenate([[0], np.cumsum(lengths[chains])[:-1]])
    else:
        busy = np.zeros(spec.workers, dtype=np.int64)
        for chain in schedule.order.tolist():
            worker = int(np.argmin(busy))
            chain_worker[chain] = worker
            chain_depth[chain] = busy[worker]
            busy[worker] += lengths[chain]
    step_chain = schedule.step_chain()
    within = np.arange(schedule.num_steps) - schedule.chain_start[step_chain]
    return chain_depth[step_chain] + within, chain_worker[step_chain]


def _arrival_ranks(schedule: Schedule) -> np.ndarray:
    depth, worker = step_depth_and_worker(schedule)
    return arrival_ranks(schedule.step_dq_tile(), depth, worker)


def arrival_ranks(dq: np.ndarray, depth: np.ndarray, worker: np.ndarray) -> np.ndarray:
    """``[S]`` each step's position among its dQ tile's steps sorted by (depth, worker)."""
    by_arrival = np.lexsort((worker, depth, dq))
    sorted_dq = dq[by_arrival]
    group_first = np.r_[0, np.flatnonzero(np.diff(sorted_dq)) + 1]
    group_sizes = np.diff(np.r_[group_first, len(sorted_dq)])
    position = np.arange(len(sorted_dq)) - np.repeat(group_first, group_sizes)
    ranks = np.empty(len(dq), dtype=np.int64)
    ranks[by_arrival] = position
    return ranks


def _chain_coords(spec: ScheduleSpec, chain: int) -> tuple[int, int, int]:
    kv_tile = chain % spec.kv_tiles
    rest = chain // spec.kv_tiles
    return rest // spec.kv_heads, rest % spec.kv_heads, kv_tile


def _one_chain_per_unit(spec: ScheduleSpec) -> list[list[int]]:
    return [[chain] for chain in spec.live_chains().tolist()]


def _q_range(spec: ScheduleSpec, chain: int) -> tuple[int, int]:
    batch, _, kv_tile = _chain_coords(spec, chain)
    return spec.q_tile_range(batch, kv_tile)


def range_walk_schedule(name: str, spec: ScheduleSpec, *, descending: bool) -> Schedule:
    """Every live chain walks its Q range up (or down), heads outer; ``kv_order`` ranks; dynamic
    dispatch in chain order. Built with array arithmetic instead of a loop over chains: varlen
    tables depend on the lengths of every batch, so building them is on the host's path."""
    tables = range_tables(spec)
    group = spec.group_size
    chain = np.arange(spec.num_chains, dtype=np.int64)
    kv_tile = chain % spec.kv_tiles
    batch = chain // (spec.kv_tiles * spec.kv_heads)
    kv_head = (chain // spec.kv_tiles) % spec.kv_heads
    lo, hi = tables.q_lo[batch, kv_tile], tables.q_hi[batch, kv_tile]  # padding: (0, 0)
    width = hi - lo
    lengths = width * group
    chain_start = np.concatenate([[0], np.cumsum(lengths)])
    step_chain = np.repeat(chain, lengths)
    within = np.arange(len(step_chain), dtype=np.int64) - chain_start[step_chain]
    step_width = width[step_chain]
    position = within % np.maximum(step_width, 1)
    step_q_head = kv_head[step_chain] * group + within // np.maximum(step_width, 1)
    step_q_tile = hi[step_chain] - 1 - position if descending else lo[step_chain] + position
    step_batch = batch[step_chain]
    step_rank = kv_tile[step_chain] - tables.kv_lo[step_batch, step_q_tile]
    order = spec.live_chains()
    if spec.dkv_sum_group > 1:
        # Tickets rank-major (ScheduleSpec.dkv_placement); each head's chains keep KV order, so
        # every rank predecessor still holds a smaller ticket.
        order = order[np.argsort(spec.dkv_placement(batch[order], kv_head[order]), kind="stable")]
    return Schedule(
        name=name,
        spec=spec,
        dispatch=Dispatch.DYNAMIC,
        chain_start=chain_start,
        step_q_head=step_q_head,
        step_q_tile=step_q_tile,
        step_rank=step_rank,
        order=order,
        worker_start=np.array([0, len(order)]),
    )


def fa3(spec: ScheduleSpec) -> Schedule:
    """FA3 deterministic baseline: ascending Q tiles, KV-order sums, dynamic dispatch."""
    return range_walk_schedule("fa3", spec, descending=False)


def descending(spec: ScheduleSpec) -> Schedule:
    """Descending Q-tile iteration: the baseline with each chain walking its column top-down."""
    return range_walk_schedule("descending", spec, descending=True)


def shift(spec: ScheduleSpec) -> Schedule:
    """Shift scheduling (full mask): KV tile j visits Q tiles k, k+1, ..., wrapping at M.

    ``invariant=True`` (default): ``k = j mod V`` in the canonical layout of the chain's
    (sequence, kv head) group (see ``invariant``), placed on the real workers without changing
    a bit. ``invariant=False``: ``k`` is j's index within its wave group on the real workers
    (paper section 3.5; equal to j within the first wave), so the order follows the worker count.
    """
    check_schedule_fits("shift", spec.mask)
    if spec.invariant:
        return invariant_schedule("shift", spec, legacy_shift)
    return legacy_shift(spec)


def legacy_shift(spec: ScheduleSpec) -> Schedule:
    """``shift`` with the worker-dependent wave shift and arrival ranks over the whole launch."""

    def order(chain: int) -> np.ndarray:
        _, _, kv_tile = _chain_coords(spec, chain)
        lo, hi = _q_range(spec, chain)
        if hi == lo:
            return np.zeros(0, dtype=np.int64)
        # Shift inside the chain's wave group (the chains of its (batch, kv head) dealt in the same
        # round of spec.workers), as the paper's code does: local index = kv_tile minus this head's
        # chains in earlier waves = min(kv_tile, chain mod workers).
        local = min(kv_tile, chain % spec.workers)
        return lo + (local + np.arange(hi - lo)) % (hi - lo)

    return build_schedule(
        "shift", spec, Dispatch.STATIC, order, _one_chain_per_unit(spec), RANK_ARRIVAL
    )


def symmetric_shift(spec: ScheduleSpec) -> Schedule:
    """Symmetric shift with two-phase folding (causal): KV tiles p and N-1-p share a worker.

    ``invariant`` as for ``shift``: by default the pairs of one (sequence, kv head) are laid out
    on ``V`` canonical lanes, independent of the real workers.
    """
    check_schedule_fits("symmetric_shift", spec.mask)
    if spec.invariant:
        return invariant_schedule("symmetric_shift", spec, legacy_symmetric_shift)
    return legacy_symmetric_shift(spec)


def legacy_symmetric_shift(spec: ScheduleSpec) -> Schedule:
    """``symmetric_shift`` with wave groups of the real workers and launch-wide arrival ranks."""
    units: list[list[int]] = []
    unit_pair: list[tuple[int, int, int]] = []  # (batch, kv_head, pair) of each unit
    for batch in range(spec.batch):
        q_tiles_b, kv_tiles_b = spec.seq_tiles(batch)
        for kv_head in range(spec.kv_heads):
            for pair in range((kv_tiles_b + 1) // 2):
                long_chain = spec.chain_id(batch, kv_head, pair)
                short_tile = kv_tiles_b - 1 - pair
                unit = [long_chain]
                if short_tile != pair:
                    unit.append(spec.chain_id(batch, kv_head, short_tile))
                units.append(unit)
                unit_pair.append((batch, kv_head, pair))

    # Pairs of one (batch, kv head) that run in the same wave form a group; the long columns of a
    # group all cover the rows from the last one's diagonal up, so they shift cyclically there.
    group_of: dict[tuple[int, int, int], list[int]] = {}
    for index, (batch, kv_head, pair) in enumerate(unit_pair):
        group_of.setdefault((batch, kv_head, index // spec.workers), []).append(pair)
    long_order: dict[tuple[int, int, int], np.ndarray] = {}
    for (batch, kv_head, _), pairs in group_of.items():
        q_tiles_b = spec.seq_tiles(batch)[0]
        first, last = pairs[0], pairs[-1]
        rect_start = spec.q_tile_range(batch, last)[0]
        rect_len = q_tiles_b - rect_start
        for pair in pairs:
            local = pair - first
            rect = rect_start + (local + np.arange(rect_len)) % max(rect_len, 1)
            tri = np.arange(spec.q_tile_range(batch, pair)[0], rect_start)
            long_order[(batch, kv_head, pair)] = np.concatenate([rect, tri])

    def order(chain: int) -> np.ndarray:
        batch, kv_head, kv_tile = _chain_coords(spec, chain)
        if kv_tile < (spec.seq_tiles(batch)[1] + 1) // 2:
            return long_order[(batch, kv_head, kv_tile)]
        lo, hi = spec.q_tile_range(batch, kv_tile)
        return np.arange(hi - 1, lo - 1, -1)

    return build_schedule("symmetric_shift", spec, Dispatch.STATIC, order, units, RANK_ARRIVAL)


# The full mask's ``auto``, per sequence: ``descending`` from this many tile tasks (Q tiles x KV
# tiles of the sequence) and this padded area (the tiles times their sizes, in tokens squared) on,
# ``shift`` below. Why: a shift round (16 lanes) streams its whole sequence's Q, dO and dQ through
# L2, and the rounds of one group run one after another, so a long sequence is read from DRAM
# once per round (H200, d128 full 16k, ncu: 5.7 GB of DRAM traffic against 0.7 GB for
# ``descending``, whose chains of a group run side by side). Where the groups running side by
# side no longer fit in L2 that costs more than the pipeline fill that ``descending`` pays (H200,
# hopper backend, benchmarks/results/h200/session17-85ebde9/call1-e67552e/orders, git history at
# 70f1578): d128 (80 x 128 tiles) 8k: 6592 tasks, shift 2% faster; 12k: 14784, descending 1.5%
# faster; 16k 4%, 32k 11%. d64 (128 x 128): 12k: 9216, shift 5% faster; 16k: 16384, equal; 32k:
# descending 3% faster. GQA 4:1 agrees (call7-85ebde9, git history at 36416cc).
DESCENDING_MIN_TASKS = 12288
# The area floor (session 45): in tasks alone the rule sent hd 256 (64 x 48 tiles: 21888 tasks
# at 8k) to ``descending`` from about 6.1k tokens, where ``shift`` is faster: det, 8k, 1.063-1.067x
# in three runs (benchmarks/results/h200/session45-c166108/call3, call4 and call5); at 12k the two
# are within 2% and at 16k ``descending`` is 1.04-1.05x faster. 10240^2 leaves d64 and d128
# (whose 12288 tasks are 201M and 126M tokens squared) as they were and moves hd 256 between
# 6.1k and 10.2k tokens and hd 192 (64 x 96) between 8.7k and 10.2k to ``shift``. The runs at
# d128 and hd 192 12k disagreed with each other (call 4: shift 1.03x faster, call 5: descending
# 1.04-1.05x; call 7: at d128 the timing method decides the sign, at 192 the head count), so
# those stay as they were.
DESCENDING_MIN_AREA = 10240 * 10240


def walks_down(spec: ScheduleSpec, batch: int) -> bool:
    """Whether the full mask's ``auto`` gives sequence ``batch`` the ``descending`` order: at
    least ``DESCENDING_MIN_TASKS`` tile tasks and a padded area of ``DESCENDING_MIN_AREA`` tokens
    squared (a function of the sequence's lengths and tiles; a spec given in tiles without their
    sizes is judged by its tasks alone)."""
    q_tiles, kv_tiles = spec.seq_tiles(batch)
    if q_tiles * kv_tiles < DESCENDING_MIN_TASKS:
        return False
    if spec.block_m is None or spec.block_n is None:
        return True
    return q_tiles * spec.block_m * kv_tiles * spec.block_n >= DESCENDING_MIN_AREA


def shift_descending(spec: ScheduleSpec) -> Schedule:
    """Full mask, per sequence: ``descending``'s order for a sequence of at least
    ``DESCENDING_MIN_TASKS`` tile tasks and ``DESCENDING_MIN_AREA`` (``walks_down``), ``shift``'s
    below, in one static launch (``invariant.mixed_invariant_schedule``). What ``auto`` runs for a
    pack that has both kinds; each sequence's tables, and so its bits, equal those of the named
    schedule it gets. ``invariant=False`` only caps the shift lanes at the worker count."""
    check_schedule_fits("shift_descending", spec.mask)
    return mixed_invariant_schedule(
        "shift_descending", spec, lambda batch: walks_down(spec, batch), legacy_shift, descending
    )


GENERATORS: dict[str, Callable[[ScheduleSpec], Schedule]] = {
    "fa3": fa3,
    "descending": descending,
    "shift": shift,
    "symmetric_shift": symmetric_shift,
    "shift_descending": shift_descending,
}


# The one statement of which schedule serves which mask (by Mask.kind): the shift family is
# mask-specific, the two dynamic baselines serve any mask.
SCHEDULE_MASKS: dict[str, tuple[str, ...]] = {
    "fa3": ("full", "causal", "local"),
    "descending": ("full", "causal", "local"),
    "shift": ("full",),
    "symmetric_shift": ("causal",),
    "shift_descending": ("full",),
}


def schedule_names() -> list[str]:
    """Every registered schedule name."""
    return list(GENERATORS)


def applicable_schedules(spec_or_mask: ScheduleSpec | Mask) -> list[str]:
    """The schedules that can serve a spec or a mask, in registration order."""
    mask = spec_or_mask.mask if isinstance(spec_or_mask, ScheduleSpec) else spec_or_mask
    return [name for name in GENERATORS if mask.kind in SCHEDULE_MASKS[name]]


def check_schedule_fits(name: str, mask: Mask) -> None:
    """Raise ValueError if schedule ``name`` is not made for ``mask``, naming what is."""
    if mask.kind not in SCHEDULE_MASKS[name]:
        fitting = [other for other in applicable_schedules(mask) if other != name]
        raise ValueError(
            f"schedule {name!r} is for the {' or '.join(SCHEDULE_MASKS[name])} mask, not the "
            f"{mask.name} mask; for that use one of {['auto', *fitting]}"
        )


# Order of preference among schedules the model times equal (the argmin's tie-break): the mask's
# shift schedule, then the two dynamic baselines.
AUTO_PREFERENCE = ("shift", "symmetric_shift", "descending", "fa3")
# Up to this many tile tasks, auto simulates every applicable schedule (~10 us per task and
# schedule: ~60 ms at the bound). Past it every worker runs many chains, where the shift schedules
# lead (paper grid, 132 workers: shift 8192 vs descending 8195 steps at 16k full, symmetric_shift
# 4128 vs 4175 at 16k causal) and a simulation would cost seconds.
AUTO_SIMULATE_MAX_TASKS = 2048
# auto of an order-invariant spec, by Mask.kind: a function of the mask alone, so of no worker
# count, batch or other sequence (tools/invariance_model.py and tools/band_model.py measured it).
# The full mask's entry is the rule for short sequences; auto_schedule_name refines it per
# sequence (walks_down).
AUTO_INVARIANT: dict[str, str] = {
    "full": "shift",
    "causal": "symmetric_shift",
    "local": "descending",
}


def auto_schedule_name(spec: ScheduleSpec) -> str:
    """The documented ``schedule="auto"`` rule: a pure function of the tile-level shape.

    ``spec.invariant`` (the default): ``symmetric_shift`` for causal, ``descending`` for a window
    (local): its chains walk their band top-down, so the KV tiles of a dQ tile arrive in
    ascending order, the order the ranks ask for (the band-mask study in
    ``tools/invariance_model.py``). The full mask, per sequence (``walks_down``: its Q tiles x KV
    tiles and its padded area against ``DESCENDING_MIN_TASKS`` and ``DESCENDING_MIN_AREA``):
    ``descending`` if every sequence is long, ``shift`` if none is, ``shift_descending`` (each
    sequence as it would be alone) for a mix. It depends on the mask and each sequence's own
    tiles, never on the worker count or the other sequences, so the order it implies is
    invariant too. Known cost
    (``invariant.WAVE``): with few (sequence, kv head) groups per launch, the shift schedules
    leave most workers idle; ``descending`` or ``invariant=False`` serve those shapes better.

    ``invariant=False``: up to ``AUTO_SIMULATE_MAX_TASKS`` tile tasks, the schedule with the
    smallest makespan in the DAG model (``simulate`` with c = r = 1) among those that fit the
    mask, ties going to the first of ``AUTO_PREFERENCE`` (the mask's shift schedule, then
    ``descending``, then ``fa3``); so a shape with fewer chains than workers (one head, causal)
    gets ``descending``, which uses them all. Larger specs: the mask's first schedule in
    ``AUTO_PREFERENCE`` without simulating. Never a timing-based choice: schedules differ in the
    low bits of dQ, so the choice itself must be reproducible.
    """
    if spec.invariant and spec.mask.kind == "full":
        down = [walks_down(spec, b) for b in range(spec.batch) if spec.seq_tiles(b)[1] > 0]
        if down and all(down):
            return "descending"
        return "shift_descending" if any(down) else "shift"
    if spec.invariant:
        return AUTO_INVARIANT[spec.mask.kind]
    names = [name for name in AUTO_PREFERENCE if name in applicable_schedules(spec)]
    if spec.num_tasks() > AUTO_SIMULATE_MAX_TASKS:
        return names[0]
    from .simulate import simulate  # simulate imports validate, which imports this module

    makespans = {name: simulate(GENERATORS[name](spec)).makespan for name in names}
    return min(names, key=lambda name: (makespans[name], names.index(name)))


@lru_cache(maxsize=64)
def make_schedule(name: str, spec: ScheduleSpec) -> Schedule:
    """Build (and cache) schedule ``name`` for ``spec``; ``name="auto"`` applies the auto rule."""
    if not isinstance(spec, ScheduleSpec):
        raise TypeError(f"spec must be a ScheduleSpec, got {type(spec).__name__}")
    if name == "auto":
        name = auto_schedule_name(spec)
    if name not in GENERATORS:
        raise ValueError(f"schedule must be one of {['auto', *GENERATORS]}, got {name!r}")
    return GENERATORS[name](spec)
