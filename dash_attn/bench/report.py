"""Result files of ``dash-attn bench`` and the tables made from them (no torch needed).

Everything printed comes from rows measured in this run or read back from ``bench.csv``, so the
README tables can be regenerated on any machine:

    python -m dash_attn.bench.report --csv benchmarks/results/h200/bench.csv.gz --readme-table

Output is deterministic for a given file: rows sorted by (mode, head dim, mask, seqlen), provider
columns in the fixed table order of ``providers.provider_names()``, numbers with fixed precision.
"""

from __future__ import annotations

import argparse
import csv
import gzip
import json
import math
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from ..schedule.report import text_table
from .providers import family_of, provider_names

CSV_FIELDS = (
    "gpu",
    "sm_count",
    "torch",
    "triton",
    "commit",
    "date",
    "mode",
    "dtype",
    "headdim",
    "seqlen",
    "batch",
    "heads",
    "causal",
    "provider",
    "deterministic",
    "schedule",
    "ms",
    "tflops",
    "bitwise_repeatable",
    "kernel",  # dash only: tiles, dQ reduction, Q/dO loads (absent in files before 2026-11-29)
    "ms_rounds",  # each interleaved round's ms, space-separated (absent before 2026-12-01)
)
DETERMINISM_FIELDS = (
    "gpu",
    "commit",
    "date",
    "dtype",
    "headdim",
    "seqlen",
    "batch",
    "heads",
    "causal",
    "provider",
    "deterministic",
    "schedule",
    "repeats",
    "max_diff_dq",
    "max_diff_dk",
    "max_diff_dv",
    "bitwise_repeatable",
)
_INT_FIELDS = {
    "sm_count", "headdim", "seqlen", "batch", "heads", "kv_heads", "repeats", "tokens", "hidden",
    "workers", "tasks", "model_rank", "measured_rank",
}  # fmt: skip
_BOOL_FIELDS = {"causal", "deterministic", "bitwise_repeatable"}
_FLOAT_FIELDS = {
    "ms", "tflops", "max_diff_dq", "max_diff_dk", "max_diff_dv", "tokens_per_s", "c_us", "r_us",
    "r_over_c", "model_ms", "measured_ms",
}  # fmt: skip

BASELINE_SCHEDULE = "dash_fa3"
AUTO = "dash_auto"
NONDET = "dash_nondet"
HOPPER_AUTO = "dash_hopper_auto"

Row = dict[str, Any]


# ------------------------------------------------------------------------------------------------
# Files


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else str(value)
    return str(value)


def write_csv(path: Path, rows: Iterable[Mapping[str, Any]], fields: Sequence[str]) -> None:
    """Write ``rows`` with exactly ``fields`` as columns (None -> empty cell), atomically.

    Written to a temporary name first: the sweep rewrites its files after every config, and a run
    killed mid-write must still leave the previous complete file behind.
    """
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(fields), extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            writer.writerow({key: _cell(row.get(key)) for key in fields})
    tmp.replace(path)


def write_json(path: Path, payload: Any) -> None:
    """``json.dump`` with indent, atomically (see ``write_csv``)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(payload, indent=1, default=str) + "\n")
    tmp.replace(path)


def parse_value(key: str, text: str) -> Any:
    """A CSV cell back to its type: ints, floats, bools (``True``/``False``), '' -> None."""
    if text == "":
        return None
    if key in _BOOL_FIELDS:
        return text.strip().lower() in ("true", "1", "yes")
    if key in _INT_FIELDS:
        return int(text)
    if key in _FLOAT_FIELDS or key.endswith(("_ms", "_vs_fa3", "speedup")):
        try:
            return float(text)
        except ValueError:
            return text
    return text


def read_csv(path: Path) -> list[Row]:
    """Rows of a file written by ``write_csv``, with typed values; a path ending in ``.gz`` is
    read through gzip (older result runs are committed compressed)."""
    with _open_result(path) as f:
        return [{k: parse_value(k, v) for k, v in row.items()} for row in csv.DictReader(f)]


def _open_result(path: Path) -> IO[str]:
    """A result file opened as text, through gzip when its name ends in ``.gz``."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    return opener(path, "rt", newline="")


