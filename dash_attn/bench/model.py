"""The DASH DAG model against the measured backward times (CPU only, no torch).

For every measured config and backend (the Triton kernels, providers ``dash_*``; the hopper
kernels, ``dash_hopper_*``), each dash schedule's makespan is simulated (``schedule.simulate``)
on the schedule's real tables (that backend's tiles, the GPU's SM count as workers) with costs
estimated from that kernel's own measurements, and the model's speedup over ``fa3`` is set
beside the measured one.

Method. Let ``S`` be the number of tile tasks (``spec.num_tasks()``) and ``P`` the workers, so a
perfectly packed kernel runs ``S / P`` steps per worker.

* ``c`` (compute edge) = ``t_nondet / (S / P)``: the non-deterministic kernel never waits, so its
  time per step is the cost of a step, including its atomic dQ add.
* ``r`` (reduction edge) = ``max(t_fa3 - t_nondet, 0) / (S / P)``: the extra time per step of the
  deterministic FA3 order, a rough stand-in for the cost of one ordered dQ reduction. It folds the
  waiting that the model is meant to predict into ``r``, so the model's absolute times run long
  (``model_ms`` >= the measured times); the comparison is about *ratios*: the model's makespans
  are homogeneous in (c, r), so only ``r / c`` shapes the predicted speedups and rankings.

Columns of ``model_vs_measured.csv``: the backend, the config, the schedule, ``S``, ``P``, ``c``
and ``r`` in
microseconds, ``model_ms`` (simulated makespan), ``measured_ms``, ``model_speedup_vs_fa3`` next to
``measured_speedup_vs_fa3``, and the rank of the schedule among the config's schedules (1 =
fastest) in the model and in the measurement.

    python -m dash_attn.bench.model --csv benchmarks/results/h200/bench.csv.gz
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..schedule import ScheduleSpec, applicable_schedules, simulate
from ..schedule.generators import GENERATORS
from ..schedule.report import BASELINE, model_speedups, square_spec
from .report import by_config, read_csv, text_table, write_csv

MODEL_FIELDS = (
    "gpu",
    "sm_count",
    "commit",
    "mode",
    "backend",
    "headdim",
    "seqlen",
    "batch",
    "heads",
    "causal",
    "schedule",
    "workers",
    "tasks",
    "c_us",
    "r_us",
    "r_over_c",
    "model_ms",
    "measured_ms",
    "model_speedup_vs_fa3",
    "measured_speedup_vs_fa3",
    "model_rank",
    "measured_rank",
)


def estimate_costs(spec: ScheduleSpec, nondet_ms: float, fa3_ms: float) -> tuple[float, float]:
    """``(c, r)`` in ms per step from the non-deterministic and the fa3 times (module docstring)."""
    per_worker = spec.num_tasks() / spec.workers
    return nondet_ms / per_worker, max(fa3_ms - nondet_ms, 0.0) / per_worker


def _ranks(values: Mapping[str, float]) -> dict[str, int]:
    # Ties share the better rank, so that equal makespans are not ranked by name.
    ordered = sorted(values.values())
    return {name: 1 + ordered.index(value) for name, value in values.items()}


# Provider-name prefix of each backend's dash-attn columns in bench.csv.
BACKEND_PREFIX = {"triton": "dash_", "hopper": "dash_hopper_"}


def model_vs_measured(
    rows: Iterable[Mapping[str, Any]], deadline: Any = None, backends: Sequence[str] = ("triton",)
) -> list[dict]:
    """One row per (backend, measured bwd config, measured deterministic dash schedule)."""
    rows = list(rows)
    out: list[dict[str, Any]] = []
    for backend in backends:
        out += _model_rows(rows, deadline, backend)
    return out


def _model_rows(rows: list[Mapping[str, Any]], deadline: Any, backend: str) -> list[dict]:
    prefix = BACKEND_PREFIX[backend]
    out: list[dict[str, Any]] = []
    for (mode, headdim, causal, seqlen), providers in by_config(rows).items():
        nondet, baseline = f"{prefix}nondet", f"{prefix}{BASELINE}"
        if mode != "bwd" or nondet not in providers or baseline not in providers:
            continue
        if deadline is not None and not deadline.allows("report"):
            print("deadline reached: model comparison cut short")
            break
        first = providers[nondet]
        workers = int(first["sm_count"])
        spec = square_spec(
            headdim, seqlen, int(first["batch"]), int(first["heads"]), causal, workers, backend
        )
        nondet_ms = float(first["ms"])
        fa3_ms = float(providers[baseline]["ms"])
        c, r = estimate_costs(spec, nondet_ms, fa3_ms)
        measured = {
            name: float(providers[f"{prefix}{name}"]["ms"])
            for name in applicable_schedules(spec)
            if f"{prefix}{name}" in providers
        }
        model = {
            name: simulate(GENERATORS[name](spec), cost_compute=c, cost_reduce=r).makespan
            for name in measured
        }
        model_rank, measured_rank = _ranks(model), _ranks(measured)
        model_speedup = model_speedups(model)
        measured_speedup = model_speedups(measured)
        for name in measured:
            out.append(
                {
                    "gpu": first.get("gpu"),
                    "sm_count": workers,
                    "commit": first.get("commit"),
                    "mode": mode,
                    "backend": backend,
                    "headdim": headdim,
                    "seqlen": seqlen,
                    "batch": spec.batch,
                    "heads": spec.q_heads,
                    "causal": causal,
                    "schedule": name,
                    "workers": spec.workers,
                    "tasks": spec.num_tasks(),
                    "c_us": c * 1e3,
                    "r_us": r * 1e3,
                    "r_over_c": r / c if c > 0 else None,
                    "model_ms": model[name],
                    "measured_ms": measured[name],
                    "model_speedup_vs_fa3": model_speedup[name] if model[name] else None,
                    "measured_speedup_vs_fa3": measured_speedup[name],
                    "model_rank": model_rank[name],
                    "measured_rank": measured_rank[name],
                }
            )
    return out


def _x(value: Any) -> str:
    return "-" if value is None else f"{float(value):.2f}x"


def agreement_summary(model_rows: Sequence[Mapping[str, Any]]) -> str:
    """Per config: r/c, each schedule's model vs measured speedup, and whether the model picks the
    measured-fastest schedule; then the count over all configs."""
    configs: dict[tuple[str, int, bool, int], list[Mapping[str, Any]]] = {}
    for row in model_rows:
        backend = str(row.get("backend") or "triton")
        key = (backend, int(row["headdim"]), bool(row["causal"]), int(row["seqlen"]))
        configs.setdefault(key, []).append(row)
    names = [n for n in GENERATORS if n != BASELINE and any(r["schedule"] == n for r in model_rows)]
    header = [
        "backend", "hdim", "mask", "seqlen", "r/c", *(f"{n} model/meas." for n in names), "best"
    ]  # fmt: skip
    body = []
    agree: dict[str, list[int]] = {}
    for (backend, headdim, causal, seqlen), rows in sorted(configs.items()):
        by_name = {r["schedule"]: r for r in rows}
        cells = []
        for n in names:
            r = by_name.get(n)
            cells.append(
                "-"
                if r is None
                else f"{_x(r['model_speedup_vs_fa3'])} / {_x(r['measured_speedup_vs_fa3'])}"
            )
        model_best = min(rows, key=lambda r: (r["model_rank"], r["schedule"]))["schedule"]
        measured_best = min(rows, key=lambda r: (r["measured_rank"], r["schedule"]))["schedule"]
        same = by_name[measured_best]["model_rank"] == 1
        counts = agree.setdefault(backend, [0, 0])
        counts[0] += same
        counts[1] += 1
        ratio = rows[0].get("r_over_c")
        body.append(
            [
                backend,
                str(headdim),
                "causal" if causal else "full",
                str(seqlen),
                "-" if ratio is None else f"{float(ratio):.3f}",
                *cells,
                measured_best + ("" if same else f" (model: {model_best})"),
            ]
        )
    table = text_table(header, body, left=3)
    counts = "; ".join(f"{b}: {a} of {n} configs" for b, (a, n) in sorted(agree.items()))
    return (
        f"{table}\nspeedups over fa3 (model / measured); best = measured fastest. The model ranks "
        f"the measured-fastest schedule first in {counts}."
    )


def predicted_table(cases: Iterable[Any], workers: int) -> str:
    """Model speedup over fa3 of each applicable schedule with c = r = 1 (no measurements)."""
    header = ["hdim", "mask", "seqlen", "batch", "heads", "schedules: model speedup over fa3"]
    body = []
    for case in cases:
        spec = square_spec(case.headdim, case.seqlen, case.batch, case.heads, case.causal, workers)
        speedups = model_speedups(
            {name: simulate(GENERATORS[name](spec)).makespan for name in applicable_schedules(spec)}
        )
        cells = [f"{name} {x:.3f}x" for name, x in speedups.items() if name != BASELINE]
        body.append(
            [
                str(case.headdim),
                case.mask,
                str(case.seqlen),
                str(case.batch),
                str(case.heads),
                "  ".join(cells),
            ]
        )
    return text_table(header, body, left=2) + f"\n{workers} workers, C = R = 1."


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m dash_attn.bench.model",
        description="DAG model vs measured dash schedule speedups, from a bench.csv.",
        allow_abbrev=False,
    )
    parser.add_argument("--csv", type=Path, required=True, help="bench.csv of a bwd run")
    parser.add_argument(
        "--out", type=Path, default=None, help="default: model_vs_measured.csv beside the CSV"
    )
    args = parser.parse_args(argv)
    rows = model_vs_measured(read_csv(args.csv), backends=tuple(BACKEND_PREFIX))
    if not rows:
        print("no config has both a backend's non-det and fa3 columns in bwd mode: no comparison")
        return 1
    out = args.out or args.csv.with_name("model_vs_measured.csv")
    write_csv(out, rows, MODEL_FIELDS)
    print(agreement_summary(rows))
    print(f"\nwritten: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
