"""Small helpers shared by the schedule tests: readable ids and independent oracles."""

from __future__ import annotations

from collections import defaultdict

from dash_attn.schedule import Dispatch, Mask, Schedule, ScheduleSpec


def spec_id(spec: ScheduleSpec) -> str:
    """A short readable pytest id, e.g. ``b1-h4kv2-m8n4-s2-p3-causal-d1``."""
    heads = f"h{spec.q_heads}" + (f"kv{spec.kv_heads}" if spec.kv_heads != spec.q_heads else "")
    text = f"b{spec.batch}-{heads}-m{spec.q_tiles}n{spec.kv_tiles}"
    if spec.tile_ratio != 1:
        text += f"-s{spec.tile_ratio}"
    text += f"-p{spec.workers}-{spec.mask.name}"
    if spec.mask.causal and spec.causal_offset:
        text += f"-d{spec.causal_offset}"
    return text


def worker_rows(schedule: Schedule) -> list[str]:
    """Static schedule as one string per worker: ``"kv0: q1r0 q2r1 | kv3: q3r3"``.

    Heads are written as ``g<kv head>`` before the chain and ``h<q head>`` before a cell when the
    spec has several (kv) heads, batches as ``b<batch>``.
    """
    spec = schedule.spec
    rows = []
    for worker in range(spec.workers):
        chains = []
        for chain in schedule.worker_chains(worker):
            b, kv_head, kv_tile = schedule.chain_coords(chain)
            label = (f"b{b}" if spec.batch > 1 else "") + (
                f"g{kv_head}" if spec.kv_heads > 1 else ""
            )
            cells = [
                (f"h{h}" if spec.group_size > 1 else "") + f"q{q}r{r}"
                for h, q, r in schedule.chain_steps(chain)
            ]
            chains.append(f"{label}kv{kv_tile}: " + " ".join(cells))
        rows.append(" | ".join(chains))
    return rows


def mask_pairs(spec: ScheduleSpec) -> set[tuple[int, int, int, int]]:
    """Every ``(b, h, q, kv)`` the mask needs, straight from the definition."""
    return {
        (b, h, q, kv)
        for b in range(spec.batch)
        for h in range(spec.q_heads)
        for kv in range(spec.kv_tiles)
        for q in range(spec.q_tiles)
        if not spec.mask.causal or q >= max(0, kv * spec.tile_ratio - spec.causal_offset)
    }


def schedule_pairs(schedule: Schedule) -> list[tuple[int, int, int, int]]:
    """``(b, h, q, kv)`` of every step, in step order."""
    pairs = []
    for chain in range(schedule.num_chains):
        b, _, kv = schedule.chain_coords(chain)
        pairs.extend((b, h, q, kv) for h, q, _ in schedule.chain_steps(chain))
    return pairs


def dq_rank_lists(schedule: Schedule) -> dict[tuple[int, int, int], list[int]]:
    """Sorted ranks of every dQ tile ``(b, h, q)``."""
    ranks: dict[tuple[int, int, int], list[int]] = defaultdict(list)
    for chain in range(schedule.num_chains):
        b, _, _ = schedule.chain_coords(chain)
        for h, q, r in schedule.chain_steps(chain):
            ranks[(b, h, q)].append(r)
    return {key: sorted(value) for key, value in ranks.items()}


def reference_static_times(schedule: Schedule, c: float, r: float) -> tuple[bool, float | None]:
    """Naive Kahn pass over the full wait graph of a static schedule: (acyclic, makespan)."""
    assert schedule.dispatch is Dispatch.STATIC
    num_steps = schedule.num_steps
    preds: list[list[int]] = [[] for _ in range(num_steps)]
    worker_prev = [-1] * num_steps
    for worker in range(schedule.spec.workers):
        previous = -1
        for chain in schedule.worker_chains(worker):
            for step in range(
                int(schedule.chain_start[chain]), int(schedule.chain_start[chain + 1])
            ):
                worker_prev[step] = previous
                if previous >= 0:
                    preds[step].append(previous)
                previous = step
    holder: dict[tuple[int, int, int, int], int] = {}
    pairs = schedule_pairs(schedule)
    for step, (b, h, q, _) in enumerate(pairs):
        holder[(b, h, q, int(schedule.step_rank[step]))] = step
    rank_pred = [-1] * num_steps
    for step, (b, h, q, _) in enumerate(pairs):
        rank = int(schedule.step_rank[step])
        if rank > 0:
            rank_pred[step] = holder[(b, h, q, rank - 1)]
            preds[step].append(rank_pred[step])
    succs: list[list[int]] = [[] for _ in range(num_steps)]
    indegree = [len(p) for p in preds]
    for step, ps in enumerate(preds):
        for p in ps:
            succs[p].append(step)
    ready = [s for s in range(num_steps) if indegree[s] == 0]
    end = [0.0] * num_steps
    seen = 0
    while ready:
        step = ready.pop()
        seen += 1
        start = end[worker_prev[step]] if worker_prev[step] >= 0 else 0.0
        reduce_start = start + c
        if rank_pred[step] >= 0:
            reduce_start = max(reduce_start, end[rank_pred[step]])
        end[step] = reduce_start + r
        for s in succs[step]:
            indegree[s] -= 1
            if indegree[s] == 0:
                ready.append(s)
    if seen < num_steps:
        return False, None
    return True, max(end, default=0.0)


def make_spec(*, causal: bool = False, **kwargs: object) -> ScheduleSpec:
    """A ScheduleSpec with batch, heads = 1 unless given; ``causal`` picks the mask.

    ``invariant`` defaults to False here: these tests pin the worker-dependent tables of the
    paper's generators; the order-invariant ones have their own tests.
    """
    defaults: dict[str, object] = dict(batch=1, q_heads=1, kv_heads=1, invariant=False)
    defaults.update(kwargs)
    return ScheduleSpec(mask=Mask(causal=causal), **defaults)  # type: ignore[arg-type]


def packed_spec(
    seqlens: list[tuple[int, int]],
    *,
    mask: Mask,
    block: tuple[int, int],
    heads: tuple[int, int] = (2, 1),
    workers: int = 16,
) -> ScheduleSpec:
    """A packed (varlen) spec: ``heads`` = (q heads, kv heads), ``block`` = (block_m, block_n)."""
    return ScheduleSpec.from_seqlens(
        seqlens=seqlens,
        q_heads=heads[0],
        kv_heads=heads[1],
        block_m=block[0],
        block_n=block[1],
        mask=mask,
        workers=workers,
    )
