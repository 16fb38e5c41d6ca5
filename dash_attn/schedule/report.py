"""What `dash-attn schedule` reports: schedule analyses, their tables, JSON and the paper sweep.

Pure Python like the rest of ``dash_attn.schedule`` (no torch, no triton): the CLI formats nothing
itself, and the benchmark package (``dash_attn.bench.model``) and the tools take the paper grid,
the default worker count and the model speedup from here, so each rule has one definition.

Model: the DAG cost model of the DASH paper (``simulate``): every tile task is a compute edge of
cost ``c`` followed by a dQ reduction edge of cost ``r``. A schedule's *model speedup* is the
baseline's (``fa3``) makespan over its own, for the same spec and costs.

Tiles come from the backward plan's rules (``dash_attn.plan``): a shape in tokens is tiled as the
Triton backward on a Hopper GPU with ``workers`` SMs would tile it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from ..backends import choose_backend, hopper
from ..backends.triton.tiles import SUPPORTED_HEADDIMS, backward_tiles
from ..plan import (
    H200,
    Problem,
    analysis_device,
    backward_spec,
    kernel_sums_dkv,
    resolve_gqa_split,
)
from .generators import GENERATORS, applicable_schedules, auto_schedule_name, schedule_names
from .render import render_ascii
from .simulate import SimResult, simulate
from .types import MASK_NAMES, Mask, Schedule, ScheduleSpec
from .validate import ValidationReport, validate

BASELINE = "fa3"
# The machines of the paper and of this repo's benchmarks: the default of every analysis.
DEFAULT_WORKERS = H200.sm_count

# The paper's benchmark grid (section 5.2): 16k tokens in total (batch = tokens / seqlen), hidden
# size 2048 (heads = hidden / head dim), MHA, both masks.
PAPER_TOKENS = 16384
PAPER_HIDDEN = 2048
PAPER_HEADDIMS = (64, 128)
PAPER_SEQLENS = (512, 1024, 2048, 4096, 8192, 16384)
PAPER_MASKS = MASK_NAMES

# BLOCK_N / BLOCK_M of some kernel's tiles: a spec in tiles with another ratio runs nowhere.
KERNEL_TILE_RATIOS = tuple(sorted({backward_tiles(d).tile_ratio for d in SUPPORTED_HEADDIMS}))

# Shapes this small get their ASCII grid printed unasked: it fits a terminal (render_ascii draws at
# most 16 workers) and says more than the numbers do.
TINY_WORKERS = 16
TINY_TASKS = 256


class AnalysisError(ValueError):
    """A shape or schedule the engine rejects (the CLI turns it into exit status 2)."""


def paper_batch_heads(
    headdim: int, seqlen: int, tokens: int = PAPER_TOKENS, hidden: int = PAPER_HIDDEN
) -> tuple[int, int]:
    """``(batch, heads)`` of the paper grid's rule: ``tokens // seqlen`` (at least 1) sequences
    of ``hidden // headdim`` heads. Raises ValueError if ``hidden`` is not a multiple of it."""
    if hidden % headdim:
        raise ValueError(f"hidden {hidden} is not a multiple of head dim {headdim}")
    return max(1, tokens // seqlen), hidden // headdim


def paper_grid() -> list[tuple[int, bool, int]]:
    """The paper grid as ``(headdim, causal, seqlen)``, head dim then mask then seqlen."""
    return [
        (headdim, mask == "causal", seqlen)
        for headdim in PAPER_HEADDIMS
        for mask in PAPER_MASKS
        for seqlen in PAPER_SEQLENS
    ]


# ------------------------------------------------------------------------------------------------
# Specs


@dataclass(frozen=True)
class Shape:
    """The sequence-level shape a ``ScheduleSpec`` was tiled from (shape-level arguments only)."""

    seqlen_q: int
    seqlen_k: int
    headdim: int
    block_m: int
    block_n: int
    # The tensors' kv heads where the backward splits GQA by q head (one chain per q head: the
    # spec then has ``q_heads`` kv heads); None without a split.
    split_kv_heads: int | None = None


def analysis_spec(
    problem: Problem,
    workers: int,
    invariant: bool = True,
    backend: str = "triton",
    gqa_split: bool | None = None,
) -> tuple[ScheduleSpec, Shape]:
    """The spec the ``backend`` backward ("triton" or "hopper") runs for ``problem`` on a
    ``workers``-SM Hopper GPU, and the shape it was tiled from (``gqa_split`` as
    ``make_backward_plan``'s). Raises ValueError / NotImplementedError (e.g. an unknown head
    dim). The hopper tiles are a table, so no CuTe DSL is needed to analyse them."""
    if backend == "hopper":
        if problem.headdim not in hopper.BWD_HEADDIMS:
            raise NotImplementedError(
                f"the hopper backward has head dims {list(hopper.BWD_HEADDIMS)}, "
                f"not {problem.headdim}"
            )
        tiles = hopper.bwd_tiles(problem.headdim, problem.mask.causal)
    elif backend == "triton":
        _, _, tiles = choose_backend(problem, analysis_device(workers), "triton", "tma")
    else:
        raise ValueError(f"backend must be 'triton' or 'hopper', got {backend!r}")
    split = resolve_gqa_split(problem.heads, problem.kv_heads, gqa_split)
    # The model analyses the deterministic backward, whose hopper kernel sums dK/dV in order.
    dkv_sum = kernel_sums_dkv(backend, True, split)
    spec = replace(
        backward_spec(problem, tiles, workers, gqa_split=split, dkv_sum=dkv_sum),
        invariant=invariant,
    )
    shape = Shape(
        problem.seqlen_q, problem.seqlen_k, problem.headdim, tiles.block_m, tiles.block_n,
        problem.kv_heads if split else None,
    )  # fmt: skip
    return spec, shape


def varlen_analysis_spec(
    seqlens: Sequence[tuple[int, int]],
    heads: int,
    kv_heads: int,
    headdim: int,
    mask: Mask,
    workers: int,
    invariant: bool = True,
    gqa_split: bool | None = None,
) -> tuple[ScheduleSpec, Shape]:
    """``analysis_spec`` of packed sequences: the tiles of the longest, then
    ``ScheduleSpec.from_seqlens``. The shape holds the longest lengths."""
    longest_q = max(max(q for q, _ in seqlens), 1)
    longest_k = max(max(k for _, k in seqlens), 1)
    problem = Problem(len(seqlens), longest_q, longest_k, heads, kv_heads, headdim, mask)
    _, _, tiles = choose_backend(problem, analysis_device(workers), "triton", "tma")
    split = resolve_gqa_split(heads, kv_heads, gqa_split)
    spec = ScheduleSpec.from_seqlens(
        seqlens=seqlens,
        q_heads=heads,
        # The plan's GQA split: one chain per q head, as if there were ``heads`` kv heads.
        kv_heads=heads if split else kv_heads,
        block_m=tiles.block_m,
        block_n=tiles.block_n,
        mask=mask,
        workers=workers,
        invariant=invariant,
    )
    split_kv = kv_heads if split else None
    return spec, Shape(longest_q, longest_k, headdim, tiles.block_m, tiles.block_n, split_kv)


def square_spec(
    headdim: int,
    seqlen: int,
    batch: int,
    heads: int,
    causal: bool,
    workers: int,
    backend: str = "triton",
) -> ScheduleSpec:
    """``analysis_spec`` of a square MHA shape (the benchmarks' configs)."""
    problem = Problem(batch, seqlen, seqlen, heads, heads, headdim, Mask(causal=causal))
    return analysis_spec(problem, workers, backend=backend)[0]


def sweep_specs(workers: int = DEFAULT_WORKERS) -> list[tuple[ScheduleSpec, Shape]]:
    """The paper grid, tiled with this repo's backward tiles (full before causal per seqlen)."""
    configs = []
    for headdim in PAPER_HEADDIMS:
        for seqlen in PAPER_SEQLENS:
            for causal in (False, True):
                batch, heads = paper_batch_heads(headdim, seqlen)
                problem = Problem(batch, seqlen, seqlen, heads, heads, headdim, Mask(causal))
                configs.append(analysis_spec(problem, workers))
    return configs


# ------------------------------------------------------------------------------------------------
# Analyses


@dataclass(frozen=True)
class Analysis:
    """One schedule of one spec: its tables, the model's timing and the validator's verdict."""

    schedule: Schedule
    sim: SimResult
    report: ValidationReport

    @property
    def name(self) -> str:
        return self.schedule.name


def analyse(name: str, spec: ScheduleSpec, cost_c: float = 1.0, cost_r: float = 1.0) -> Analysis:
    """Build schedule ``name`` (``"auto"`` allowed) for ``spec``, validate and simulate it."""
    if name == "auto":
        name = auto_schedule_name(spec)
    # Call the generator directly, not the lru-cached make_schedule: a sweep builds each table
    # once, and caching them would pin a few hundred MB for nothing.
    schedule = GENERATORS[name](spec)
    report = validate(schedule, raise_on_error=False)
    if not report.valid:
        # A schedule that fails validation may deadlock; simulating it has no meaning.
        raise AnalysisError(
            f"schedule {name!r} is invalid for this shape: {'; '.join(report.errors)}"
        )
    sim = simulate(schedule, cost_compute=cost_c, cost_reduce=cost_r)
    return Analysis(schedule=schedule, sim=sim, report=report)


def model_speedups(makespans: Mapping[str, float], baseline: str = BASELINE) -> dict[str, float]:
    """The model speedup of each schedule: ``makespan[baseline] / makespan[name]``.

    The one definition shared by the CLI, the benchmark model and the tools. A zero makespan (an
    empty schedule) gives ``inf`` rather than raising; the baseline must be among the names.
    """
    base = makespans[baseline]
    return {name: base / m if m else float("inf") for name, m in makespans.items()}


def makespans(analyses: Iterable[Analysis]) -> dict[str, float]:
    return {a.name: float(a.sim.makespan) for a in analyses}


def record(analysis: Analysis, cost_c: float, cost_r: float) -> dict[str, Any]:
    """The JSON fields of one analysed schedule, spec fields included.

    The spec's mask is written as ``"mask": "full" | "causal"`` plus ``"causal": bool`` (the key
    of the JSON before masks were values; kept so that readers of old files need no change).
    """
    schedule, sim, report = analysis.schedule, analysis.sim, analysis.report
    out: dict[str, Any] = {
        "schedule": schedule.name,
        "dispatch": schedule.dispatch.value,
        "makespan": float(sim.makespan),
        "critical_path": float(sim.critical_path),
        "lower_bound": float(sim.lower_bound),
        "bubble_fraction": float(sim.bubble_fraction),
        "workers": schedule.spec.workers,
        "chains": schedule.num_chains,
        "tasks": schedule.num_steps,
        "valid": bool(report.valid),
        "depth_monotone": bool(report.depth_monotone),
        "non_monotone_edges": int(report.non_monotone_edges),
        "num_rank_edges": int(report.num_rank_edges),
        "cost_c": cost_c,
        "cost_r": cost_r,
    }
    for key, value in spec_fields(schedule.spec).items():
        out.setdefault(key, value)
    return out


def spec_fields(spec: ScheduleSpec) -> dict[str, Any]:
    """The spec as JSON fields: its dataclass fields, the mask by name and ``causal``."""
    fields = {k: v for k, v in asdict(spec).items() if k != "mask"}
    return {**fields, "mask": spec.mask.name, "causal": spec.mask.causal}


# ------------------------------------------------------------------------------------------------
# Text


def num(value: float) -> str:
    """A makespan as text: integers without decimals (c = r = 1 gives step counts)."""
    return f"{value:.0f}" if float(value).is_integer() else f"{value:.2f}"


def text_table(header: Sequence[str], rows: Sequence[Sequence[str]], left: int = 0) -> str:
    """Aligned plain text: the first ``left`` columns left-aligned, the others right-aligned."""
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows, strict=True)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(
            str(c).ljust(w) if i < left else str(c).rjust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    return "\n".join([line(header), line(["-" * w for w in widths]), *map(line, rows)])


def describe(spec: ScheduleSpec, shape: Shape | None) -> str:
    """A one-line description of the problem, for titles and headers."""
    mask = spec.mask.name
    heads = f"{spec.q_heads} head{'s' if spec.q_heads > 1 else ''}"
    if shape is not None and shape.split_kv_heads is not None:
        heads += f" ({shape.split_kv_heads} kv, a chain per q head)"
    elif spec.kv_heads != spec.q_heads:
        heads += f" ({spec.kv_heads} kv)"
    if shape is not None:
        seq = f"seqlen {shape.seqlen_q}" + (
            f"/{shape.seqlen_k}" if shape.seqlen_k != shape.seqlen_q else ""
        )
        if spec.seqlens is not None and not spec.is_uniform():
            lengths = [q if q == k else f"{q}/{k}" for q, k in spec.seqlens]
            shown = ",".join(map(str, lengths[:8])) + (",..." if len(lengths) > 8 else "")
            seq = f"seqlens {shown} (varlen)"
        head = f"{seq}, hdim {shape.headdim}, batch {spec.batch}, {heads}, {mask}"
        tiles = f"{shape.block_m}x{shape.block_n} tiles: {spec.q_tiles} Q x {spec.kv_tiles} KV"
        order = "" if spec.invariant else "; worker-dependent order"
        return f"{head}; {tiles}; {spec.workers} workers{order}"
    ratio = f", tile ratio {spec.tile_ratio}" if spec.tile_ratio != 1 else ""
    return (
        f"{spec.q_tiles} Q x {spec.kv_tiles} KV tiles{ratio}, batch {spec.batch}, {heads}, "
        f"{mask}; {spec.workers} workers"
    )


def compare_table(analyses: Sequence[Analysis], auto_name: str) -> str:
    """Side-by-side text table of schedules for one spec."""
    speedups = (
        model_speedups(makespans(analyses)) if any(a.name == BASELINE for a in analyses) else {}
    )
    rows = []
    for a in analyses:
        speedup = f"{speedups[a.name]:.3f}x" if speedups else "-"
        rows.append(
            [
                a.name + (" (auto)" if a.name == auto_name else ""),
                a.schedule.dispatch.value,
                num(a.sim.makespan),
                num(a.sim.critical_path),
                num(a.sim.lower_bound),
                f"{100 * a.sim.bubble_fraction:.1f}%",
                "yes" if a.report.depth_monotone else f"no ({a.report.non_monotone_edges})",
                speedup,
            ]
        )
    header = ["schedule", "dispatch", "makespan", "critical path", "lower bound", "bubble"]
    header += ["depth-monotone", f"vs {BASELINE}"]
    return text_table(header, rows, left=2)


def summary(a: Analysis, auto_name: str, shape_text: str, cost_c: float, cost_r: float) -> str:
    """The text report of one schedule."""
    sim, report = a.sim, a.report
    auto = " (auto)" if a.name == auto_name else ""
    monotone = (
        "yes"
        if report.depth_monotone
        else f"no ({report.non_monotone_edges} of {report.num_rank_edges} rank edges go back)"
    )
    return "\n".join(
        [
            f"schedule    {a.name}{auto}, {a.schedule.dispatch.value} dispatch",
            f"shape       {shape_text}",
            f"work        {a.schedule.num_chains} chains, {a.schedule.num_steps} tasks, "
            f"cost C = {num(cost_c)}, R = {num(cost_r)}",
            f"makespan    {num(sim.makespan)} (lower bound {num(sim.lower_bound)}, critical path "
            f"{num(sim.critical_path)}, bubble {100 * sim.bubble_fraction:.1f}%)",
            f"valid       {'yes' if report.valid else 'no'}; depth-monotone {monotone}",
        ]
    )


def is_tiny(spec: ScheduleSpec) -> bool:
    """Small enough that the ASCII grid is printed unasked."""
    return spec.workers <= TINY_WORKERS and spec.num_tasks() <= TINY_TASKS


# ------------------------------------------------------------------------------------------------
# One spec


@dataclass(frozen=True)
class SpecReport:
    """What ``dash-attn schedule`` computed for one spec: the chosen schedule and, with
    ``--compare``, every applicable one (the chosen one included, in registration order)."""

    spec: ScheduleSpec
    shape: Shape | None
    requested: str
    auto_name: str
    chosen: Analysis
    analyses: tuple[Analysis, ...]
    cost_c: float
    cost_r: float

    @property
    def title(self) -> str:
        return describe(self.spec, self.shape)


def report_spec(
    spec: ScheduleSpec,
    shape: Shape | None,
    requested: str,
    *,
    compare: bool,
    cost_c: float = 1.0,
    cost_r: float = 1.0,
) -> SpecReport:
    """Analyse ``requested`` (``"auto"`` or a name that fits the mask; ValueError otherwise)."""
    auto_name = auto_schedule_name(spec)
    names = applicable_schedules(spec)
    name = auto_name if requested == "auto" else requested
    if name not in names:
        raise ValueError(
            f"{name!r} does not apply to the {spec.mask.name} mask; choose from "
            f"{', '.join(['auto', *names])}"
        )
    chosen = analyse(name, spec, cost_c, cost_r)
    analyses = [chosen]
    if compare:
        analyses = [chosen if n == name else analyse(n, spec, cost_c, cost_r) for n in names]
    return SpecReport(spec, shape, requested, auto_name, chosen, tuple(analyses), cost_c, cost_r)


def spec_json(rep: SpecReport, *, compare: bool, ascii_grid: bool) -> dict[str, Any]:
    """The JSON object of ``dash-attn schedule --json`` for one spec."""
    out = record(rep.chosen, rep.cost_c, rep.cost_r)
    out["requested_schedule"] = rep.requested
    if rep.shape is not None:
        out.update(asdict(rep.shape))
    if compare:
        speedups = model_speedups(makespans(rep.analyses))
        out["compare"] = [
            {**record(a, rep.cost_c, rep.cost_r), "speedup_vs_fa3": speedups[a.name]}
            for a in rep.analyses
        ]
    if ascii_grid:
        out["ascii"] = {a.name: render_ascii(a.schedule) for a in rep.analyses}
    return out


def spec_text(rep: SpecReport, *, compare: bool, ascii_grid: bool) -> str:
    """The text output of ``dash-attn schedule`` for one spec."""
    if compare:
        parts = [
            f"{rep.title}; cost C = {num(rep.cost_c)}, R = {num(rep.cost_r)}",
            compare_table(rep.analyses, rep.auto_name),
        ]
    else:
        parts = [summary(rep.chosen, rep.auto_name, rep.title, rep.cost_c, rep.cost_r)]
    if ascii_grid:
        for a in rep.analyses:
            parts += ["", render_ascii(a.schedule)]
    return "\n".join(parts)


# ------------------------------------------------------------------------------------------------
# The paper sweep

SWEEP_JSON_FIELDS = (
    "dispatch",
    "makespan",
    "critical_path",
    "lower_bound",
    "bubble_fraction",
    "valid",
    "depth_monotone",
)


@dataclass(frozen=True)
class Sweep:
    """Every applicable schedule analysed on every config of the paper grid."""

    workers: int
    cost_c: float
    cost_r: float
    results: tuple[tuple[ScheduleSpec, Shape, dict[str, Analysis]], ...]
    seconds: float


def run_sweep(workers: int = DEFAULT_WORKERS, cost_c: float = 1.0, cost_r: float = 1.0) -> Sweep:
    """Analyse the paper grid (about 10 s on one core at 132 workers)."""
    started = time.perf_counter()
    results = []
    for spec, shape in sweep_specs(workers):
        analyses = {n: analyse(n, spec, cost_c, cost_r) for n in applicable_schedules(spec)}
        results.append((spec, shape, analyses))
    return Sweep(workers, cost_c, cost_r, tuple(results), time.perf_counter() - started)


def sweep_json(sweep: Sweep) -> dict[str, Any]:
    """The JSON object of the default sweep (``dash-attn --json``)."""
    configs = []
    for spec, shape, analyses in sweep.results:
        speedups = model_speedups(makespans(analyses.values()))
        schedules = {}
        for name, a in analyses.items():
            fields = record(a, sweep.cost_c, sweep.cost_r)
            schedules[name] = {key: fields[key] for key in SWEEP_JSON_FIELDS}
            schedules[name]["speedup_vs_fa3"] = speedups[name]
        configs.append({**spec_fields(spec), **asdict(shape), "schedules": schedules})
    return {
        "sweep": f"{PAPER_TOKENS} tokens, hidden {PAPER_HIDDEN}, MHA (paper section 5.2)",
        "workers": sweep.workers,
        "cost_c": sweep.cost_c,
        "cost_r": sweep.cost_r,
        "seconds": round(sweep.seconds, 3),
        "configs": configs,
    }


def sweep_text(sweep: Sweep) -> str:
    """The table of the default sweep: each schedule's model speedup over fa3 per config."""
    others = [n for n in schedule_names() if n != BASELINE]
    rows = []
    for spec, shape, analyses in sweep.results:
        base = analyses[BASELINE].sim
        speedups = model_speedups(makespans(analyses.values()))
        cells = []
        for name in others:
            a = analyses.get(name)
            mark = "" if a is None or a.report.depth_monotone else "*"
            cells.append("-" if a is None else f"{speedups[name]:.3f}x{mark}")
        rows.append(
            [
                str(shape.headdim),
                str(shape.seqlen_q),
                str(spec.batch),
                str(spec.q_heads),
                spec.mask.name,
                f"{spec.q_tiles}x{spec.kv_tiles}",
                num(base.makespan),
                *cells,
                f"{base.makespan / base.lower_bound:.3f}x",
            ]
        )
    header = ["hdim", "seqlen", "batch", "heads", "mask", "Q x KV tiles", f"{BASELINE} makespan"]
    header += [*others, "bound"]
    return "\n".join(
        [
            f"DASH cost model: predicted backward speedup over {BASELINE} (the deterministic FA3 "
            f"order) on {sweep.workers} workers, C = {num(sweep.cost_c)}, "
            f"R = {num(sweep.cost_r)}.",
            f"Paper grid: {PAPER_TOKENS} tokens, hidden {PAPER_HIDDEN} (heads = {PAPER_HIDDEN}"
            "/hdim), tiles from dash_attn.plan.",
            text_table(header, rows, left=5),
            f"\nbound: {BASELINE} makespan / lower bound, the most any schedule could gain. "
            "'-': not applicable to the mask.\n'*': not depth-monotone (some dQ reductions wait "
            f"on a deeper step of another worker).\n{len(rows)} configurations in "
            f"{sweep.seconds:.1f} s.",
        ]
    )


def to_json(payload: Any) -> str:
    return json.dumps(payload, indent=2)
