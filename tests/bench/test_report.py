"""CSV/JSON files and the tables of ``dash_attn.bench.report``."""

from __future__ import annotations

import csv
import gzip
import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest

from dash_attn.bench import report
from dash_attn.bench.providers import provider_names

from .helpers import FACTORS, META, synthetic_rows


def test_csv_round_trip_keeps_types(bench_csv: Path) -> None:
    rows = _read_committed(bench_csv)
    original = synthetic_rows()
    assert len(rows) == len(original)
    assert list(rows[0]) == list(report.CSV_FIELDS)
    for got, want in zip(rows, original, strict=True):
        for key in report.CSV_FIELDS:
            assert got[key] == want.get(key), key
    assert not bench_csv.with_name("bench.csv.tmp").exists()


def test_json_writer(tmp_path: Path) -> None:
    report.write_json(tmp_path / "bench.json", {"header": META, "rows": synthetic_rows()[:2]})
    payload = json.loads((tmp_path / "bench.json").read_text())
    assert payload["header"]["gpu"] == "Test GPU" and len(payload["rows"]) == 2


def test_readme_command_names_the_subcommand_once(
    bench_csv: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # `python -m dash_attn bench ...` records argv with the subcommand first.
    report.write_json(
        bench_csv.with_name("bench.json"),
        {"header": META, "argv": ["bench", "--e2e", "--out-dir", "$OUT/h200", "--commit", "abc"]},
    )
    assert report.main(["--csv", str(bench_csv), "--readme-table"]) == 0
    assert "Command: `dash-attn bench --e2e --commit abc`" in capsys.readouterr().out


def test_readme_provenance_reads_a_gzipped_bench_json(
    bench_csv: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Committed runs keep bench.json gzipped: the machine line and the command still come
    from it, as from the plain file."""
    import gzip

    payload = {"header": META, "argv": ["bench", "--rounds", "2", "--commit", "abc"]}
    report.write_json(bench_csv.with_name("bench.json"), payload)
    assert report.main(["--csv", str(bench_csv), "--readme-table"]) == 0
    plain = capsys.readouterr().out
    meta = bench_csv.with_name("bench.json")
    with meta.open("rb") as src, gzip.open(meta.with_name("bench.json.gz"), "wb") as dst:
        dst.write(src.read())
    meta.unlink()
    assert report.main(["--csv", str(bench_csv), "--readme-table"]) == 0
    packed = capsys.readouterr().out
    assert packed == plain and "Command: `dash-attn bench --rounds 2 --commit abc`" in packed


def test_readme_table_from_csv(bench_csv: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report.write_json(
        bench_csv.with_name("bench.json"),
        {"header": META, "argv": ["--quick", "--out-dir", "/tmp/x", "--rep", "50"]},
    )
    assert report.main(["--csv", str(bench_csv), "--readme-table"]) == 0
    first = capsys.readouterr().out
    assert report.main(["--csv", str(bench_csv), "--readme-table"]) == 0
    assert capsys.readouterr().out == first  # deterministic
    lines = first.splitlines()
    assert lines[0].startswith("Machine: GPU Test GPU (132 SMs)")
    assert "Command: `dash-attn bench --quick --rep 50`" in first
    table = [line for line in lines if line.startswith(("| 64 |", "| 128 |"))]
    assert len(table) == 16  # 2 head dims x 2 masks x 4 seqlens
    header = next(line for line in lines if line.startswith("| hdim"))
    columns = [c.strip() for c in header.strip("|").split("|")]
    assert columns[:3] == ["hdim", "mask", "seqlen"]  # one mode: no mode column
    assert columns[3:] == [n for n in provider_names() if n in FACTORS]
    # Bold marks the fastest deterministic provider (dash_auto/shift tie at 1.2x the curve).
    row = table[0].strip("|").split("|")
    cells = dict(zip(columns, (c.strip() for c in row), strict=True))
    assert cells["dash_auto"].startswith("**") and not cells["dash_nondet"].startswith("**")
    assert cells["seqlen"] == "512" and table[1].split("|")[3].strip() == "1k"
    # Geometric means: exact ratios of the synthetic factors.
    summary = [line for line in lines if line.startswith("| bwd full hdim 64")]
    values = {line.split("|")[2].strip(): line.split("|")[3].strip() for line in summary}
    assert values["dash auto / fa4_det"] == f"{1.2 / 0.96:.2f}x"
    assert values["dash auto / flex"] == f"{1.2 / 0.8:.2f}x"
    assert values["dash auto / dash fa3"] == "1.20x"
    assert values["dash auto / dash nondet"] == f"{1.2 / 1.25:.2f}x"
    assert values["fa4_det / fa4_nondet"] == f"{0.96 / 1.28:.2f}x"


def test_readme_table_of_a_few_providers_has_only_measured_ratios(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run of a few providers: the summary lists the ratios it measured, and is left out
    when it measured none."""
    rows = synthetic_rows()
    for keep, expect in ((("dash_auto", "fa4_det"), ["dash auto / fa4_det"]), (("flex",), [])):
        path = tmp_path / "-".join(keep) / "bench.csv"
        path.parent.mkdir()
        report.write_csv(path, [r for r in rows if r["provider"] in keep], report.CSV_FIELDS)
        assert report.main(["--csv", str(path), "--readme-table"]) == 0
        out = capsys.readouterr().out
        labels = {line.split("|")[2].strip() for line in out.splitlines() if "| bwd " in line}
        assert sorted(labels) == expect
        assert ("Geometric means" in out) == bool(expect)
        assert "| - |" not in out


def test_forward_summary_compares_with_fa4s_one_forward() -> None:
    """FA4 has one forward (its det flag only changes the backward): forward groups compare
    with ``fa4_nondet``, which forward runs time alone; backward groups keep their ratios."""
    fwd = [r for r in synthetic_rows("fwd") if r["provider"] in ("dash_auto", "fa4_nondet")]
    labels = {label for _, label, _, _, n in report.summary_ratios(fwd) if n}
    assert labels == {"dash auto / fa4_nondet"}
    summary = report.summary_ratios(fwd)
    ratios = {g: v for g, label, v, _, _ in summary if label == "dash auto / fa4_nondet"}
    assert ratios["fwd full hdim 64"] == "0.94x"  # dash_auto's factor 1.2 over fa4_nondet's 1.28
    bwd = {label for _, label, _, _, _ in report.summary_ratios(synthetic_rows())}
    assert "dash auto / fa4_nondet" not in bwd and "dash auto / fa4_det" in bwd


def test_ratio_table_names_best_schedule(bench_csv: Path) -> None:
    text = report.ratio_table(_read_committed(bench_csv))
    lines = text.splitlines()
    assert len(lines) == 2 + 16
    causal = next(line for line in lines if " causal " in line)
    assert "(symmetric_shift)" in causal and f"{1.2 / 0.96:.2f}x" in causal
    assert "1.20x" in causal  # auto / fa3


def test_determinism_and_e2e_tables() -> None:
    det = []
    for name, diff in (("dash_fa3", 0.0), ("dash_nondet", 3e-3)):
        det.append(
            {
                **META, "headdim": 128, "seqlen": 4096, "batch": 4, "heads": 16, "causal": True,
                "provider": name, "deterministic": diff == 0, "repeats": 10,
                "max_diff_dq": diff, "max_diff_dk": 0.0, "max_diff_dv": 0.0,
                "bitwise_repeatable": diff == 0,
            }
        )  # fmt: skip
    text = report.determinism_table(det)
    assert "causal d128 s4k" in text
    assert text.splitlines()[2].split() == ["dash_fa3", "0"]
    assert text.splitlines()[3].split() == ["dash_nondet", "3.0e-03"]
    e2e = [
        {"model": "llama3-8b", "seqlen": 8192, "batch": 1, "provider": p, "ms": ms}
        for p, ms in (("dash_auto", 10.0), ("dash_fa3", 12.0), ("fa4_det", 11.0))
    ]
    assert "1.20x" in report.e2e_table(e2e) and "1.10x" in report.e2e_table(e2e)
    assert "hopper vs fa4_det" not in report.e2e_table(e2e)
    # With the hopper rows: its ratios to FA4-det (11 / 8.8) and to its non-det mode (8 / 8.8).
    hopper = e2e + [
        {"model": "llama3-8b", "seqlen": 8192, "batch": 1, "provider": p, "ms": ms}
        for p, ms in (("dash_hopper_auto", 8.8), ("dash_hopper_nondet", 8.0))
    ]
    last = report.e2e_table(hopper).splitlines()[-1].split()
    assert "hopper vs fa4_det" in report.e2e_table(hopper) and last[-2:] == ["1.25x", "0.91x"]


def _load_tool(path: Path) -> ModuleType:
    """A script of tools/ as a module (tools/ is not a package)."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_readme_results_are_generated_from_the_committed_files(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The result tables in the README and in benchmarks/HISTORY.md (the runs by session) are
    exactly what the report makes of benchmarks/results/."""
    repo = Path(__file__).resolve().parents[2]
    results, readme = repo / "benchmarks" / "results" / "h200", repo / "README.md"
    if not (results.is_dir() and readme.is_file()):
        pytest.skip("not a source checkout")
    args = ["--csv", str(results / "bench.csv.gz"), "--readme-table"]
    args += ["--determinism", str(results / "determinism.csv.gz")]
    assert report.main(args) == 0
    generated = capsys.readouterr().out.strip()
    assert generated.splitlines()[0].startswith("Machine: GPU NVIDIA H200")
    assert generated in readme.read_text()
    # (The README's table of every provider is session 43's, bench.csv above.)
    # Session 22's d128 full rows at both clocks, session 28's forward sweep, session 29's
    # sweeps and causal orders, session 32's, 34's and 39's sweeps, and session 13's interleaved
    # host-path table, from their own files (session 18's runs are in git history at 96f6fcc,
    # session 19's and 20's at b887b0f, session 21's at cd36427).
    # The README has the current runs; the earlier ones are in the history, by session.
    readme_text = readme.read_text()
    text = (repo / "benchmarks" / "HISTORY.md").read_text()
    h100 = repo / "benchmarks" / "results" / "h100"
    session28 = results / "session28-96f6fcc" / "call4-96f6fcc"
    session29 = results / "session29-01bb4dd"
    session39 = results / "session39-20fa759"
    for path, doc in (
        (session28 / "fwd" / "bench.csv", text),
        (results / "session22-cb74eeb" / "call4-5ae0862" / "sustained" / "bench.csv", text),
        (results / "session22-cb74eeb" / "call4-5ae0862" / "boost" / "bench.csv", text),
        (session29 / "call7-b887b0f" / "sweep" / "bench.csv", text),
        (session29 / "call4-c34fc73" / "orders" / "bench.csv", text),
        (results / "session32-1f5e3a2" / "call3-564484a" / "sweep" / "bench.csv", text),
        (results / "session34-e616bec" / "call3-f1921c2" / "sweep" / "bench.csv", text),
        (results / "session34-e616bec" / "call4-f1921c2" / "sweep" / "bench.csv", text),
        # Session 37: head dim 96, backward and forward; session 38: the hd-96 forward with
        # 192-row tiles; session 39: the backward sweep at head dims 64, 96 and 128 and the short
        # causal rerun (in the history since session 53, when newer runs had every head dim).
        (results / "session37-a31ae6c" / "call1-0a5e68d" / "bwd96" / "bench.csv", text),
        (results / "session38-ace4448" / "call2" / "fwd96" / "bench.csv", text),
        (session39 / "call4-7975996" / "sweep-bwd" / "bench.csv", text),
        (session39 / "call5-7975996" / "c128-cold" / "bench.csv", text),
        # Session 40: the hopper backward at head dims 192 and 256; session 41: the same grid
        # with two dQ warps in deterministic runs (in the history since session 49; session
        # 45's run of that grid is the README's).
        (results / "session40-19760df" / "call3" / "bwd-large" / "bench.csv", text),
        (results / "session41-110f25b" / "call5" / "bwd-large" / "bench.csv", text),
        # Session 42: the forward with skip_unit_rescale at head dims 64-128; session 43's at
        # 192 and 256 with the grouped causal launch order.
        (results / "session42-8a8b3d3" / "call8" / "sweep-fwd" / "bench.csv", readme_text),
        (results / "session43-2d2ab7d" / "call6" / "fwd-large" / "bench.csv", readme_text),
        # Session 45: the backward at 192 and 256 after the merged rounds and the area floor
        # (sessions 45-56's H200 runs are in the history since session 69's run).
        (results / "session45-c166108" / "call6" / "bwd-large" / "bench.csv", text),
        # Session 47: the hd-64 backward with the next chain's K/V prefetched, and session 48's
        # with dK/dV staged too (both in the history since session 50's run).
        (results / "session47-54b87c1" / "call3" / "bwd64" / "bench.csv", text),
        (results / "session48-06c1ec2" / "call1" / "r" / "bwd64" / "bench.csv", text),
        # Session 50: head dims 64 and 128 with the dQ cast beside the main kernel (in the
        # history since session 55's run).
        (results / "session50-5723982" / "call3" / "bwd64" / "bench.csv", text),
        (results / "session50-5723982" / "call3" / "bwd128" / "bench.csv", text),
        # Session 51: head dims 96 and 128 with the dQ cast beside the main kernel everywhere.
        (results / "session51-8c102d0" / "call3" / "bwd96" / "bench.csv", text),
        (results / "session51-8c102d0" / "call3" / "bwd128" / "bench.csv", text),
        # Session 55: head dims 64 and 128 on the kernels shipped now (call 9: the first three
        # hd-128 configs again with eight rounds).
        (results / "session55-73abb0b" / "call7" / "bwd64" / "bench.csv", text),
        (results / "session55-73abb0b" / "call8" / "bwd128" / "bench.csv", text),
        (results / "session55-73abb0b" / "call9" / "bwd128_head" / "bench.csv", text),
        # Session 56: head dim 256 on the kernels shipped now.
        (results / "session56-644086d" / "call3" / "bwd256" / "bench.csv", text),
        # Session 69: every head dim on the kernels shipped now, the H200 table's rows.
        (results / "session69" / "call1" / "bwd64" / "bench.csv.gz", readme_text),
        (results / "session69" / "call1" / "bwd128" / "bench.csv.gz", readme_text),
        (results / "session69" / "call3" / "bwd96" / "bench.csv.gz", readme_text),
        (results / "session69" / "call3" / "bwd192" / "bench.csv.gz", readme_text),
        (results / "session69" / "call3" / "bwd256" / "bench.csv.gz", readme_text),
        (results / "session69" / "call4" / "bwd_long" / "bench.csv.gz", readme_text),
        # Session 58: every provider with "_kf" on both masks, on an H100 (session 57's runs
        # of four providers are in git history at 066a382).
        (h100 / "session58-066a382" / "call4" / "sweep" / "bench.csv.gz", readme_text),
    ):
        rows = _read_committed(path)
        assert report.readme_table(rows).strip() in doc
        assert report.summary_table(rows, markdown=True, only_measured=True).strip() in doc
    orders = _read_committed(session29 / "call4-c34fc73" / "orders" / "determinism.csv")
    assert report.determinism_table(orders, markdown=True).strip() in text
    # Session 55: the end-to-end blocks on the kernels shipped now (session 28's before).
    session55_e2e = results / "session55-73abb0b" / "call3" / "e2e" / "e2e.csv"
    e2e = report.e2e_table(_read_committed(session55_e2e), markdown=True)
    assert "hopper vs fa4_det" in e2e and e2e.strip() in readme_text
    session58_e2e = h100 / "session58-066a382" / "call6" / "e2e" / "e2e.csv.gz"
    e2e = report.e2e_table(_read_committed(session58_e2e), markdown=True)
    assert "hopper vs fa4_det" in e2e and e2e.strip() in readme_text
    session58 = h100 / "session58-066a382" / "call4" / "sweep"
    args = ["--csv", str(session58 / "bench.csv.gz"), "--readme-table"]
    args += ["--determinism", str(session58 / "determinism.csv.gz")]
    assert report.main(args) == 0
    generated = capsys.readouterr().out.strip()
    assert generated.startswith("Machine: GPU NVIDIA H100") and generated in readme_text
    e2e = report.e2e_table(_read_committed(session28 / "e2e" / "e2e.csv"), markdown=True)
    assert "hopper vs fa4_det" in e2e and e2e.strip() in text
    # Session 23: the GQA split's probe table and end-to-end blocks.
    session23 = results / "session23-87322f7"
    e2e = _read_committed(session23 / "call3-87322f7-wip" / "e2e" / "e2e.csv")
    assert report.e2e_table(e2e, markdown=True).strip() in text
    gqa = _load_tool(repo / "tools" / "gqa_split_table.py")
    probe = (session23 / "call1-87322f7" / "gqa_split_probe.txt").read_text()
    rows = gqa.parse(probe)
    assert len(rows) == 10 and all(row["equal"] == "True" for row in rows)
    assert gqa.markdown_table(rows) in text
    # Session 24: the in-kernel dK/dV sums' probe table, end-to-end blocks and six sweep rows.
    session24 = results / "session24-e3c9d1b"
    runs = [
        gqa.parse((session24 / call / "dkv_sum_probe.txt").read_text())
        for call in ("call2-e3c9d1b", "call3-e3c9d1b")
    ]
    assert [len(rows) for rows in runs] == [7, 5]
    rows = gqa.merge(runs)
    assert len(rows) == 10 and all(row["equal"] == "True" for row in rows)
    assert all(row["errors"] is not None for row in rows)
    assert gqa.dkv_sum_markdown_table(rows) in text
    call4 = session24 / "call4-e3c9d1b"
    assert report.e2e_table(_read_committed(call4 / "e2e" / "e2e.csv"), markdown=True) in text
    rows = _read_committed(call4 / "sweep6" / "bench.csv")
    assert report.readme_table(rows).strip() in text
    assert report.summary_table(rows, markdown=True, only_measured=True).strip() in text
    # Session 25: dK/dV through shared memory: the fixed-clock kernel-time table, the sweep and
    # the end-to-end blocks.
    session25 = results / "session25-814acab"
    ab = _load_tool(repo / "tools" / "hopper" / "kernel_ab_table.py")
    calls = [session25 / f"call{i}-814acab-wip" for i in (1, 2, 3)]
    assert ab.markdown_table(calls) in text
    _assert_sweep_and_e2e_tables(
        text, session25 / "call5-2fbfb69" / "sweep", session25 / "call6-2fbfb69" / "e2e"
    )
    # Session 26: the first dQ partial stored: the fixed-clock whole-backward table, the sweep
    # and the end-to-end blocks.
    session26 = results / "session26-851077a"
    whole = _load_tool(repo / "tools" / "hopper" / "backward_ab_table.py")
    assert whole.markdown_table(session26 / "call2-8b65582-wip") in text
    call4 = session26 / "call4-8b65582"
    _assert_sweep_and_e2e_tables(text, call4 / "sweep", call4 / "e2e")
    # Session 30: the causal orders with drain_at_turn, and Nsight Compute of the head-dim-64
    # kernels beside FA4's.
    orders30 = results / "session30-4f6fa3a" / "call7-8908f70" / "orders"
    rows = _read_committed(orders30 / "bench.csv")
    assert report.readme_table(rows).strip() in text
    orders = _read_committed(orders30 / "determinism.csv")
    assert report.determinism_table(orders, markdown=True).strip() in text
    ncu = _load_tool(repo / "tools" / "hopper" / "ncu_summary.py")
    raw = results / "session30-4f6fa3a" / "call2-c63de68" / "raw_d64f8k.csv.gz"
    assert ncu.metric_table(raw, NCU_LABELS_SESSION30) in text
    raw = results / "session41-110f25b" / "call2" / "raw_large_cols.csv.gz"
    assert ncu.metric_table(raw, NCU_LABELS_SESSION41) in text
    session = results / "session13-82f62f0"
    compare = _load_tool(repo / "tools" / "hopper" / "host_paths_table.py")
    with open(session / "call3-82f62f0" / "compare_host_paths.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 24
    assert compare.markdown_table(rows) in text


# The kernels of session 30's ncu_probe.py in launch order (its README table's columns).
NCU_LABELS_SESSION30 = [
    "ours det", "ours non-det", "dq_wg0 det", "dq_wg0 non-det", "FA4 det", "FA4 non-det",
]  # fmt: skip


# The kernels of session 41's ncu_large.py in launch order.
NCU_LABELS_SESSION41 = [
    f"{shape} {who} {mode}"
    for shape in ("d256c", "d192f")
    for who in ("ours", "fa4")
    for mode in ("det", "nondet")
]


def test_ncu_metric_table_needs_one_label_per_kernel(tmp_path: Path) -> None:
    """tools/hopper/ncu_summary.py --table: one column per attention kernel, labels checked;
    --cut keeps the columns the summaries read."""
    repo = Path(__file__).resolve().parents[2]
    raw = repo / "benchmarks/results/h200/session30-4f6fa3a/call2-c63de68/raw_d64f8k.csv.gz"
    if not raw.is_file():
        pytest.skip("not a source checkout")
    ncu = _load_tool(repo / "tools" / "hopper" / "ncu_summary.py")
    table = ncu.metric_table(raw, NCU_LABELS_SESSION30).splitlines()
    assert table[0] == "| metric | " + " | ".join(NCU_LABELS_SESSION30) + " |"
    assert len(table) == 2 + len(ncu.TABLE_ROWS)
    # The first row is the kernel time in ms (ncu exported it in ms or us).
    times = [float(cell) for cell in table[2].strip("|").split("|")[1:]]
    assert all(1.0 < t < 20.0 for t in times)
    with pytest.raises(ValueError, match="6 attention kernels"):
        ncu.metric_table(raw, NCU_LABELS_SESSION30[:5])
    # --cut keeps what the summaries read: both equal the full export's.
    cut = tmp_path / "cut.csv.gz"
    with gzip.open(raw, "rt") as f:
        header = next(csv.reader(f))
    assert ncu.cut_raw(raw, cut) == len(ncu.summary_columns(header))
    labels = NCU_LABELS_SESSION30
    assert ncu.metric_table(cut, labels) == ncu.metric_table(raw, labels)
    # --busiest: the units nearest their peak, the same from the cut; the tensor pipe's row
    # names its aliases (one counter) and holds the table's tensor-pipe values.
    busiest = ncu.busiest_table(cut, labels, 12)
    assert busiest == ncu.busiest_table(raw, labels, 12)
    rows = busiest.splitlines()[2:]
    assert len(rows) == 12
    tensor = next(r for r in rows if "sm__pipe_tensor_cycles_active active" in r)
    assert tensor.endswith("| 59.5 | 61.7 | 58.4 | 62.4 | 65.2 | 64.0 |")
    tops = [max(float(c) for c in r.strip("|").split("|")[1:]) for r in rows]
    assert tops == sorted(tops, reverse=True) and all(0 < t <= 100 for t in tops)
    with pytest.raises(ValueError, match="6 attention kernels"):
        ncu.busiest_table(raw, labels[:5], 12)
    with pytest.raises(SystemExit):
        ncu.main(["--raw", str(raw), "--busiest", "5"])
    assert ncu.raw_summary(cut) == ncu.raw_summary(raw)
    assert cut.stat().st_size < raw.stat().st_size / 5
    with pytest.raises(SystemExit):
        ncu.main(["--source", str(raw), "--table", "a,b"])
    # --memory adds the DRAM and L2 rows (a full set has them); the cut keeps them too.
    memory = ncu.metric_table(cut, labels, memory=True).splitlines()
    assert len(memory) == 2 + len(ncu.TABLE_ROWS) + len(ncu.MEMORY_ROWS)
    hit_rates = [float(cell) for cell in memory[-1].strip("|").split("|")[1:]]
    assert memory[-1].startswith("| L2 hit rate") and all(0 < h <= 100 for h in hit_rates)


def _read_committed(path: Path) -> list[dict]:
    """``report.read_csv`` of a result file, or of its gzipped copy where the tree keeps older
    runs compressed (``bench.csv.gz``)."""
    path = Path(path)
    return report.read_csv(path if path.exists() else path.with_name(path.name + ".gz"))


def _assert_sweep_and_e2e_tables(text: str, sweep: Path, e2e: Path) -> None:
    """A 24-config sweep's TFLOPS table and summary, and the end-to-end table, are in the
    README as the report functions make them from the committed CSVs."""
    rows = _read_committed(sweep / "bench.csv")
    assert len(rows) == 96
    assert report.readme_table(rows).strip() in text
    assert report.summary_table(rows, markdown=True, only_measured=True).strip() in text
    assert report.e2e_table(_read_committed(e2e / "e2e.csv"), markdown=True).strip() in text


def test_readme_packed_and_invariance_tables_are_generated_from_the_committed_files() -> None:
    """The packed-documents table and the invariance tables in the README are what the report
    functions make of their committed result files."""
    from dash_attn.bench.packed_report import summary_table as packed_summary

    repo = Path(__file__).resolve().parents[2]
    results, readme = repo / "benchmarks" / "results" / "h200", repo / "README.md"
    if not (results.is_dir() and readme.is_file()):
        pytest.skip("not a source checkout")
    text = readme.read_text()
    packed_rows = json.loads((results / "packed" / "packed.json").read_text())["rows"]
    assert packed_summary(packed_rows) in text
    for name in ("few_groups", "many_groups"):
        rows = _read_committed(results / "invariance-1faac8e" / name / "bench.csv")
        assert report.readme_table(rows) in text


def test_history_graphs_table_is_generated_from_the_committed_file() -> None:
    """Session 27's eager-vs-replayed table (benchmarks/HISTORY.md) is what ``graphs_table``
    makes of its graphs.json."""
    from dash_attn.bench.graphs import graphs_table

    repo = Path(__file__).resolve().parents[2]
    run = repo / "benchmarks" / "results" / "h200" / "session27-99c799f" / "call6-ae7383e"
    history = repo / "benchmarks" / "HISTORY.md"
    if not (run.is_dir() and history.is_file()):
        pytest.skip("not a source checkout")
    with gzip.open(run / "graphs" / "graphs.json.gz", "rt") as f:  # compressed since session 51
        rows = json.load(f)["rows"]
    assert len(rows) == 12 * 4 and all(r["status"] == "ok" for r in rows)
    assert graphs_table(rows) in history.read_text()


def test_readme_check_demo_output_is_the_committed_log() -> None:
    repo = Path(__file__).resolve().parents[2]
    log = repo / "benchmarks" / "results" / "h200" / "varlen-a9e08e1" / "check_demo.log"
    readme = repo / "README.md"
    if not (log.is_file() and readme.is_file()):
        pytest.skip("not a source checkout")
    text = readme.read_text()
    start = text.index("== attn_implementation='sdpa'")
    block = text[start : text.index("```", start)].splitlines()
    logged = set(log.read_text().splitlines())
    assert len(block) > 10 and all(line in logged for line in block if line != "...")


def test_read_csv_reads_gzipped_result_files(tmp_path: Path) -> None:
    """Older runs are committed as ``bench.csv.gz``: ``read_csv`` gives the same typed rows."""
    import gzip
    import shutil

    repo = Path(__file__).resolve().parents[2]
    packed = repo / "benchmarks" / "results" / "h200" / "bench.csv.gz"
    if not packed.is_file():
        pytest.skip("not a source checkout")
    plain = tmp_path / "bench.csv"
    with gzip.open(packed, "rb") as src, plain.open("wb") as dst:
        shutil.copyfileobj(src, dst)
    rows = report.read_csv(packed)
    assert rows == report.read_csv(plain) and len(rows) > 0
    assert isinstance(rows[0]["seqlen"], int) and isinstance(rows[0]["ms"], float)


def _notes_text(repo: Path) -> str:
    """benchmarks/NOTES.md and its archived sessions (NOTES-sessions-*.md.gz), one text."""
    parts = [(repo / "benchmarks" / "NOTES.md").read_text()]
    for archive in sorted((repo / "benchmarks").glob("NOTES-sessions-*.md.gz")):
        with gzip.open(archive, "rt") as f:
            parts.append(f.read())
    return "\n".join(parts)


def test_session54_ncu_tables_are_generated_from_their_raw_columns() -> None:
    """Session 54's profiles of the three short 1.10x cells (H100, NOTES item 297): each
    committed table and busiest-units list is what ncu_summary.py makes of the raw columns
    committed beside it, and the main-kernel times NOTES quotes are the tables' first row."""
    repo = Path(__file__).resolve().parents[2]
    run = repo / "benchmarks/results/h100/session54-0085cec"
    if not run.is_dir():
        pytest.skip("not a source checkout")
    ncu = _load_tool(repo / "tools" / "hopper" / "ncu_summary.py")
    notes = _notes_text(repo)
    item = notes[notes.index("297. **Nsight Compute at the three") :]
    for call, tag, cell in [
        ("call5", "2048_64", "d64 full 2k (b8 h32)"),
        ("call4", "4096_64", "d64 full 4k (b4 h32)"),
        ("call5", "4096_128", "d128 full 4k (b4 h16)"),
    ]:
        raw = run / call / f"raw_{tag}_cols.csv.gz"
        labels = [f"{tag} {who}" for who in ("ours det", "ours nondet", "fa4 det", "fa4 nondet")]
        table = (run / call / f"table_{tag}.txt").read_text()
        assert table.strip() == ncu.metric_table(raw, labels, memory=True).strip()
        busiest = (run / call / f"busiest_{tag}.txt").read_text()
        assert busiest.strip() == ncu.busiest_table(raw, labels, 15).strip()
        times = table.splitlines()[2].strip("|").split("|")[1:]
        assert f"| {cell} | " + " | ".join(t.strip() for t in times) + " |" in item


def test_session54_pre_beside_table_is_the_committed_ab() -> None:
    """NOTES item 296's table (the beside preprocess against the shipped launch, H100): each row
    holds the times and the two ratios printed in the committed A/B output."""
    import re

    repo = Path(__file__).resolve().parents[2]
    ab = repo / "benchmarks/results/h100/session54-0085cec/call3/pre_ab.txt"
    if not ab.is_file():
        pytest.skip("not a source checkout")
    notes = _notes_text(repo)
    item = notes[notes.index("296. **The preprocess beside") :]
    text = ab.read_text()
    times = re.findall(
        r"^d(\d+) full (\d+) \S+ \S+ \(ms per backward\): after ([\d.]+) ms  beside ([\d.]+) ms"
        r"  pre ([\d.]+) ms  F ([\d.]+) ms",
        text, flags=re.M,
    )  # fmt: skip
    beside = re.findall(r"after/beside \(>1: beside faster\) ([\d.]+)", text)
    pre = re.findall(r"after/pre \(>1: pre faster\) ([\d.]+)", text)
    assert len(times) == len(beside) == len(pre) == 3
    for (hd, seqlen, *ms), r_beside, r_pre in zip(times, beside, pre, strict=True):
        cells = [f"d{hd} full {int(seqlen) // 1024}k", *ms, f"{float(r_beside):.3f}"]
        cells.append(f"{float(r_pre):.3f}")
        assert "| " + " | ".join(cells) + " |" in item
