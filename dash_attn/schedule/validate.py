"""Proof obligations of a schedule, checked before its tables reach a kernel.

A schedule that is wrong does not produce a slightly wrong gradient: a missing pair drops a term of
dQ/dK/dV, a duplicated pair counts it twice, a gap in a dQ tile's ranks makes the semaphore wait
for a value it never reaches, and a rank order that contradicts the dispatch order spins forever.
The kernel cannot tell any of these apart from a slow run, so ``validate`` proves, on the integer
tables alone (numpy, no device):

1. *Coverage.* Every ``(batch, q_head, q_tile, kv_tile)`` pair the mask needs appears exactly once,
   no step lies outside the mask or the tile ranges, and every step's query head belongs to its
   chain's GQA group (``q_head // group_size == kv_head``). "Needs" is per sequence and exact to
   the token (``ScheduleSpec.q_tile_range``): a window's or a short sequence's tile pairs that no
   kept (query, key) pair falls in must not appear.
2. *Ranks.* The ranks of each dQ tile ``(batch, q_head, q_tile)`` are exactly ``0 .. k-1`` with
   ``k`` its number of contributions (with 1., the KV tiles that really contribute:
   ``kv_tile_range``), so the semaphore reaches every value it is asked to wait for.
3. *Dispatch tables.* ``order`` lists every live chain once (``kv_tile < kv_tiles_b``, even one
   with no step: its dK = dV = 0 must still be written) and no padding chain of a shorter
   sequence; ``worker_start`` is a partition of it (``P + 1`` non-decreasing offsets from 0 to
   ``len(order)`` for static dispatch, ``[0, len(order)]`` for dynamic).
4. *Deadlock freedom.* A step waits on two things: the previous step of its worker and the step
   holding rank ``k - 1`` of its dQ tile; with ``spec.dkv_sum_group > 1`` the last step of a
   chain also waits for the last step of the chain whose dK/dV it adds to
   (``dkv_predecessors``). Static dispatch (all workers co-resident): this wait
   graph must be acyclic. Dynamic dispatch (tickets handed out in ``order``; a ticket is only
   drawn when a worker is free, so nothing can be assumed about co-residency): every rank
   predecessor (and dK/dV predecessor) must sit in a chain with a smaller ticket, or earlier in
   the same chain; then the
   unfinished chain with the smallest ticket can always make progress. The static check is exact
   (it runs the workers until they block), so it needs no time model: the order-invariant
   schedules, whose units start at nominal times with gaps, are checked like any other.

Order invariance (the promise of ``ScheduleSpec.invariant``) is a property of two schedules, not
one: ``dash_attn.schedule.invariance.invariance_errors`` compares a sequence across them.

It also reports, without failing, whether the accumulation order is *depth-monotone* (the paper's
Lemma 1), i.e. whether it adds no wait at all in the unit-cost DAG model. See ``validate``.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

import numpy as np

from .generators import step_depth_and_worker
from .types import Dispatch, Schedule, ScheduleSpec, range_tables

MAX_ERRORS = 5
"""How many problems a report keeps (the first ones, in check order)."""


@dataclass(frozen=True)
class ValidationReport:
    """Outcome of ``validate``.

    Attributes:
        valid: no problem found (coverage, ranks, dispatch tables, deadlock freedom).
        errors: the first ``MAX_ERRORS`` problems, most basic first; empty when valid.
        depth_monotone: every rank edge ``u -> v`` has ``depth(u) < depth(v)`` (see ``validate``).
            ``False`` when the tables are too broken to define depths or rank edges.
        non_monotone_edges: how many rank edges break that rule.
        num_rank_edges: how many rank edges there are (rank k -> k + 1 of one dQ tile).
    """

    valid: bool
    errors: list[str] = field(default_factory=list)
    depth_monotone: bool = False
    non_monotone_edges: int = 0
    num_rank_edges: int = 0


class _Errors:
    """Collects the first few problems and counts the rest."""

    def __init__(self) -> None:
        self.messages: list[str] = []
        self.total = 0

    def add(self, message: str) -> None:
        self.total += 1
        if len(self.messages) < MAX_ERRORS:
            self.messages.append(message)

    def __bool__(self) -> bool:
        return self.total > 0


def validate(schedule: Schedule, *, raise_on_error: bool = True) -> ValidationReport:
    """Check that ``schedule`` covers its mask exactly once and can never deadlock.

    Depth-monotonicity. The depth of a step is its position in its worker's step sequence
    (``generators.step_depth_and_worker``; for dynamic dispatch that assumes unit-cost steps dealt
    to the least-loaded worker). In the unconstrained model every step takes ``c + r``, so the
    reduction of a step at depth ``d`` runs in ``[d (c + r) + c, (d + 1)(c + r))``. A rank edge
    ``u -> v`` costs nothing iff ``u``'s reduction has ended when ``v``'s may start:
    ``(depth(u) + 1)(c + r) <= depth(v)(c + r) + c``, i.e. (depths are integers and ``c < c + r``)
    ``depth(u) < depth(v)``. The paper's Lemma 1 states ``depth(u) <= depth(v)`` because its
    depth is the time of a DAG *node* (the end of ``u``'s reduction against the start of ``v``'s);
    in step depths that is the strict inequality: two contributions to one dQ tile at the same
    step depth on two workers reduce at the same time, and one of them waits ``r``. A static
    schedule whose rank edges all satisfy ``depth(u) < depth(v)`` has makespan exactly
    ``(longest worker sequence) * (c + r)``.

    Args:
        schedule: the tables to check.
        raise_on_error: raise on the first problem (default) instead of returning a report with
            ``valid=False``.

    Returns:
        A ``ValidationReport``.

    Raises:
        ValueError: when ``raise_on_error`` and a problem is found; the message names the first
            bad cell, e.g. ``"pair (b=0, h=0, q=2, kv=5) missing"`` or
            ``"dQ tile (b=0, h=1, q=3): ranks [0, 2] are not 0..1"``.
        TypeError: ``schedule`` is not a ``Schedule``.

    Example:
        >>> from dash_attn.schedule import CAUSAL, FULL, ScheduleSpec, make_schedule, validate
        >>> spec = ScheduleSpec(batch=1, q_heads=1, kv_heads=1, q_tiles=4, kv_tiles=4,
        ...                     mask=FULL, workers=4)
        >>> validate(make_schedule("shift", spec)).depth_monotone
        True
    """
    if not isinstance(schedule, Schedule):
        raise TypeError(f"schedule must be a Schedule, got {type(schedule).__name__}")
    errors = _Errors()
    _check_structure(schedule, errors)
    if errors:
        return _finish(errors, raise_on_error)

    spec = schedule.spec
    step_chain = schedule.step_chain()
    kv_tile = step_chain % spec.kv_tiles
    kv_head = (step_chain // spec.kv_tiles) % spec.kv_heads
    batch = step_chain // (spec.kv_tiles * spec.kv_heads)
    q_head = schedule.step_q_head.astype(np.int64)
    q_tile = schedule.step_q_tile.astype(np.int64)

    in_range = _check_coverage(schedule, errors, batch, kv_head, kv_tile, q_head, q_tile)
    pred = None
    if in_range:
        pred = _check_ranks(schedule, errors, batch, q_head, q_tile)
    _check_dispatch_tables(schedule, errors)
    if errors or pred is None:
        return _finish(errors, raise_on_error)

    dkv_pred = _dkv_links(schedule, errors)
    if errors:
        return _finish(errors, raise_on_error)
    waits = _Waits.of(schedule, pred, dkv_pred, batch, q_head, q_tile)
    depth, worker = step_depth_and_worker(schedule)
    if schedule.dispatch is Dispatch.STATIC:
        _check_static_deadlock(schedule, errors, waits, depth, worker)
    else:
        _check_dynamic_deadlock(schedule, errors, waits, step_chain)

    has_pred = pred >= 0
    num_edges = int(np.count_nonzero(has_pred))
    non_monotone = int(np.count_nonzero(depth[pred[has_pred]] >= depth[has_pred]))
    return _finish(
        errors,
        raise_on_error,
        depth_monotone=non_monotone == 0,
        non_monotone_edges=non_monotone,
        num_rank_edges=num_edges,
    )


def rank_predecessors(schedule: Schedule) -> np.ndarray:
    """``[S]`` the step holding rank ``k - 1`` of each step's dQ tile (``-1`` for rank 0).

    Assumes valid ranks (``validate`` checks them); a dQ tile's steps are sorted by rank and each
    is linked to the one before it.
    """
    pred, _ = _rank_links(schedule.step_dq_tile(), schedule.step_rank.astype(np.int64))
    return pred


def dkv_predecessors(schedule: Schedule) -> np.ndarray:
    """``[S]`` for the last step of every chain of rank ``r > 0`` in its dK/dV sum (see
    ``ScheduleSpec.dkv_sum_group``), the last step of the chain of rank ``r - 1``; ``-1`` for
    every other step (and everywhere when ``dkv_sum_group`` is 1).

    Assumes valid tables (``validate`` checks that the two chains of every link both have steps
    or both have none)."""
    errors = _Errors()
    pred = _dkv_links(schedule, errors)
    if errors:
        raise ValueError(f"invalid schedule: {errors.messages[0]}")
    return pred


def _dkv_links(schedule: Schedule, errors: _Errors) -> np.ndarray:
    """``dkv_predecessors``, reporting a link between a chain with steps and one without."""
    spec = schedule.spec
    group = spec.dkv_sum_group
    pred = np.full(schedule.num_steps, -1, dtype=np.int64)
    if group == 1:
        return pred
    start = schedule.chain_start.astype(np.int64)
    chains = np.arange(spec.num_chains, dtype=np.int64)
    head = (chains // spec.kv_tiles) % spec.kv_heads
    linked = chains[head % group != 0]
    before = linked - spec.kv_tiles  # the same (batch, KV tile), the previous head
    has_steps = start[1:] > start[:-1]
    mixed = has_steps[linked] != has_steps[before]
    for chain in linked[mixed][:MAX_ERRORS].tolist():
        b, h, j = schedule.chain_coords(chain)
        errors.add(
            f"dK/dV sum of (b={b}, kv={j}): chain of head {h} and chain of head {h - 1} must "
            "both have steps or both have none (every chain of a sum adds into it)"
        )
    live = has_steps[linked] & ~mixed
    pred[start[linked[live] + 1] - 1] = start[before[live] + 1] - 1
    return pred


def _rank_links(dq: np.ndarray, rank: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Predecessor in rank order within each dQ tile, and the rank-sorted step permutation."""
    by_rank = np.lexsort((rank, dq))
    pred = np.full(len(dq), -1, dtype=np.int64)
    if len(dq) > 1:
        same = dq[by_rank[1:]] == dq[by_rank[:-1]]
        pred[by_rank[1:][same]] = by_rank[:-1][same]
    return pred, by_rank