# ------------------------------------------------------------------------------------------------
# Grouping


ConfigKey = tuple[str, int, bool, int]  # (mode, headdim, causal, seqlen)


def config_key(row: Mapping[str, Any]) -> ConfigKey:
    return (str(row["mode"]), int(row["headdim"]), bool(row["causal"]), int(row["seqlen"]))


def by_config(rows: Iterable[Mapping[str, Any]]) -> dict[ConfigKey, dict[str, Mapping[str, Any]]]:
    """``{config: {provider: row}}`` with configs sorted (mode, head dim, full first, seqlen)."""
    grouped: dict[ConfigKey, dict[str, Mapping[str, Any]]] = {}
    for row in rows:
        grouped.setdefault(config_key(row), {})[str(row["provider"])] = row
    return {key: grouped[key] for key in sorted(grouped)}


def provider_order(names: Iterable[str]) -> list[str]:
    """``names`` in table order: known providers first in their fixed order, others sorted."""
    known = provider_names()
    present = set(names)
    return [n for n in known if n in present] + sorted(present - set(known))


def best_det_schedule(providers: Mapping[str, Mapping[str, Any]]) -> str | None:
    """The fastest deterministic dash schedule of a config (``dash_auto`` excluded: it is one of
    them under another name)."""
    candidates = [
        (float(row["tflops"]), name)
        for name, row in providers.items()
        if family_of(name) == "dash" and row.get("deterministic") and name not in (AUTO, NONDET)
    ]
    return max(candidates)[1] if candidates else None


def _tf(providers: Mapping[str, Mapping[str, Any]], name: str | None) -> float | None:
    if name is None or name not in providers:
        return None
    value = providers[name].get("tflops")
    return None if value is None else float(value)


def ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return a / b


def geomean(values: Iterable[float | None]) -> tuple[float | None, int]:
    """Geometric mean of the values that are present, and how many there were."""
    logs = [math.log(v) for v in values if v is not None and v > 0]
    return (math.exp(sum(logs) / len(logs)) if logs else None), len(logs)


def _fmt_tf(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _fmt_ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _seq(seqlen: int) -> str:
    return f"{seqlen // 1024}k" if seqlen >= 1024 and seqlen % 1024 == 0 else str(seqlen)


def _mask(causal: bool) -> str:
    return "causal" if causal else "full"


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]], left: int = 0) -> str:
    align = [":--" if i < left else "--:" for i in range(len(header))]
    lines = [header, align, *rows]
    return "\n".join("| " + " | ".join(cells) + " |" for cells in lines)


# ------------------------------------------------------------------------------------------------
# Tables


def ratio_table(rows: Iterable[Mapping[str, Any]]) -> str:
    """Per config: dash ``auto`` and the best deterministic schedule, and their ratios to FA4
    deterministic, FlexAttention and dash's own ``fa3`` schedule (the deterministic FA3 order)."""
    header = [
        "mode", "hdim", "mask", "seqlen", "auto", "best det", "fa3", "nondet", "fa4_det", "flex",
        "auto/fa4", "auto/flex", "auto/fa3", "best/fa4", "best/flex", "best/fa3",
    ]  # fmt: skip
    out = []
    for (mode, headdim, causal, seqlen), providers in by_config(rows).items():
        auto, best = _tf(providers, AUTO), best_det_schedule(providers)
        best_tf = _tf(providers, best)
        fa4, flex, fa3 = (_tf(providers, n) for n in ("fa4_det", "flex", BASELINE_SCHEDULE))
        auto_sched = providers[AUTO].get("schedule") if AUTO in providers else None
        out.append(
            [
                mode, str(headdim), _mask(causal), _seq(seqlen),
                _fmt_tf(auto) + (f" ({auto_sched})" if auto_sched else ""),
                _fmt_tf(best_tf) + (f" ({best.removeprefix('dash_')})" if best else ""),
                _fmt_tf(fa3), _fmt_tf(_tf(providers, NONDET)), _fmt_tf(fa4), _fmt_tf(flex),
                _fmt_ratio(ratio(auto, fa4)), _fmt_ratio(ratio(auto, flex)),
                _fmt_ratio(ratio(auto, fa3)), _fmt_ratio(ratio(best_tf, fa4)),
                _fmt_ratio(ratio(best_tf, flex)), _fmt_ratio(ratio(best_tf, fa3)),
            ]
        )  # fmt: skip
    return text_table(header, out, left=3)


