"""Random padded shapes through ``make_backward_plan`` and the validator: how often a plan's
tables would deadlock (or, for a study, how often they did before session 44 merged the rounds
that wait on a later round: ``--unmerged``).

The tests' shapes and the benchmark grid are few; this draws many: head dims 64-256, full and
causal, Sq = Sk or not, GQA/MQA, up to 20k tokens, both backends' tiles, 132 workers (H200).
Deterministic plans, the default schedule (``auto``), or with ``--schedules`` each named one
that fits the drawn mask (``all``: every registered one), and with ``--worker-tables`` the
worker-dependent placement (``invariant=False``). Pure CPU, seeded, a fixed count:

    python -m tools.plan_scan --backend hopper --count 1000 [--seed 1] [--unmerged]
    python -m tools.plan_scan --schedules all --count 300 --seed 49
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
from collections.abc import Iterator

import numpy as np

from dash_attn.plan import CAUSAL, FULL, H200, Problem, make_backward_plan
from dash_attn.schedule import Mask, invariant, schedule_names, validate
from dash_attn.schedule.generators import SCHEDULE_MASKS

# Above this many tile tasks a spec is skipped (the validator's time grows with it).
MAX_TASKS = 3_000_000


def draw_problem(rng: np.random.Generator, local: bool = False) -> Problem:
    """One padded shape: lengths from 64 to 20000 (powers of two one time in two), Sq = Sk
    in 60% of draws, 1-16 kv heads with groups of 1, 2 or 4, a batch of up to 40k tokens. With
    ``local``, one draw in three then takes a sliding window instead (a left bound of 0-4096
    tokens or none, a right bound of 0, 1-512 or none; 1-512 without a left one), drawn after
    the rest so that the other draws stay those of the same seed without it."""
    if rng.random() < 0.5:
        seqlen_q = int(rng.integers(64, 20001))
    else:
        seqlen_q = int(rng.choice([512, 1024, 2048, 4096, 8192, 16384]))
    seqlen_k = seqlen_q if rng.random() < 0.6 else int(rng.integers(64, 20001))
    kv_heads = int(rng.choice([1, 2, 4, 8, 16]))
    problem = Problem(
        batch=int(rng.integers(1, max(1, 40000 // max(seqlen_q, seqlen_k)) + 1)),
        seqlen_q=seqlen_q,
        seqlen_k=seqlen_k,
        heads=kv_heads * int(rng.choice([1, 1, 2, 4])),
        kv_heads=kv_heads,
        headdim=int(rng.choice([64, 96, 128, 192, 256])),
        mask=CAUSAL if rng.random() < 0.5 else FULL,
    )
    if local and rng.random() < 1 / 3:
        left = int(rng.integers(0, 4097)) if rng.random() < 0.8 else -1
        right = int(rng.choice([0, int(rng.integers(1, 513)), -1]))
        if left < 0 and right <= 0:  # (that would be the full or the causal mask)
            right = int(rng.integers(1, 513))
        problem = dataclasses.replace(problem, mask=Mask(window_left=left, window_right=right))
    return problem


@contextlib.contextmanager
def unmerged_rounds() -> Iterator[None]:
    """Every round placed alone, as before session 44 (a study of the old placement)."""
    merged = invariant.merged_rounds
    invariant.merged_rounds = lambda lane_units, depth, q_order, ranks: [
        (k, k) for k in range(depth)
    ]
    invariant.canonical_layout.cache_clear()
    try:
        yield
    finally:
        invariant.merged_rounds = merged
        invariant.canonical_layout.cache_clear()


def scan(
    backend: str,
    count: int,
    seed: int,
    schedules: tuple[str, ...] = ("auto",),
    invariant: bool = True,
    local: bool = False,
) -> tuple[int, list[str]]:
    """(plans checked, a line per invalid plan) over ``count`` draws, each planned with every
    name of ``schedules`` that fits its mask (``auto`` fits every mask)."""
    rng = np.random.default_rng(seed)
    checked, invalid = 0, []
    for _ in range(count):
        problem = draw_problem(rng, local)
        for name in schedules:
            if name != "auto" and problem.mask.kind not in SCHEDULE_MASKS[name]:
                continue
            try:
                plan = make_backward_plan(
                    problem, device=H200, backend=backend, schedule=name, invariant=invariant
                )
            except (NotImplementedError, ValueError):
                continue  # a shape the backend does not cover
            if plan.spec.num_tasks() > MAX_TASKS:
                continue
            checked += 1
            try:
                validate(plan.schedule)
            except ValueError as exc:
                invalid.append(f"{problem} {plan.schedule.name}: {str(exc)[:120]}")
    return checked, invalid


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=("hopper", "triton"), default="hopper")
    parser.add_argument("--count", type=int, default=1000, help="shapes drawn")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--unmerged", action="store_true", help="the placement before session 44")
    parser.add_argument(
        "--schedules", default="auto",
        help="comma-separated schedule names, 'auto' among them, or 'all' (default auto)",
    )  # fmt: skip
    parser.add_argument(
        "--worker-tables", action="store_true", help="invariant=False (worker-dependent tables)"
    )
    parser.add_argument("--local", action="store_true", help="a third of the draws windowed")
    args = parser.parse_args()
    names = ["auto", *schedule_names()] if args.schedules == "all" else args.schedules.split(",")
    unknown = [n for n in names if n != "auto" and n not in SCHEDULE_MASKS]
    if unknown:
        parser.error(f"unknown schedules {unknown} (known: auto, {', '.join(schedule_names())})")
    with unmerged_rounds() if args.unmerged else contextlib.nullcontext():
        checked, invalid = scan(
            args.backend, args.count, args.seed, tuple(names), not args.worker_tables, args.local
        )
    for line in invalid:
        print("invalid:", line)
    placement = "unmerged rounds" if args.unmerged else "merged rounds"
    tables = "worker tables" if args.worker_tables else "invariant tables"
    tables += ", windows drawn" if args.local else ""
    print(f"{args.backend}, {placement}, {tables}, schedules {','.join(names)}, seed {args.seed}: "
          f"{checked} plans checked, {len(invalid)} invalid")  # fmt: skip


if __name__ == "__main__":
    main()