def _finish(
    errors: _Errors,
    raise_on_error: bool,
    *,
    depth_monotone: bool = False,
    non_monotone_edges: int = 0,
    num_rank_edges: int = 0,
) -> ValidationReport:
    if errors and raise_on_error:
        more = errors.total - 1
        suffix = f" (and {more} more problem{'s' if more > 1 else ''})" if more else ""
        raise ValueError(f"invalid schedule: {errors.messages[0]}{suffix}")
    return ValidationReport(
        valid=not errors,
        errors=list(errors.messages),
        depth_monotone=depth_monotone and not errors,
        non_monotone_edges=non_monotone_edges,
        num_rank_edges=num_rank_edges,
    )


def _check_structure(schedule: Schedule, errors: _Errors) -> None:
    """Array lengths and chain offsets: everything the other checks index with."""
    spec = schedule.spec
    num_steps = len(schedule.step_q_tile)
    for name in ("step_q_head", "step_rank"):
        length = len(getattr(schedule, name))
        if length != num_steps:
            errors.add(f"{name} has {length} entries, step_q_tile has {num_steps}")
    chain_start = schedule.chain_start.astype(np.int64)
    if len(chain_start) != spec.num_chains + 1:
        errors.add(
            f"chain_start has {len(chain_start)} entries, expected num_chains + 1 = "
            f"{spec.num_chains + 1}"
        )
        return
    if chain_start[0] != 0 or chain_start[-1] != num_steps:
        errors.add(
            f"chain_start must run from 0 to the number of steps ({num_steps}), got "
            f"{int(chain_start[0])} .. {int(chain_start[-1])}"
        )
    shrinking = np.flatnonzero(np.diff(chain_start) < 0)
    if len(shrinking):
        chain = int(shrinking[0])
        errors.add(
            f"chain_start decreases at chain {chain} ({int(chain_start[chain])} -> "
            f"{int(chain_start[chain + 1])})"
        )


