"""tools/targets_table.py: each config from the newest run that timed both providers, off-grid
rows ignored, the counts, and the README's table generated from the committed runs."""

from __future__ import annotations

import doctest
import gzip
import shutil
from pathlib import Path

import pytest

from dash_attn.bench.report import CSV_FIELDS, write_csv
from tools import targets_table

REPO = Path(__file__).resolve().parents[1]


def _row(provider: str, tflops: float, date: str, **over: object) -> dict:
    row = {
        "gpu": "NVIDIA H200", "sm_count": 132, "torch": "2.11", "triton": "3.6",
        "commit": date[-4:], "date": date, "mode": "bwd", "dtype": "bf16", "headdim": 64,
        "seqlen": 1024, "batch": 16, "heads": 32, "causal": False, "provider": provider,
        "deterministic": provider.endswith(("auto", "_det")), "schedule": "",
        "ms": 1000 / tflops, "tflops": tflops, "bitwise_repeatable": "", "kernel": "",
        "ms_rounds": f"{1000 / tflops:.4f} {1000 / tflops:.4f}",
    }  # fmt: skip
    row.update(over)
    return row


OLD, NEW = "2026-12-01T00:00:00+00:00", "2026-12-02T00:00:00+00:00"


def _write_run(results: Path, name: str, rows: list[dict]) -> None:
    """A run folder ``results/name`` holding ``rows`` as its bench.csv."""
    (results / name).mkdir()
    write_csv(results / name / "bench.csv", rows, CSV_FIELDS)


def test_doctests_run() -> None:
    result = doctest.testmod(targets_table)
    assert result.attempted > 0 and result.failed == 0


def test_each_config_takes_the_newest_run_that_timed_both(tmp_path: Path) -> None:
    old, new = OLD, NEW
    _write_run(tmp_path, "old", [
        _row("dash_hopper_auto", 110.0, old), _row("fa4_det", 100.0, old),
        _row("dash_hopper_nondet", 100.0, old),
        _row("dash_hopper_auto", 90.0, old, seqlen=2048, batch=8),
        _row("fa4_det", 100.0, old, seqlen=2048, batch=8),
    ])  # fmt: skip
    # The newer run: 1k without FA4 (so 1k stays with the old run), 2k with both, and a row off
    # the grid (batch 1 at 1k is not 16384 tokens) that must not count.
    _write_run(tmp_path, "new", [
        _row("dash_hopper_auto", 130.0, new),
        _row("dash_hopper_auto", 95.0, new, seqlen=2048, batch=8),
        _row("fa4_det", 100.0, new, seqlen=2048, batch=8),
        _row("dash_hopper_auto", 50.0, new, seqlen=2048, batch=1),
        _row("fa4_det", 100.0, new, seqlen=2048, batch=1),
    ])  # fmt: skip
    runs = targets_table.newest_runs(tmp_path)
    assert [name for name, _ in runs] == ["new", "old"]
    found = targets_table.latest(runs, "bwd", "dash_hopper_auto", "fa4_det")
    assert {key: (round(c.ratio, 3), run) for key, (c, run) in found.items()} == {
        ("bwd", 64, False, 1024): (1.1, "old"),
        ("bwd", 64, False, 2048): (0.95, "new"),
    }
    table, counts = targets_table.backward_table(runs)
    row_1k = "| 64 | full | 1k | 1.10x (1.10-1.10) | >= 1.10x | yes | 1.10x (1.10-1.10) yes |"
    assert row_1k in table
    assert "| 64 | full | 2k | 0.95x (0.95-0.95) | >= 1.10x | **no** | - |" in table
    assert counts[0].startswith("- det / FA4-det >= 0.9x (the floor): 2 of 2 configs; >= 1.0x")
    assert "1 of 2." in counts[1] and counts[2].endswith("1 of 1.")


def test_a_row_names_both_runs_when_det_over_nondet_is_newer(tmp_path: Path) -> None:
    """A newer run that timed det and non-det without FA4 gives the row its det / non-det
    ratio, and the run column names it beside the run of the FA4 comparison."""
    old, new = OLD, NEW
    _write_run(tmp_path, "old", [
        _row("dash_hopper_auto", 110.0, old), _row("fa4_det", 100.0, old),
        _row("dash_hopper_nondet", 100.0, old),
    ])  # fmt: skip
    _write_run(tmp_path, "new", [
        _row("dash_hopper_auto", 99.0, new), _row("dash_hopper_nondet", 100.0, new),
    ])  # fmt: skip
    table, counts = targets_table.backward_table(targets_table.newest_runs(tmp_path))
    row = next(line for line in table.splitlines() if line.startswith("| 64 | full | 1k |"))
    assert "| 1.10x (1.10-1.10) | >= 1.10x | yes | 0.99x (0.99-0.99) yes |" in row
    assert row.endswith("| old (0:00, 2 rounds); det / non-det: new (0:00, 2 rounds) |")
    assert counts[2].endswith("1 of 1.")


