"""The ``dash-attn`` command line (CPU only; the schedule command must not need torch)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest

import dash_attn
from dash_attn import cli
from dash_attn.backends.triton.tiles import backward_tiles
from dash_attn.schedule import (
    CAUSAL,
    FULL,
    Mask,
    ScheduleSpec,
    applicable_schedules,
    make_schedule,
    report,
)
from dash_attn.schedule.simulate import simulate
from dash_attn.schedule.validate import validate

REPO = Path(__file__).resolve().parents[1]
PACKAGE_PARENT = Path(dash_attn.__file__).resolve().parents[1]

FULL_TILES = ["--q-tiles", "8", "--kv-tiles", "8", "--heads", "2", "--workers", "8"]
CAUSAL_TILES = ["--q-tiles", "8", "--kv-tiles", "4", "--tile-ratio", "2", "--heads", "2"]
CAUSAL_TILES += ["--workers", "4", "--causal"]
JSON_KEYS = {
    "schedule",
    "dispatch",
    "makespan",
    "critical_path",
    "lower_bound",
    "bubble_fraction",
    "workers",
    "chains",
    "tasks",
    "valid",
    "depth_monotone",
    "batch",
    "q_heads",
    "kv_heads",
    "q_tiles",
    "kv_tiles",
    "mask",
    "causal",
    "tile_ratio",
    "causal_offset",
}


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """``cli.main(argv)`` -> (exit status, stdout, stderr), argparse's SystemExit included."""
    try:
        status = cli.main(argv)
    except SystemExit as exc:
        status = exc.code if isinstance(exc.code, int) else 1
    out, err = capsys.readouterr()
    return status, out, err


def subprocess_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PACKAGE_PARENT), env.get("PYTHONPATH")]))
    return env


