"""What order invariance promises, as a check: one sequence's order, read back from the tables.

The contract (``ScheduleSpec.invariant``): the Q-tile visiting order of every chain and the rank of
every contribution depend only on the sequence's lengths, the tile sizes, the mask and the
schedule name. ``sequence_order`` extracts exactly that from a schedule, for one sequence and one
query head; two schedules keep the promise for a sequence iff the extracts are equal. The tests
compare a sequence alone, packed among others at other positions, in a batch, with other head
counts and at other worker counts (``invariance_errors``).
"""

from __future__ import annotations

from dataclasses import dataclass

from .types import Schedule


@dataclass(frozen=True)
class SequenceOrder:
    """One query head of one sequence: what fixes its dQ bits and its dK/dV bits.

    Attributes:
        q_orders: per KV tile ``j < kv_tiles_b``, the Q tiles its chain visits for this head, in
            execution order (the dK/dV summation order).
        ranks: per KV tile, the rank of each of those contributions (the dQ summation order).
    """

    q_orders: tuple[tuple[int, ...], ...]
    ranks: tuple[tuple[int, ...], ...]


def sequence_order(schedule: Schedule, batch: int, q_head: int = 0) -> SequenceOrder:
    """The ``SequenceOrder`` of sequence ``batch``, query head ``q_head``.

    Raises:
        ValueError: ``batch`` or ``q_head`` is out of range.
    """
    spec = schedule.spec
    if not 0 <= batch < spec.batch:
        raise ValueError(f"batch must be in 0..{spec.batch - 1}, got {batch}")
    if not 0 <= q_head < spec.q_heads:
        raise ValueError(f"q_head must be in 0..{spec.q_heads - 1}, got {q_head}")
    kv_head = q_head // spec.group_size
    q_orders, ranks = [], []
    for kv_tile in range(spec.seq_tiles(batch)[1]):
        chain = spec.chain_id(batch, kv_head, kv_tile)
        steps = [(q, r) for h, q, r in schedule.chain_steps(chain) if h == q_head]
        q_orders.append(tuple(q for q, _ in steps))
        ranks.append(tuple(r for _, r in steps))
    return SequenceOrder(q_orders=tuple(q_orders), ranks=tuple(ranks))


def invariance_errors(
    schedule: Schedule, batch: int, reference: Schedule, reference_batch: int
) -> list[str]:
    """Where sequence ``batch`` of ``schedule`` is ordered otherwise than sequence
    ``reference_batch`` of ``reference`` (empty: the same bits). Compares the query heads both
    have; the sequences must have equal lengths.

    Raises:
        ValueError: the two sequences differ in lengths, tiles or mask (nothing to compare).
    """
    spec, other = schedule.spec, reference.spec
    if spec.seq_tiles(batch) != other.seq_tiles(reference_batch) or spec.mask != other.mask:
        raise ValueError(
            f"sequence {batch} ({spec.seq_tiles(batch)} tiles, {spec.mask.name}) and reference "
            f"sequence {reference_batch} ({other.seq_tiles(reference_batch)} tiles, "
            f"{other.mask.name}) are not the same problem"
        )
    lengths = None if spec.seqlens is None else spec.seqlens[batch]
    other_lengths = None if other.seqlens is None else other.seqlens[reference_batch]
    if None not in (lengths, other_lengths) and lengths != other_lengths:
        raise ValueError(f"sequence lengths differ: {lengths} vs {other_lengths}")
    errors = []
    for q_head in range(min(spec.q_heads, other.q_heads)):
        mine = sequence_order(schedule, batch, q_head)
        theirs = sequence_order(reference, reference_batch, q_head)
        for kv_tile, (a, b) in enumerate(zip(mine.q_orders, theirs.q_orders, strict=True)):
            if a != b:
                errors.append(f"q_head {q_head}, KV tile {kv_tile}: visits {a} vs {b}")
        for kv_tile, (a, b) in enumerate(zip(mine.ranks, theirs.ranks, strict=True)):
            if a != b:
                errors.append(f"q_head {q_head}, KV tile {kv_tile}: ranks {a} vs {b}")
    return errors