def test_forward_takes_fa4_det_where_a_run_timed_only_that(tmp_path: Path) -> None:
    """FA4's det flag changes only its backward: a forward run that timed ``fa4_det`` alone
    counts, and where a run timed both, ``fa4_nondet`` is the one taken."""
    old, new = OLD, NEW
    _write_run(tmp_path, "old", [
        _row("dash_hopper_auto", 100.0, old, mode="fwd"),
        _row("fa4_nondet", 100.0, old, mode="fwd"),
        _row("dash_hopper_auto", 100.0, old, mode="fwd", seqlen=2048, batch=8),
        _row("fa4_nondet", 125.0, old, mode="fwd", seqlen=2048, batch=8),
        _row("fa4_det", 80.0, old, mode="fwd", seqlen=2048, batch=8),
    ])  # fmt: skip
    _write_run(tmp_path, "new", [
        _row("dash_hopper_auto", 110.0, new, mode="fwd"),
        _row("fa4_det", 100.0, new, mode="fwd"),
    ])  # fmt: skip
    table, counts = targets_table.forward_table(targets_table.newest_runs(tmp_path))
    assert "| 64 | full | 1k | 1.10x (1.10-1.10) | yes | new (" in table
    assert "| 64 | full | 2k | 0.80x (0.80-0.80) | **no** | old (" in table
    assert counts == ["- forward / FA4's >= 0.9x: 1 of 2 configs; >= 1.0x: 1 of 2."]


def test_compressed_runs_are_read(tmp_path: Path) -> None:
    date = "2026-12-01T00:00:00+00:00"
    rows = [_row("dash_hopper_auto", 100.0, date, mode="fwd"), _row("fa4_nondet", 100.0, date,
            mode="fwd")]  # fmt: skip
    _write_run(tmp_path, "run", rows)
    plain, packed = tmp_path / "run" / "bench.csv", tmp_path / "run" / "bench.csv.gz"
    with open(plain, "rb") as src, gzip.open(packed, "wb") as dst:
        shutil.copyfileobj(src, dst)
    plain.unlink()
    table, counts = targets_table.forward_table(targets_table.newest_runs(tmp_path))
    assert "| 64 | full | 1k | 1.00x (1.00-1.00) | yes | run (" in table
    assert counts == ["- forward / FA4's >= 0.9x: 1 of 1 configs; >= 1.0x: 1 of 1."]


def test_readme_table_is_generated_from_the_committed_runs() -> None:
    results, readme = REPO / "benchmarks" / "results" / "h200", REPO / "README.md"
    if not (results.is_dir() and readme.is_file()):
        pytest.skip("not a source checkout")
    generated = targets_table.report(results)
    assert generated.count("\n| ") > 100  # every head dim's 12 configs, backward and forward
    assert generated in readme.read_text()


def test_readme_h100_table_is_generated_from_the_committed_runs() -> None:
    """The README's H100 table (every call since session 57 got an H100): the 24 configs of
    head dims 64 and 128, backward and forward."""
    results, readme = REPO / "benchmarks" / "results" / "h100", REPO / "README.md"
    if not (results.is_dir() and readme.is_file()):
        pytest.skip("not a source checkout")
    generated = targets_table.report(results)
    assert generated.count("\n| 64 |") + generated.count("\n| 128 |") >= 48
    assert generated in readme.read_text()


def test_missing_results_folder_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        targets_table.main(["--results", str(tmp_path / "absent")])


def test_by_headdim_table_takes_geometric_means_per_pair(tmp_path: Path) -> None:
    date = "2026-12-01T00:00:00+00:00"
    rows = []
    # Full mask at 1k and 2k: det / FA4-det 1.0 and 1.21 (geomean 1.10); ours det / non-det 1.0
    # at both; FA4-det / FA4 non-det only at 1k (0.8). Causal: det alone, so no pair there.
    for seqlen, det in ((1024, 100.0), (2048, 121.0)):
        batch = 16384 // seqlen
        rows += [
            _row("dash_hopper_auto", det, date, seqlen=seqlen, batch=batch),
            _row("fa4_det", 100.0, date, seqlen=seqlen, batch=batch),
            _row("dash_hopper_nondet", det, date, seqlen=seqlen, batch=batch),
        ]
    rows += [
        _row("fa4_nondet", 125.0, date),
        _row("dash_hopper_auto", 100.0, date, causal=True),
    ]
    _write_run(tmp_path, "run", rows)
    table = targets_table.by_headdim_table(targets_table.newest_runs(tmp_path))
    assert "| 64 | full | 1.10x (1.00-1.21) | 1.00x (1.00-1.00) | 0.80x (0.80-0.80) |" in table
    assert "causal" not in table