@pytest.mark.parametrize(
    ("argv", "spec", "name"),
    [
        pytest.param(
            FULL_TILES,
            ScheduleSpec(batch=1, q_heads=2, kv_heads=2, q_tiles=8, kv_tiles=8, mask=FULL,
                         workers=8),
            "shift",
            id="tiles-full-auto",
        ),
        pytest.param(
            [*CAUSAL_TILES, "--schedule", "descending", "--cost-c", "2", "--cost-r", "0.5"],
            ScheduleSpec(batch=1, q_heads=2, kv_heads=2, q_tiles=8, kv_tiles=4, mask=CAUSAL,
                         tile_ratio=2, workers=4),
            "descending",
            id="tiles-causal-descending-costs",
        ),
        pytest.param(
            ["--seqlen", "1024", "--headdim", "128", "--heads", "4", "--kv-heads", "2",
             "--batch", "2", "--causal", "--workers", "16"],
            # The backward splits GQA by q head (BackwardPlan.gqa_split): 4 chain heads.
            ScheduleSpec(batch=2, q_heads=4, kv_heads=4, q_tiles=16, kv_tiles=8, mask=CAUSAL,
                         tile_ratio=2, workers=16),
            "symmetric_shift",
            id="shape-causal-gqa",
        ),
    ],
)  # fmt: skip
def test_json_matches_engine(
    argv: list[str], spec: ScheduleSpec, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, _ = run_cli(["schedule", *argv, "--json"], capsys)
    assert status == 0
    data = json.loads(out)
    assert data.keys() >= JSON_KEYS

    cost_c = data["cost_c"]
    cost_r = data["cost_r"]
    schedule = make_schedule(name, spec)
    sim = simulate(schedule, cost_compute=cost_c, cost_reduce=cost_r)
    report = validate(schedule, raise_on_error=False)
    assert data["schedule"] == name
    assert data["dispatch"] == schedule.dispatch.value
    assert data["makespan"] == pytest.approx(sim.makespan)
    assert data["critical_path"] == pytest.approx(sim.critical_path)
    assert data["lower_bound"] == pytest.approx(sim.lower_bound)
    assert data["bubble_fraction"] == pytest.approx(sim.bubble_fraction)
    assert data["tasks"] == schedule.num_steps == spec.num_tasks()
    assert data["chains"] == schedule.num_chains
    assert data["valid"] is report.valid is True
    assert data["depth_monotone"] is report.depth_monotone
    for field in ("batch", "q_heads", "kv_heads", "q_tiles", "kv_tiles", "workers"):
        assert data[field] == getattr(spec, field)
    if "--kv-heads" in argv:  # the tensors' kv heads, beside the split spec's
        assert data["split_kv_heads"] == int(argv[argv.index("--kv-heads") + 1])
    assert data["mask"] == spec.mask.name and data["causal"] is spec.mask.causal


def test_gqa_split_flag(capsys: pytest.CaptureFixture[str]) -> None:
    """GQA shapes are analysed as the backward runs them, one chain per q head; --no-gqa-split
    analyses one chain per kv head (the plan's gqa_split=False)."""
    shape = ["schedule", "--seqlen", "1024", "--headdim", "128", "--heads", "8", "--kv-heads",
             "2", "--causal", "--json"]  # fmt: skip
    status, out, _ = run_cli(shape, capsys)
    split = json.loads(out)
    status_whole, out, _ = run_cli([*shape, "--no-gqa-split"], capsys)
    whole = json.loads(out)
    assert status == status_whole == 0
    assert (split["kv_heads"], split["split_kv_heads"]) == (8, 2)
    assert (whole["kv_heads"], whole["split_kv_heads"]) == (2, None)
    assert split["chains"] == 4 * whole["chains"]


def test_json_shape_fields(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run_cli(
        ["schedule", "--seqlen", "1000", "--seqlen-k", "1500", "--headdim", "64", "--causal",
         "--json"],
        capsys,
    )  # fmt: skip
    assert status == 0
    data = json.loads(out)
    assert (data["seqlen_q"], data["seqlen_k"], data["headdim"]) == (1000, 1500, 64)
    tiles = backward_tiles(64)
    bm, bn = tiles.block_m, tiles.block_n
    assert (data["q_tiles"], data["kv_tiles"]) == (-(-1000 // bm), -(-1500 // bn))
    assert data["causal_offset"] == -(-(1500 - 1000) // bm)
    assert data["cost_c"] == data["cost_r"] == 1.0


@pytest.mark.parametrize("argv", [FULL_TILES, CAUSAL_TILES], ids=["full", "causal"])
def test_compare_lists_every_applicable_schedule(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, _ = run_cli(["schedule", *argv, "--compare"], capsys)
    assert status == 0
    causal = "--causal" in argv
    names = applicable_schedules(Mask(causal=causal))
    rows = {line.split()[0]: line for line in out.splitlines()[3:] if line.strip()}
    assert sorted(rows) == sorted(names)
    assert rows["fa3"].rstrip().endswith("1.000x")
    auto = [name for name, row in rows.items() if "(auto)" in row]

    status, out, _ = run_cli(["schedule", *argv, "--compare", "--json"], capsys)
    data = json.loads(out)
    assert [entry["schedule"] for entry in data["compare"]] == names
    fa3 = next(entry for entry in data["compare"] if entry["schedule"] == "fa3")
    for entry in data["compare"]:
        assert entry["speedup_vs_fa3"] == pytest.approx(fa3["makespan"] / entry["makespan"])
    # auto is the model's fastest schedule
    assert len(auto) == 1
    fastest = min(entry["makespan"] for entry in data["compare"])
    assert next(e for e in data["compare"] if e["schedule"] == auto[0])["makespan"] == fastest


def test_auto_schedule_is_the_optimal_one_in_the_model(capsys: pytest.CaptureFixture[str]) -> None:
    # One causal head of 8 x 8 tiles on 8 workers: symmetric_shift's 4 pairs leave 4 workers idle
    # (18 steps), descending uses all 8 (16): auto follows the model.
    argv = ["schedule", "--q-tiles", "8", "--workers", "8", "--causal", "--compare", "--json"]
    argv.append("--no-invariant")  # auto simulates only the worker-dependent way
    status, out, _ = run_cli(argv, capsys)
    data = json.loads(out)
    by_name = {entry["schedule"]: entry["makespan"] for entry in data["compare"]}
    assert status == 0 and data["schedule"] == "descending"
    assert by_name == {"fa3": 23.0, "descending": 16.0, "symmetric_shift": 18.0}
    # Paper section 2: shift reaches m n (c + r), the baseline adds an (n - 1) r start-up staircase.
    status, out, _ = run_cli(["schedule", *FULL_TILES, "--compare", "--json"], capsys)
    assert status == 0
    by_name = {entry["schedule"]: entry for entry in json.loads(out)["compare"]}
    assert by_name["shift"]["makespan"] == pytest.approx(2 * 8 * 2)
    assert by_name["fa3"]["makespan"] == pytest.approx(2 * 8 * 2 + 7)


@pytest.mark.parametrize("compare", [False, True], ids=["single", "compare"])
def test_plot_writes_png(compare: bool, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "gantt.png"
    argv = ["schedule", *CAUSAL_TILES, "--plot", str(path)] + (["--compare"] if compare else [])
    status, out, _ = run_cli(argv, capsys)
    assert status == 0
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"wrote {path}" in out


def test_plot_subset_of_workers_keeps_json_clean(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "big.png"
    argv = ["schedule", "--seqlen", "2048", "--headdim", "64", "--heads", "4", "--json"]
    status, out, err = run_cli([*argv, "--plot", str(path), "--plot-workers", "8"], capsys)
    assert status == 0
    json.loads(out)  # the "wrote ..." line went to stderr
    assert "wrote" in err
    assert path.stat().st_size > 0


def test_ascii_grid(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run_cli(["schedule", *FULL_TILES, "--ascii"], capsys)
    assert status == 0
    assert "shift" in out and len(out.splitlines()) > 8
    # Tiny shapes get the grid without asking; bigger ones do not.
    tiny = ["schedule", "--q-tiles", "4", "--kv-tiles", "4", "--workers", "4"]
    _, tiny_out, _ = run_cli(tiny, capsys)
    _, big_out, _ = run_cli(["schedule", "--q-tiles", "32", "--kv-tiles", "32"], capsys)
    assert len(tiny_out.splitlines()) > 6
    assert len(big_out.splitlines()) == 5


def test_ascii_grid_with_idle_workers(capsys: pytest.CaptureFixture[str]) -> None:
    # symmetric_shift pairs the 4 KV tiles into 2 units: workers 2 and 3 stay idle.
    argv = ["schedule", "--q-tiles", "4", "--kv-tiles", "4", "--workers", "4", "--causal"]
    argv += ["--schedule", "symmetric_shift"]
    status, out, _ = run_cli(argv, capsys)
    assert status == 0 and "w3" in out


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        pytest.param(["--q-tiles", "0"], "--q-tiles", id="zero-tiles"),
        pytest.param(["--q-tiles", "x"], "--q-tiles", id="not-int"),
        pytest.param(["--seqlen", "128", "--headdim", "80"], "--headdim", id="bad-headdim"),
        pytest.param(["--seqlen", "128"], "--headdim", id="seqlen-without-headdim"),
        pytest.param(["--q-tiles", "4", "--seqlen", "128", "--headdim", "64"], "--q-tiles",
                     id="tiles-and-tokens"),
        pytest.param(["--causal"], "--causal", id="causal-without-shape"),
        pytest.param(["--plot", "x.png"], "--plot", id="plot-without-shape"),
        pytest.param(["--q-tiles", "4", "--causal", "--schedule", "shift"], "--schedule",
                     id="shift-on-causal"),
        pytest.param(["--q-tiles", "4", "--schedule", "nope"], "--schedule", id="unknown-schedule"),
        pytest.param(["--q-tiles", "4", "--heads", "3", "--kv-heads", "2"], "--kv-heads",
                     id="gqa-not-divisible"),
        pytest.param(["--q-tiles", "4", "--cost-c", "0"], "--cost-c", id="zero-compute-cost"),
        pytest.param(["--q-tiles", "4", "--cost-r", "nan"], "--cost-r", id="nan-reduce-cost"),
        pytest.param(["--q-tiles", "2", "--kv-tiles", "4", "--tile-ratio", "2", "--causal"],
                     "q_tiles", id="causal-kv-tile-without-q-tile"),
        pytest.param(["--q-tiles", "4", "--plot", "/nonexistent-dir/x.png"], "--plot",
                     id="plot-unwritable"),
        pytest.param(["--bogus"], "--bogus", id="unknown-flag"),
        pytest.param(["--q-tiles", "4", "--workers", "1000000000"], "--workers", id="workers-cap"),
        pytest.param(["--q-tiles", "4", "--heads", "1025"], "--heads", id="heads-cap"),
        pytest.param(["--q-tiles", "4", "--batch", "65537"], "--batch", id="batch-cap"),
        pytest.param(["--q-tiles", "65537"], "--q-tiles", id="tiles-cap"),
        pytest.param(["--seqlen", str(2**20 + 1), "--headdim", "64"], "--seqlen", id="seqlen-cap"),
        pytest.param(["--q-tiles", "4096", "--heads", "64"], "tile tasks", id="tasks-cap"),
        pytest.param(["--q-tiles", "4", "--tile-ratio", "3"], "--tile-ratio", id="no-such-tiles"),
        pytest.param(["--q-tiles", "4", "--plot", "x.txt"], ".png", id="plot-suffix"),
    ],
)  # fmt: skip
def test_bad_arguments_exit_2(
    argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, err = run_cli(["schedule", *argv], capsys)
    assert status == 2
    message = err.strip().splitlines()[-1]
    assert "error:" in message and needle in message
    assert "Traceback" not in err


def test_help_documents_the_bounds(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run_cli(["schedule", "--help"], capsys)
    assert status == 0
    text = " ".join(out.split())
    assert f"at most {cli.MAX_WORKERS}" in text and f"at most {cli.MAX_TASKS} tile tasks" in text
    assert "one of [1, 2]" in text


def test_unknown_command_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    status, _, err = run_cli(["frobnicate"], capsys)
    assert status == 2 and "invalid choice" in err


def test_bench_without_module(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    # A None entry makes the import fail as if the module did not exist, whether or not it does.
    monkeypatch.setitem(sys.modules, cli.BENCH_MODULE, None)
    status, _, err = run_cli(["bench", "--anything"], capsys)
    assert status == 2
    assert cli.BENCH_MODULE in err and "Traceback" not in err


def test_bench_hands_arguments_to_the_module(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    seen: dict[str, object] = {}

    def add_bench_arguments(parser) -> None:  # noqa: ANN001
        parser.add_argument("--mode", choices=["fwd", "bwd"], required=True)

    def run(args) -> int:  # noqa: ANN001
        seen["mode"] = args.mode
        return 0

    fake = types.ModuleType(cli.BENCH_MODULE, "Fake benchmarks.")
    fake.add_bench_arguments = add_bench_arguments  # type: ignore[attr-defined]
    fake.run = run  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, cli.BENCH_MODULE, fake)
    assert run_cli(["bench", "--mode", "bwd"], capsys)[0] == 0
    assert seen == {"mode": "bwd"}
    status, _, err = run_cli(["bench", "--mode", "sideways"], capsys)
    assert status == 2 and "--mode" in err


def test_sweep_small(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    # The full sweep is exercised by test_default_sweep; two lengths keep this one quick.
    monkeypatch.setattr(report, "PAPER_SEQLENS", (512, 1024))
    # No subcommand means `schedule`, options included.
    status, out, _ = run_cli(["--workers", "64", "--json"], capsys)
    assert status == 0
    data = json.loads(out)
    configs = data["configs"]
    assert len(configs) == 2 * 2 * 2  # head dims x lengths x masks
    for config in configs:
        assert config["batch"] * config["seqlen_q"] == report.PAPER_TOKENS
        assert config["q_heads"] * config["headdim"] == report.PAPER_HIDDEN
        assert config["mask"] == ("causal" if config["causal"] else "full")
        assert config["workers"] == 64
        best = "symmetric_shift" if config["causal"] else "shift"
        mixed = set() if config["causal"] else {"shift_descending"}
        assert set(config["schedules"]) == {"fa3", "descending", best} | mixed
        assert config["schedules"][best]["speedup_vs_fa3"] >= 1.0
        assert all(entry["valid"] for entry in config["schedules"].values())


def test_default_sweep_text(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The whole grid takes ~10 s a core (tests/schedule/test_report.py checks its specs); the
    # text path is the same for any subset.
    monkeypatch.setattr(report, "PAPER_SEQLENS", (512, 2048))
    status, out, _ = run_cli([], capsys)
    assert status == 0
    rows = [line for line in out.splitlines() if re.match(r"^(64|128)\s+\d+\s", line)]
    assert len(rows) == len(report.PAPER_HEADDIMS) * 2 * 2
    assert "configurations in" in out and "132 workers" in out


def test_python_m_matches_console_script() -> None:
    argv = ["schedule", "--json", "--q-tiles", "4", "--kv-tiles", "4", "--workers", "4"]
    result = subprocess.run(
        [sys.executable, "-m", "dash_attn", *argv],
        capture_output=True,
        text=True,
        env=subprocess_env(),
        timeout=120,
        check=True,
    )
    data = json.loads(result.stdout)
    assert data["schedule"] == "shift" and data["makespan"] == 8.0
    script = shutil.which("dash-attn")
    if script is not None:  # installed: the console script must print the same thing
        scripted = subprocess.run(
            [script, *argv], capture_output=True, text=True, timeout=120, check=True
        )
        assert json.loads(scripted.stdout) == data


def test_schedule_command_imports_no_torch(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "from dash_attn.cli import main\n"
        "assert main(['schedule', '--q-tiles', '4', '--kv-tiles', '4', '--workers', '4',\n"
        "             '--compare', '--ascii']) == 0\n"
        "assert main(['schedule', '--seqlen', '512', '--headdim', '64', '--json']) == 0\n"
        "heavy = sorted(m for m in ('torch', 'triton', 'matplotlib') if m in sys.modules)\n"
        "print('HEAVY', heavy)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=subprocess_env(),
        cwd=tmp_path,
        timeout=120,
        check=True,
    )
    assert "HEAVY []" in result.stdout, result.stdout[-2000:]


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run_cli(["--version"], capsys)
    assert status == 0 and dash_attn.__version__ in out


def test_readme_test_command_is_what_ci_runs() -> None:
    ci, readme = REPO / ".ci" / "run", REPO / "README.md"
    if not (ci.is_file() and readme.is_file()):
        pytest.skip("not a source checkout")
    match = re.search(r"^test_command='(.+)'$", ci.read_text(), re.MULTILINE)
    assert match, ".ci/run must define test_command='...'"
    assert match.group(1) in readme.read_text()


# ------------------------------------------------------------------------------------------------
# Packed sequences, windows and the order-invariance switch


def test_seqlens_analyse_a_pack(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["schedule", "--seqlens", "1000,3000,517", "--headdim", "128", "--causal", "--json"]
    status, out, _ = run_cli([*argv, "--heads", "4", "--kv-heads", "2"], capsys)
    data = json.loads(out)
    assert status == 0 and data["schedule"] == "symmetric_shift" and data["valid"]
    assert data["seqlens"] == [[1000, 1000], [3000, 3000], [517, 517]]
    assert data["batch"] == 3 and data["invariant"] is True
    spec = ScheduleSpec.from_seqlens(
        seqlens=[(1000, 1000), (3000, 3000), (517, 517)],
        q_heads=4,
        kv_heads=2,
        block_m=data["block_m"],
        block_n=data["block_m"] * data["tile_ratio"],
        mask=Mask(causal=True),
        workers=data["workers"],
    )
    assert data["tasks"] == spec.num_tasks()


def test_seqlens_k_and_window(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["schedule", "--seqlens", "100,200", "--seqlens-k", "300,50", "--headdim", "64"]
    status, out, _ = run_cli([*argv, "--window", "64,64", "--compare", "--json"], capsys)
    data = json.loads(out)
    assert status == 0 and data["mask"] == "local(64,64)" and data["schedule"] == "descending"
    assert data["seqlens"] == [[100, 300], [200, 50]]
    assert {entry["schedule"] for entry in data["compare"]} == {"fa3", "descending"}


def test_window_with_causal_is_a_causal_window(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["schedule", "--seqlen", "4096", "--headdim", "128", "--window", "1024,-1"]
    status, out, _ = run_cli([*argv, "--causal", "--json"], capsys)
    assert status == 0 and json.loads(out)["mask"] == "local(1024,0)"
    argv = ["schedule", "--seqlen", "4096", "--headdim", "128", "--window=-1,0", "--json"]
    status, out, _ = run_cli(argv, capsys)
    assert status == 0 and json.loads(out)["mask"] == "causal"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--seqlens", "10,x", "--headdim", "64"], "expected comma-separated integers"),
        (["--seqlens", "10,20", "--batch", "2", "--headdim", "64"], "not allowed with --batch"),
        (["--seqlens", "10,20"], "--seqlens needs --headdim"),
        (["--seqlens-k", "10", "--headdim", "64"], "--seqlens-k needs --seqlens"),
        (["--seqlens", "1,2", "--seqlens-k", "3", "--headdim", "64"], "1 lengths for 2 sequences"),
        (["--seqlen", "64", "--headdim", "64", "--window", "3"], "expected L,R"),
        (["--seqlen", "64", "--headdim", "64", "--window=-2,0"], "expected -1 <= L, R"),
        (["--q-tiles", "4", "--window", "3,0"], "needs token lengths"),
        (["--window", "3,0"], "--window needs a shape"),
    ],
)
def test_varlen_and_window_errors(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    status, _, err = run_cli(["schedule", *argv], capsys)
    assert status == 2 and message in err


def test_no_invariant_keeps_the_worker_dependent_tables(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["schedule", "--seqlen", "2048", "--headdim", "128", "--heads", "4", "--json"]
    _, out, _ = run_cli([*base, "--workers", "20"], capsys)
    invariant = json.loads(out)
    _, out, _ = run_cli([*base, "--workers", "20", "--no-invariant"], capsys)
    legacy = json.loads(out)
    assert invariant["invariant"] is True and legacy["invariant"] is False
    assert invariant["schedule"] == legacy["schedule"] == "shift"
    status, _, err = run_cli([*base, "--workers", "8"], capsys)
    assert status == 2 and "co-resident workers" in err
