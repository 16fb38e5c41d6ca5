"""Schedules for people and for files: an ASCII grid, per-tile summation orders, JSON.

The grid is what one checks a new schedule against the paper's figures with (one row per worker,
one column per step, like ``BlockMask.to_string``); ``dq_orders`` is the other view, the order in
which each dQ tile is summed; JSON makes golden files and bug reports possible without pickles.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from .generators import step_depth_and_worker
from .types import TABLE_FIELDS, Dispatch, Mask, Schedule, ScheduleSpec

JSON_FORMAT = "dash_attn.schedule"
# Version 2 spells the spec's mask by name ("full", "causal", "local(L,R)") and repeats the window
# as window_left / window_right; version 1 had a causal flag. Files written before seqlens, block_m
# and invariant existed read back with their defaults, except invariant: tables of that time were
# built by the worker-dependent rules, so a missing "invariant" reads as False.
JSON_VERSION = 2
_READABLE_VERSIONS = (1, 2)


def render_ascii(schedule: Schedule, max_workers: int = 16, max_steps: int = 40) -> str:
    """A text grid of the schedule: one row per worker, one cell per step.

    Cells read ``q3r1`` (Q tile 3, rank 1 in that dQ tile's summation order), prefixed with the
    query head (``h1q3r1``) when there are several heads and with the batch (``b1h0q3r1``) when
    the batch is larger than one. ``|`` separates two chains of one worker. Each row ends with the
    chains it runs. For dynamic dispatch the rows are the tickets dealt to the least-loaded worker
    with unit-cost steps (the real assignment depends on timing).

    Args:
        schedule: the schedule to draw.
        max_workers: rows shown at most; further workers are summarised in a note.
        max_steps: columns shown at most; longer rows end with ``...``.

    Returns:
        The grid as a multi-line string (no trailing newline).

    Raises:
        ValueError: ``max_workers`` or ``max_steps`` is below 1.

    Example:
        >>> from dash_attn.schedule import CAUSAL, FULL, ScheduleSpec, make_schedule, render_ascii
        >>> spec = ScheduleSpec(batch=1, q_heads=1, kv_heads=1, q_tiles=2, kv_tiles=2,
        ...                     mask=FULL, workers=2)
        >>> print(render_ascii(make_schedule("shift", spec)))  # doctest: +NORMALIZE_WHITESPACE
        shift: static dispatch, full mask, batch=1 q_heads=1 kv_heads=1 q_tiles=2 kv_tiles=2
        tile_ratio=1 workers=2, 4 steps
        step  0    1
        w0    q0r0 q1r1   [kv0]
        w1    q1r0 q0r1   [kv1]
    """
    for name, value in (("max_workers", max_workers), ("max_steps", max_steps)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    spec = schedule.spec
    depth, worker = step_depth_and_worker(schedule)
    sequence = np.lexsort((depth, worker))
    per_worker = np.bincount(worker, minlength=spec.workers)
    starts = np.concatenate([[0], np.cumsum(per_worker)])
    step_chain = schedule.step_chain()
    batch, _ = schedule.step_batch_kv()

    shown_workers = min(spec.workers, max_workers)
    longest = int(per_worker.max()) if len(per_worker) else 0
    shown_steps = min(longest, max_steps)

    def cell(step: int) -> str:
        text = ""
        if spec.batch > 1:
            text += f"b{int(batch[step])}"
        if spec.q_heads > 1:
            text += f"h{int(schedule.step_q_head[step])}"
        return text + f"q{int(schedule.step_q_tile[step])}r{int(schedule.step_rank[step])}"

    def chain_label(chain: int) -> str:
        b, kv_head, kv_tile = schedule.chain_coords(chain)
        text = f"b{b}" if spec.batch > 1 else ""
        text += f"g{kv_head}" if spec.kv_heads > 1 else ""
        return text + f"kv{kv_tile}"

    rows: list[tuple[str, list[str], list[bool], str]] = []
    for w in range(shown_workers):
        steps = sequence[starts[w] : starts[w + 1]]
        chains = step_chain[steps]
        visible = steps[:shown_steps].tolist()
        boundary = [i > 0 and chains[i] != chains[i - 1] for i in range(len(visible))]
        # A worker with no steps (more workers than chains) has no chain to label.
        first_of_chain = np.r_[True, chains[1:] != chains[:-1]] if len(chains) else []
        labels = [chain_label(int(c)) for c in chains[first_of_chain]]
        if len(labels) > 8:
            labels = [*labels[:8], f"... {len(labels)} chains"]
        more = " ..." if len(steps) > shown_steps else ""
        rows.append(
            (f"w{w}", [cell(s) for s in visible], boundary, f"{more}   [{', '.join(labels)}]")
        )

    width = max([len(text) for _, cells, _, _ in rows for text in cells] + [len(str(shown_steps))])
    label_width = max([len(label) for label, *_ in rows] + [4]) + 2
    mask = f"{spec.mask.name} mask"
    shifted = spec.mask.causal and spec.causal_offset
    offset = f" causal_offset={spec.causal_offset}" if shifted else ""
    lines = [
        f"{schedule.name}: {schedule.dispatch.value} dispatch, {mask}, batch={spec.batch} "
        f"q_heads={spec.q_heads} kv_heads={spec.kv_heads} q_tiles={spec.q_tiles} "
        f"kv_tiles={spec.kv_tiles}",
        f"tile_ratio={spec.tile_ratio} workers={spec.workers}{offset}, {schedule.num_steps} steps",
    ]
    if schedule.dispatch is Dispatch.DYNAMIC:
        lines.append("(dynamic: rows assume unit-cost steps dealt to the least-loaded worker)")
    lines.append(
        "step".ljust(label_width) + " ".join(str(i).ljust(width) for i in range(shown_steps))
    )
    for label, cells, boundary, tail in rows:
        body = "".join(
            ("|" if boundary[i] else " ") + text.ljust(width) if i else text.ljust(width)
            for i, text in enumerate(cells)
        )
        lines.append(label.ljust(label_width) + body.ljust(shown_steps * (width + 1) - 1) + tail)
    notes = []
    if shown_workers < spec.workers:
        notes.append(f"workers 0..{shown_workers - 1} of {spec.workers}")
    if shown_steps < longest:
        notes.append(f"steps 0..{shown_steps - 1} of {longest}")
    if notes:
        lines.append(f"(truncated: showing {' and '.join(notes)})")
    return "\n".join(line.rstrip() for line in lines)


def dq_orders(schedule: Schedule, batch: int = 0, q_head: int = 0) -> dict[int, list[int]]:
    """The summation order of every dQ tile of one (batch, query head).

    Args:
        schedule: a schedule with valid ranks.
        batch: batch index.
        q_head: query head index.

    Returns:
        ``{q_tile: [kv_tile, ...]}`` for every Q tile ``0 .. M - 1``, KV tiles listed in the order
        their contributions are added (by rank); a Q tile that meets no KV tile maps to ``[]``.

    Raises:
        ValueError: ``batch`` or ``q_head`` is out of range.

    Example:
        >>> from dash_attn.schedule import CAUSAL, FULL, ScheduleSpec, dq_orders, make_schedule
        >>> spec = ScheduleSpec(batch=1, q_heads=1, kv_heads=1, q_tiles=4, kv_tiles=4,
        ...                     mask=FULL, workers=4)
        >>> dq_orders(make_schedule("shift", spec))[0]
        [0, 3, 2, 1]
    """
    spec = schedule.spec
    if not 0 <= batch < spec.batch:
        raise ValueError(f"batch must be in 0..{spec.batch - 1}, got {batch}")
    if not 0 <= q_head < spec.q_heads:
        raise ValueError(f"q_head must be in 0..{spec.q_heads - 1}, got {q_head}")
    step_batch, kv_tile = schedule.step_batch_kv()
    mine = np.flatnonzero((step_batch == batch) & (schedule.step_q_head == q_head))
    mine = mine[np.lexsort((schedule.step_rank[mine], schedule.step_q_tile[mine]))]
    orders: dict[int, list[int]] = {q: [] for q in range(spec.q_tiles)}
    for q, kv in zip(schedule.step_q_tile[mine].tolist(), kv_tile[mine].tolist(), strict=True):
        orders[q].append(kv)
    return orders


def schedule_to_json(schedule: Schedule) -> dict[str, Any]:
    """A JSON-ready dict (plain ints, lists and strings) that ``schedule_from_json`` reads back.

    Example:
        >>> import json
        >>> from dash_attn.schedule import CAUSAL, ScheduleSpec, make_schedule, schedule_from_json
        >>> spec = ScheduleSpec(batch=1, q_heads=2, kv_heads=1, q_tiles=3, kv_tiles=2,
        ...                     mask=CAUSAL, workers=2)
        >>> text = json.dumps(schedule_to_json(make_schedule("descending", spec)))
        >>> schedule_from_json(json.loads(text)).step_rank.tolist()[:3]
        [0, 0, 0]
    """
    data: dict[str, Any] = {
        "format": JSON_FORMAT,
        "version": JSON_VERSION,
        "name": schedule.name,
        "dispatch": schedule.dispatch.value,
        "spec": {
            field.name: _plain(getattr(schedule.spec, field.name))
            for field in dataclasses.fields(ScheduleSpec)
        },
    }
    data["spec"]["window_left"], data["spec"]["window_right"] = schedule.spec.mask.window
    for name in TABLE_FIELDS:
        data[name] = getattr(schedule, name).tolist()
    return data


def schedule_from_json(data: dict[str, Any]) -> Schedule:
    """Rebuild a ``Schedule`` from ``schedule_to_json`` output (not validated: call ``validate``).

    Raises:
        TypeError: ``data`` is not a dict.
        ValueError: wrong format or version, a missing key, or a spec the constructor rejects.
    """
    if not isinstance(data, dict):
        raise TypeError(f"data must be a dict, got {type(data).__name__}")
    if data.get("format") != JSON_FORMAT or data.get("version") not in _READABLE_VERSIONS:
        raise ValueError(
            f"expected format {JSON_FORMAT!r} version {JSON_VERSION}, got "
            f"{data.get('format')!r} version {data.get('version')!r}"
        )
    missing = [key for key in ("name", "dispatch", "spec", *TABLE_FIELDS) if key not in data]
    if missing:
        raise ValueError(f"schedule JSON lacks {missing}")
    spec_data = dict(data["spec"])
    if data["version"] == 1 and "causal" in spec_data:
        spec_data["mask"] = "causal" if spec_data.pop("causal") else "full"
    window = (spec_data.pop("window_left", None), spec_data.pop("window_right", None))
    spec_fields = {f.name for f in dataclasses.fields(ScheduleSpec)}
    unknown = set(spec_data) - spec_fields
    if unknown:
        raise ValueError(f"unknown spec fields {sorted(unknown)}")
    if "mask" in spec_data:
        spec_data["mask"] = Mask.parse(spec_data["mask"])
        if window != (None, None) and tuple(window) != spec_data["mask"].window:
            raise ValueError(
                f"spec window {list(window)} contradicts mask {spec_data['mask'].name!r}"
            )
    spec_data.setdefault("invariant", False)
    if spec_data.get("seqlens") is not None:
        spec_data["seqlens"] = tuple(tuple(pair) for pair in spec_data["seqlens"])
    arrays = {name: np.asarray(data[name], dtype=np.int64) for name in TABLE_FIELDS}
    for name, array in arrays.items():
        if array.ndim != 1:
            raise ValueError(f"{name} must be a flat list of ints")
    return Schedule(
        name=str(data["name"]),
        spec=ScheduleSpec(**spec_data),
        dispatch=Dispatch(data["dispatch"]),
        **arrays,
    )


def _plain(value: object) -> object:
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, Mask):
        return value.name
    if isinstance(value, tuple):
        return [_plain(item) for item in value]
    return value