FORWARD_COMPARISONS = (
    ("dash auto / fa4_nondet", AUTO, "fa4_nondet"),
    ("hopper auto / fa4_nondet", HOPPER_AUTO, "fa4_nondet"),
)


def summary_ratios(rows: Iterable[Mapping[str, Any]]) -> list[tuple[str, str, str, str, int]]:
    """Geometric-mean TFLOPS ratios per (mode, mask, head dim) over the seqlens measured.

    Returns ``(group, comparison, value, detail, n)`` tuples; comparisons: dash auto vs fa4_det,
    vs flex, vs dash_fa3, and deterministic vs non-deterministic for dash and for FA4; forward
    groups also compare with ``fa4_nondet``, the one FA4 forward (its det flag only changes the
    backward), which forward runs time alone.
    """
    comparisons = (
        ("dash auto / fa4_det", AUTO, "fa4_det"),
        ("dash auto / flex", AUTO, "flex"),
        ("dash auto / dash fa3", AUTO, BASELINE_SCHEDULE),
        ("dash auto / dash nondet", AUTO, NONDET),
        ("hopper auto / fa4_det", HOPPER_AUTO, "fa4_det"),
        ("hopper auto / hopper fa3", HOPPER_AUTO, "dash_hopper_fa3"),
        ("hopper auto / hopper nondet", HOPPER_AUTO, "dash_hopper_nondet"),
        ("hopper auto / dash auto", HOPPER_AUTO, AUTO),
        ("fa4_det / fa4_nondet", "fa4_det", "fa4_nondet"),
    )
    groups: dict[tuple[str, bool, int], list[dict[str, Mapping[str, Any]]]] = {}
    for (mode, headdim, causal, _), providers in by_config(rows).items():
        groups.setdefault((mode, causal, headdim), []).append(providers)
    out = []
    for (mode, causal, headdim), configs in sorted(groups.items()):
        name = f"{mode} {_mask(causal)} hdim {headdim}"
        for label, num, den in comparisons + (FORWARD_COMPARISONS if mode == "fwd" else ()):
            ratios = [ratio(_tf(p, num), _tf(p, den)) for p in configs]
            value, n = geomean(ratios)
            present = [r for r in ratios if r is not None]
            detail = f"{min(present):.2f}x..{max(present):.2f}x" if present else ""
            out.append((name, label, _fmt_ratio(value), detail, n))
    return out


def summary_table(
    rows: Iterable[Mapping[str, Any]], markdown: bool = False, only_measured: bool = False
) -> str:
    """Geometric-mean ratios per config group; a ratio whose providers the run lacks shows "-"
    (or, with ``only_measured``, is left out: a run of a few providers; "" if none is left)."""
    header = ["config", "ratio", "geomean", "range", "configs"]
    body = [
        [g, c, v, d, str(n)] for g, c, v, d, n in summary_ratios(rows) if n or not only_measured
    ]
    if not body:
        return ""
    return markdown_table(header, body, left=2) if markdown else text_table(header, body, left=2)


def readme_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str] | None = None) -> str:
    """Markdown: one row per config, one TFLOPS column per provider; the best deterministic value
    of each row in bold."""
    grouped = by_config(rows)
    names = provider_order({str(r["provider"]) for r in rows})
    if columns:
        names = [n for n in names if n in set(columns)]
    modes = len({key[0] for key in grouped}) > 1  # a mode column only when it tells rows apart
    header = [*(["mode"] if modes else []), "hdim", "mask", "seqlen", *names]
    body = []
    for (mode, headdim, causal, seqlen), providers in grouped.items():
        det = [
            _tf(providers, n)
            for n in names
            if n in providers and providers[n].get("deterministic") and _tf(providers, n)
        ]
        top = max(det) if det else None
        cells = []
        for n in names:
            value = _tf(providers, n)
            text = _fmt_tf(value)
            if value is not None and value == top and providers[n].get("deterministic"):
                text = f"**{text}**"
            cells.append(text)
        key = [str(headdim), _mask(causal), _seq(seqlen)]
        body.append([*([mode] if modes else []), *key, *cells])
    return markdown_table(header, body, left=len(header) - len(names) - 1)