def _pair_name(b: int, h: int, q: int, kv: int) -> str:
    return f"pair (b={b}, h={h}, q={q}, kv={kv})"


def _check_coverage(
    schedule: Schedule,
    errors: _Errors,
    batch: np.ndarray,
    kv_head: np.ndarray,
    kv_tile: np.ndarray,
    q_head: np.ndarray,
    q_tile: np.ndarray,
) -> bool:
    """Pairs: in range, in the head group, inside the mask, once each. Returns "indices usable"."""
    spec = schedule.spec
    group = spec.group_size
    bad_head = (q_head < 0) | (q_head >= spec.q_heads) | (q_head // group != kv_head)
    bad_tile = (q_tile < 0) | (q_tile >= spec.q_tiles)
    tables = range_tables(spec)
    first, end = tables.q_lo[batch, kv_tile], tables.q_hi[batch, kv_tile]
    masked = ~bad_tile & ((q_tile < first) | (q_tile >= end))
    for step in np.flatnonzero(bad_head | bad_tile | masked)[:MAX_ERRORS].tolist():
        b, g, kv = int(batch[step]), int(kv_head[step]), int(kv_tile[step])
        h, q = int(q_head[step]), int(q_tile[step])
        where = f"step {step} (chain b={b}, kv_head={g}, kv={kv})"
        if bad_head[step]:
            errors.add(
                f"{where}: q_head {h} is not in KV head {g}'s group "
                f"(q heads {g * group}..{(g + 1) * group - 1})"
            )
        elif bad_tile[step]:
            errors.add(f"{where}: q_tile {q} out of range 0..{spec.q_tiles - 1}")
        else:
            lo, hi = int(first[step]), int(end[step])
            met = f"Q tiles {lo}..{hi - 1}" if hi > lo else "no Q tile"
            errors.add(
                f"{_pair_name(b, h, q, kv)} at step {step} is outside the {spec.mask.name} mask "
                f"(KV tile {kv} of sequence {b} meets {met})"
            )
    in_range = not (bad_head.any() or bad_tile.any())
    good = ~(bad_head | bad_tile | masked)
    steps = np.flatnonzero(good)
    key = (
        (batch[good] * spec.q_heads + q_head[good]) * spec.q_tiles + q_tile[good]
    ) * spec.kv_tiles + kv_tile[good]
    by_key = np.argsort(key, kind="stable")
    key_sorted = key[by_key]
    repeated = np.flatnonzero(key_sorted[1:] == key_sorted[:-1])
    if len(repeated):
        unique_repeats, counts = np.unique(key_sorted[repeated], return_counts=True)
        for value, count in zip(
            unique_repeats[:MAX_ERRORS].tolist(), counts[:MAX_ERRORS].tolist(), strict=True
        ):
            at = steps[by_key[key_sorted == value]].tolist()
            errors.add(f"{_pair_name(*_unkey(spec, value))} appears {count + 1} times (steps {at})")
    present = np.unique(key_sorted)
    if len(present) < spec.num_tasks():
        needed = _needed_keys(spec)
        found = np.searchsorted(present, needed)
        found = np.minimum(found, max(len(present) - 1, 0))
        missing = needed if len(present) == 0 else needed[present[found] != needed]
        for value in missing[:MAX_ERRORS].tolist():
            errors.add(f"{_pair_name(*_unkey(spec, value))} missing")
    return in_range


def _unkey(spec: ScheduleSpec, key: int) -> tuple[int, int, int, int]:
    rest, kv = divmod(key, spec.kv_tiles)
    rest, q = divmod(rest, spec.q_tiles)
    b, h = divmod(rest, spec.q_heads)
    return b, h, q, kv


def _needed_keys(spec: ScheduleSpec) -> np.ndarray:
    """Sorted keys ``((b * H + h) * M + q) * N + kv`` of every pair the mask needs."""
    tables = range_tables(spec)
    keys = []
    for b in range(spec.batch):
        kv = np.arange(spec.kv_tiles, dtype=np.int64)
        lo, hi = tables.q_lo[b], tables.q_hi[b]
        lengths = hi - lo
        kv_rep = np.repeat(kv, lengths)
        offsets = np.repeat(np.cumsum(lengths) - lengths, lengths)
        q = np.arange(len(kv_rep), dtype=np.int64) - offsets + np.repeat(lo, lengths)
        per_head = np.sort(q * spec.kv_tiles + kv_rep)
        heads = np.arange(b * spec.q_heads, (b + 1) * spec.q_heads, dtype=np.int64)
        keys.append((heads[:, None] * (spec.q_tiles * spec.kv_tiles) + per_head[None, :]).ravel())
    return np.concatenate(keys)


def _check_ranks(
    schedule: Schedule,
    errors: _Errors,
    batch: np.ndarray,
    q_head: np.ndarray,
    q_tile: np.ndarray,
) -> np.ndarray | None:
    """Each dQ tile's ranks must be 0..k-1. Returns the rank predecessors when they are."""
    spec = schedule.spec
    dq = (batch * spec.q_heads + q_head) * spec.q_tiles + q_tile
    rank = schedule.step_rank.astype(np.int64)
    pred, by_rank = _rank_links(dq, rank)
    dq_sorted = dq[by_rank]
    starts = np.flatnonzero(np.r_[True, dq_sorted[1:] != dq_sorted[:-1]])
    sizes = np.diff(np.r_[starts, len(dq_sorted)])
    expected = np.arange(len(dq_sorted)) - np.repeat(starts, sizes)
    wrong = rank[by_rank] != expected
    if not wrong.any():
        return pred
    group_of = np.repeat(np.arange(len(starts)), sizes)
    for group in np.unique(group_of[wrong])[:MAX_ERRORS].tolist():
        lo, hi = int(starts[group]), int(starts[group] + sizes[group])
        ranks = rank[by_rank[lo:hi]].tolist()
        shown = str(ranks) if len(ranks) <= 16 else f"{str(ranks[:16])[:-1]}, ...]"
        rest, q = divmod(int(dq_sorted[lo]), spec.q_tiles)
        b, h = divmod(rest, spec.q_heads)
        errors.add(f"dQ tile (b={b}, h={h}, q={q}): ranks {shown} are not 0..{len(ranks) - 1}")
    return None


def _check_dispatch_tables(schedule: Schedule, errors: _Errors) -> None:
    """``order`` is a permutation of the chains; ``worker_start`` partitions it."""
    spec = schedule.spec
    num_chains = spec.num_chains
    order = schedule.order.astype(np.int64)
    live = np.zeros(num_chains, dtype=bool)
    live[spec.live_chains()] = True
    num_live = int(live.sum())
    if len(order) != num_live:
        errors.add(
            f"order has {len(order)} entries, expected one per live chain ({num_live}: "
            "KV tiles inside their sequence)"
        )
    outside = np.flatnonzero((order < 0) | (order >= num_chains))
    for position in outside[:MAX_ERRORS].tolist():
        errors.add(
            f"order[{position}] = {int(order[position])} is not a chain index (0..{num_chains - 1})"
        )
    counts = np.bincount(order[(order >= 0) & (order < num_chains)], minlength=num_chains)
    for chain in np.flatnonzero(counts > 1)[:MAX_ERRORS].tolist():
        errors.add(f"order lists chain {chain} {int(counts[chain])} times")
    for chain in np.flatnonzero((counts == 0) & live)[:MAX_ERRORS].tolist():
        errors.add(f"order misses chain {chain}")
    for chain in np.flatnonzero((counts > 0) & ~live)[:MAX_ERRORS].tolist():
        b, kv_head, kv_tile = schedule.chain_coords(chain)
        errors.add(
            f"order lists chain {chain} (b={b}, kv_head={kv_head}, kv={kv_tile}), padding past "
            f"sequence {b}'s {spec.seq_tiles(b)[1]} KV tiles"
        )

    start = schedule.worker_start.astype(np.int64)
    if schedule.dispatch is Dispatch.DYNAMIC:
        if start.tolist() != [0, len(order)]:
            errors.add(f"worker_start must be [0, {len(order)}] for dynamic dispatch, got {start}")
        return
    if len(start) != spec.workers + 1:
        errors.add(
            f"worker_start has {len(start)} entries, expected workers + 1 = {spec.workers + 1}"
        )
        return
    if start[0] != 0 or start[-1] != len(order):
        errors.add(
            f"worker_start must run from 0 to len(order) = {len(order)}, got "
            f"{int(start[0])} .. {int(start[-1])}"
        )
    shrinking = np.flatnonzero(np.diff(start) < 0)
    if len(shrinking):
        worker = int(shrinking[0])
        errors.add(
            f"worker_start decreases at worker {worker} ({int(start[worker])} -> "
            f"{int(start[worker + 1])})"
        )


def _dq_name(b: int, h: int, q: int) -> str:
    return f"dQ tile (b={b}, h={h}, q={q})"


@dataclass(frozen=True)
class _Waits:
    """Every wait of a step on another step: ``after[e]`` waits for ``before[e]`` (rank edges,
    then dK/dV edges), with the names the error messages use."""

    before: np.ndarray
    after: np.ndarray
    is_rank: np.ndarray
    schedule: Schedule
    batch: np.ndarray
    q_head: np.ndarray
    q_tile: np.ndarray

    @classmethod
    def of(
        cls,
        schedule: Schedule,
        pred: np.ndarray,
        dkv_pred: np.ndarray,
        batch: np.ndarray,
        q_head: np.ndarray,
        q_tile: np.ndarray,
    ) -> _Waits:
        rank_steps = np.flatnonzero(pred >= 0)
        dkv_steps = np.flatnonzero(dkv_pred >= 0)
        return cls(
            before=np.concatenate([pred[rank_steps], dkv_pred[dkv_steps]]),
            after=np.concatenate([rank_steps, dkv_steps]),
            is_rank=np.r_[np.ones(len(rank_steps), bool), np.zeros(len(dkv_steps), bool)],
            schedule=schedule,
            batch=batch,
            q_head=q_head,
            q_tile=q_tile,
        )

    def describe(self, edge: int, where: dict[str, np.ndarray]) -> str:
        """``after[edge]`` waits on ``before[edge]``, each step named with ``where``'s facts."""
        v, u = int(self.after[edge]), int(self.before[edge])

        def facts(step: int) -> str:
            return ", ".join(f"{key} {int(values[step])}" for key, values in where.items())

        if self.is_rank[edge]:
            name = _dq_name(int(self.batch[v]), int(self.q_head[v]), int(self.q_tile[v]))
            rank = int(self.schedule.step_rank[v])
            return f"{name}: rank {rank} ({facts(v)}) waits on rank {rank - 1} ({facts(u)})"
        b, h, j = self.schedule.chain_coords(int(self.schedule.step_chain()[v]))
        rank = h % self.schedule.spec.dkv_sum_group
        return (
            f"dK/dV sum of (b={b}, kv={j}): the chain of head {h} (rank {rank}, last step "
            f"{v}, {facts(v)}) waits on head {h - 1}'s (last step {u}, {facts(u)})"
        )


def _check_dynamic_deadlock(
    schedule: Schedule, errors: _Errors, waits: _Waits, step_chain: np.ndarray
) -> None:
    """Every awaited step must be dispensed first: smaller ticket, or earlier in the chain."""
    # Padded chains hold no step, so their (absent) ticket is never read.
    ticket = np.zeros(schedule.num_chains, dtype=np.int64)
    ticket[schedule.order] = np.arange(len(schedule.order))
    own, other = step_chain[waits.after], step_chain[waits.before]
    late = (ticket[other] > ticket[own]) | ((other == own) & (waits.before > waits.after))
    steps = np.arange(len(step_chain))
    where = {"step": steps, "chain": step_chain, "ticket": ticket[step_chain]}
    for edge in np.flatnonzero(late)[:MAX_ERRORS].tolist():
        errors.add(
            f"{waits.describe(edge, where)}, which dynamic dispatch may not have started: "
            "deadlock when the grid does not fit on the device"
        )


def _check_static_deadlock(
    schedule: Schedule,
    errors: _Errors,
    waits: _Waits,
    depth: np.ndarray,
    worker: np.ndarray,
) -> None:
    """The wait graph (worker order + rank order + dK/dV order) of a co-resident static grid
    must be acyclic.

    Fast path: if every wait edge goes to an equal or larger depth, there is no cycle. Along a
    cycle the depth would never decrease, so it could hold no worker edge (those add one) and
    would be made of wait edges only. A rank edge keeps the head (with dK/dV sums a chain's
    steps are all of its own head) and strictly increases the rank of one dQ tile; a dK/dV edge
    increases the head: no cycle closes. Otherwise run the workers: each advances until it
    reaches a step that waits for a step (on another worker) that has not run; a worker blocked
    that way resumes when that step runs. Only those cross-worker steps cost Python work;
    whatever is left when nobody can move is deadlocked.
    """
    steps, before = waits.after, waits.before
    if np.all(depth[before] <= depth[steps]):
        return
    spec = schedule.spec
    where = {"worker": worker, "depth": depth}

    same = worker[before] == worker[steps]
    backwards = same & (depth[before] > depth[steps])
    if backwards.any():
        edge = int(np.flatnonzero(backwards)[0])
        errors.add(
            f"static dispatch deadlocks: {waits.describe(edge, where)}, later on the same worker"
        )
        return

    # Blockers: waits on a step of another worker, sorted by (worker, depth).
    cross = np.flatnonzero(~same)
    cross = cross[np.lexsort((depth[steps[cross]], worker[steps[cross]]))]
    cross_steps = steps[cross]
    lengths = np.bincount(worker, minlength=spec.workers)
    blocker_start = np.searchsorted(worker[cross_steps], np.arange(spec.workers + 1)).tolist()
    blocker_depth = depth[cross_steps].tolist()
    blocker_pred = before[cross].tolist()
    cross_list = cross.tolist()
    step_worker = worker.tolist()
    step_depth = depth.tolist()

    done_upto = [0] * spec.workers  # steps of each worker that have run (a prefix)
    next_blocker = blocker_start[:-1]
    waiters: list[list[tuple[int, int]]] = [[] for _ in range(spec.workers)]  # heaps
    runnable = list(range(spec.workers - 1, -1, -1))
    while runnable:
        w = runnable.pop()
        index, end = next_blocker[w], blocker_start[w + 1]
        while index < end:
            u = blocker_pred[index]
            if step_depth[u] >= done_upto[step_worker[u]]:
                heapq.heappush(waiters[step_worker[u]], (step_depth[u], w))
                break
            index += 1
        next_blocker[w] = index
        done_upto[w] = blocker_depth[index] if index < end else int(lengths[w])
        heap = waiters[w]
        while heap and heap[0][0] < done_upto[w]:
            runnable.append(heapq.heappop(heap)[1])

    stuck = [w for w in range(spec.workers) if done_upto[w] < lengths[w]]
    if stuck:
        edge = cross_list[next_blocker[stuck[0]]]
        shown = ", ".join(map(str, stuck[:8])) + (", ..." if len(stuck) > 8 else "")
        errors.add(
            f"static dispatch deadlocks: {len(stuck)} worker(s) ({shown}) can never finish; "
            f"first: {waits.describe(edge, where)}"
        )