def header_line(info: Mapping[str, Any]) -> str:
    """The one-line machine description printed first and stored in bench.json."""
    parts = [f"GPU {info.get('gpu', 'unknown')}"]
    if info.get("sm_count"):
        parts[0] += f" ({info['sm_count']} SMs)"
    for key, label in (
        ("driver", "driver"),
        ("cuda", "CUDA"),
        ("torch", "torch"),
        ("triton", "triton"),
        ("cudnn", "cuDNN"),
        ("flash_attn_4", "flash-attn-4"),
        ("commit", "commit"),
        ("date", "date"),
    ):
        if info.get(key) not in (None, ""):
            parts.append(f"{label} {info[key]}")
    return ", ".join(parts)


def _readme_provenance(csv_path: Path, rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The machine line and the command, from bench.json (or the committed bench.json.gz)
    beside the CSV when it is there."""
    metas = [Path(csv_path).with_name(name) for name in ("bench.json", "bench.json.gz")]
    meta = next((path for path in metas if path.exists()), None)
    lines = []
    if meta is not None:
        with _open_result(meta) as f:
            payload = json.load(f)
        header = payload.get("header", {})
        lines.append(f"Machine: {header_line(header)}.")
        argv = payload.get("argv")
        if argv is not None:
            shown = []
            skip = False
            for arg in argv:
                if skip:
                    skip = False
                    continue
                if arg == "--out-dir":
                    skip = True
                    continue
                if not arg.startswith("--out-dir="):
                    shown.append(arg)
            # argv is the CLI's own: it starts with the subcommand ("bench") when there is one.
            if shown[:1] == ["bench"]:
                shown = shown[1:]
            lines.append(f"Command: `{' '.join(['dash-attn', 'bench', *shown])}`")
    elif rows:
        first = rows[0]
        lines.append(
            f"Machine: {first.get('gpu')} ({first.get('sm_count')} SMs), torch "
            f"{first.get('torch')}, triton {first.get('triton')}, commit {first.get('commit')}."
        )
    return lines


def determinism_table(rows: Sequence[Mapping[str, Any]], markdown: bool = False) -> str:
    """The paper's Table 1: max |difference| of dq, dk, dv over repeated backward calls.

    One row per provider, one column per (mask, head dim); a cell is ``0`` when every repeat was
    bitwise equal to the first, else the largest difference of the three gradients.
    """
    columns = sorted({(bool(r["causal"]), int(r["headdim"]), int(r["seqlen"])) for r in rows})
    cells: dict[tuple[str, tuple[bool, int, int]], str] = {}
    for r in rows:
        col = (bool(r["causal"]), int(r["headdim"]), int(r["seqlen"]))
        diffs = [r.get(k) for k in ("max_diff_dq", "max_diff_dk", "max_diff_dv")]
        worst = max((float(d) for d in diffs if d is not None), default=None)
        if r.get("bitwise_repeatable"):
            text = "0"
        elif worst is None:
            text = "-"
        else:
            text = f"{worst:.1e}"
        cells[(str(r["provider"]), col)] = text
    names = provider_order({str(r["provider"]) for r in rows})
    repeats = sorted({int(r["repeats"]) for r in rows if r.get("repeats") is not None})
    header = ["provider", *(f"{_mask(c)} d{d} s{_seq(s)}" for c, d, s in columns)]
    body = [[n, *(cells.get((n, col), "-") for col in columns)] for n in names]
    table = markdown_table(header, body, left=1) if markdown else text_table(header, body, left=1)
    note = (
        f"max |delta| of dq, dk, dv between {'/'.join(map(str, repeats)) or '?'} repeated backward "
        "calls and the first; 0 = bitwise equal."
    )
    return f"{table}\n{note}"


def e2e_table(rows: Sequence[Mapping[str, Any]], markdown: bool = False) -> str:
    """Block forward+backward time per (model, seqlen), dash ``auto``'s speedups and, when the
    rows include it, the hopper backend's ratios to FA4-det and to its own non-det mode."""
    grouped: dict[tuple[str, int, int], dict[str, Mapping[str, Any]]] = {}
    for r in rows:
        key = (str(r["model"]), int(r["seqlen"]), int(r["batch"]))
        grouped.setdefault(key, {})[str(r["provider"])] = r
    names = provider_order({str(r["provider"]) for r in rows})
    # The hopper backend's ratios when the file has its rows (files before session 8 do not).
    hopper = HOPPER_AUTO in names
    header = [
        "model", "seqlen", "batch", *(f"{n} ms" for n in names),
        "auto vs fa3", "auto vs fa4_det", "auto vs nondet",
        *(("hopper vs fa4_det", "hopper vs nondet") if hopper else ()),
    ]  # fmt: skip
    body = []
    for (model, seqlen, batch), providers in sorted(grouped.items()):

        def ms(name: str, providers: Mapping[str, Mapping[str, Any]] = providers) -> float | None:
            row = providers.get(name)
            return None if row is None or row.get("ms") is None else float(row["ms"])

        auto = ms(AUTO)
        body.append(
            [
                model, _seq(seqlen), str(batch),
                *("-" if ms(n) is None else f"{ms(n):.2f}" for n in names),
                _fmt_ratio(ratio(ms(BASELINE_SCHEDULE), auto)),
                _fmt_ratio(ratio(ms("fa4_det"), auto)),
                _fmt_ratio(ratio(ms(NONDET), auto)),
                *(
                    (
                        _fmt_ratio(ratio(ms("fa4_det"), ms(HOPPER_AUTO))),
                        _fmt_ratio(ratio(ms("dash_hopper_nondet"), ms(HOPPER_AUTO))),
                    )
                    if hopper
                    else ()
                ),
            ]
        )  # fmt: skip
    if markdown:
        return markdown_table(header, body, left=1)
    return text_table(header, body, left=1)


# ------------------------------------------------------------------------------------------------
# Command line


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m dash_attn.bench.report",
        description="Tables from the files written by 'dash-attn bench'.",
        allow_abbrev=False,
    )
    parser.add_argument("--csv", type=Path, required=True, help="bench.csv of a run")
    parser.add_argument(
        "--readme-table",
        action="store_true",
        help="markdown: TFLOPS per config and provider, then geometric-mean ratios",
    )
    parser.add_argument(
        "--columns", default=None, help="comma list of providers to keep in --readme-table"
    )
    parser.add_argument(
        "--determinism", type=Path, default=None, help="also tabulate this determinism.csv"
    )
    parser.add_argument("--e2e", type=Path, default=None, help="also tabulate this e2e.csv")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    rows = read_csv(args.csv)
    if not rows:
        print(f"{args.csv}: no rows", file=sys.stderr)
        return 1
    columns = args.columns.split(",") if args.columns else None
    if args.readme_table:
        for line in _readme_provenance(args.csv, rows):
            print(line)
            print()
        print("Backward TFLOPS" if {r["mode"] for r in rows} == {"bwd"} else "TFLOPS", end="")
        print(" (bold: fastest deterministic provider of the row).")
        print()
        print(readme_table(rows, columns))
        # The README shows the ratios the run measured (a run of a few providers has few).
        summary = summary_table(rows, markdown=True, only_measured=True)
        if summary:
            print()
            print("Geometric means over the seqlens of each group (range = min..max ratio).")
            print()
            print(summary)
    else:
        print(ratio_table(rows))
        print()
        print(summary_table(rows))
    for path, table in ((args.determinism, determinism_table), (args.e2e, e2e_table)):
        if path is not None:
            print()
            print(table(read_csv(path), markdown=args.readme_table))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
