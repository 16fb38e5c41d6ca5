"""The packed benchmark on the CPU: lengths, pair counts, providers, the run with test doubles."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from dash_attn.bench import packed, packed_report
from dash_attn.bench.packed_providers import (
    BHSD,
    THD,
    PackedProvider,
    dash_schedules,
    flex_mask_mod,
    providers_for_row,
    require_keywords,
)
from dash_attn.bench.packed_rows import (
    MAX_DOC,
    MIN_DOC,
    TOTAL_TOKENS,
    PackedRow,
    attended_pairs,
    document_lengths,
    flops_from_pairs,
    make_rows,
    packed_pairs,
)
from dash_attn.bench.providers import ProviderUnavailable
from dash_attn.bench.runinfo import Deadline

from .helpers import Noisy

# ------------------------------------------------------------------------------------------------
# Document lengths


@pytest.mark.parametrize("seed", range(20))
def test_lengths_sum_to_the_pack_and_stay_in_bounds(seed: int) -> None:
    lengths = document_lengths(seed)
    assert sum(lengths) == TOTAL_TOKENS
    assert all(isinstance(n, int) and MIN_DOC <= n <= MAX_DOC for n in lengths)
    assert lengths == document_lengths(seed)  # seeded


def test_lengths_depend_on_the_seed_and_have_a_1_to_2k_median() -> None:
    draws = [document_lengths(seed) for seed in range(200)]
    assert len({tuple(d) for d in draws}) == len(draws)
    median = float(np.median([n for d in draws for n in d[:-1]]))  # the last one is cut
    assert 1000 <= median <= 2000


def test_short_cut_is_merged_or_topped_up_within_bounds() -> None:
    # Small bounds make a cut below `low` frequent; both repairs must keep every length in range.
    low, high, total = 64, 200, 700
    for seed in range(300):
        lengths = document_lengths(seed, total, median=150, sigma=0.8, low=low, high=high)
        assert sum(lengths) == total
        assert all(low <= n <= high for n in lengths), (seed, lengths)


def test_lengths_reject_bounds_that_cannot_hold() -> None:
    with pytest.raises(ValueError, match="low"):
        document_lengths(0, 1000, low=64, high=100)
    with pytest.raises(ValueError, match="total"):
        document_lengths(0, 10)


# ------------------------------------------------------------------------------------------------
# Pair counts and FLOPs


def brute_pairs(seqlen_q: int, seqlen_k: int, left: int, right: int) -> int:
    """The row rule of flash-attn written out on the full matrix."""
    m = np.arange(seqlen_q)[:, None]
    n = np.arange(seqlen_k)[None, :]
    d = seqlen_k - seqlen_q
    keep = np.ones((seqlen_q, seqlen_k), dtype=bool)
    if right >= 0:
        keep &= n <= m + d + right
    if left >= 0:
        keep &= n >= m + d - left
    return int(keep.sum())


@pytest.mark.parametrize("left, right", [(-1, -1), (-1, 0), (0, 0), (3, 0), (5, 2), (2, -1)])
def test_pair_count_matches_brute_force(left: int, right: int) -> None:
    for seqlen_q in (1, 7, 16, 33):
        for seqlen_k in (1, 9, 16, 40):
            expected = brute_pairs(seqlen_q, seqlen_k, left, right)
            assert attended_pairs(seqlen_q, seqlen_k, left, right) == expected


def test_causal_and_window_closed_forms_at_16k() -> None:
    s, w = 16384, 4096
    assert attended_pairs(s, s, -1, 0) == s * (s + 1) // 2
    assert attended_pairs(s, s, w, 0) == sum(min(m, w) + 1 for m in range(s))


def block_diagonal_mask(row: PackedRow) -> np.ndarray:
    """The packed mask assembled from per-document causal (windowed) blocks."""
    keep = np.zeros((row.tokens, row.tokens), dtype=bool)
    start = 0
    for n in row.lengths:
        m = np.arange(n)[:, None]
        k = np.arange(n)[None, :]
        block = k <= m
        if row.window_left >= 0:
            block &= k >= m - row.window_left
        keep[start : start + n, start : start + n] = block
        start += n
    return keep


@pytest.mark.parametrize("window", [-1, 5])
def test_packed_pairs_and_flex_mask_agree_with_the_block_diagonal(window: int) -> None:
    row = PackedRow("t", (7, 64, 1, 20, 33), 2, 2, 16, window_left=window)
    keep = block_diagonal_mask(row)
    assert packed_pairs(row.lengths, window, 0) == row.pairs == int(keep.sum())
    idx = torch.arange(row.tokens)
    flex = flex_mask_mod(row, "cpu")(None, None, idx[:, None], idx[None, :])
    assert np.array_equal(flex.numpy(), keep)


def test_flops_count_the_kept_pairs() -> None:
    assert flops_from_pairs(10, 16, 128, "fwd") == 4 * 10 * 16 * 128
    assert flops_from_pairs(10, 16, 128, "bwd") == 2.5 * 4 * 10 * 16 * 128
    row = make_rows(["window"], 0)[0]
    assert row.flops("bwd") == 2.5 * 4 * row.pairs * 16 * 128
    with pytest.raises(ValueError):
        flops_from_pairs(1, 1, 1, "sideways")


def test_default_rows_follow_the_paper_grid() -> None:
    varlen, window, gqa = make_rows(["varlen", "window", "varlen_gqa"], 3)
    assert varlen.tokens == window.tokens == gqa.tokens == 16384
    assert (varlen.heads * varlen.headdim, varlen.kv_heads, gqa.kv_heads) == (2048, 16, 4)
    assert varlen.lengths == gqa.lengths == tuple(document_lengths(3))
    assert varlen.cu_seqlens[-1] == 16384 and varlen.cu_seqlens[0] == 0
    assert window.window == (4096, 0) and not window.varlen and window.lengths == (16384,)
    assert not varlen.local and varlen.window == (-1, 0)
    with pytest.raises(ValueError, match="unknown rows"):
        make_rows(["diagonal"], 0)


# ------------------------------------------------------------------------------------------------
# Providers


def test_import_loads_no_gpu_library() -> None:
    code = (
        "import sys, dash_attn.bench.packed; "
        "print(sorted(m for m in ('torch', 'triton', 'flash_attn', 'cutlass') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_provider_lists_per_row() -> None:
    varlen, window = make_rows(["varlen", "window"], 0)
    names, note = dash_schedules(varlen)
    assert note is None and "fa3" in names and "descending" in names
    providers, _ = providers_for_row(varlen)
    listed = [p.name for p in providers]
    assert listed[0] == "fa4_det" and listed[-1] == "flex"
    assert {"dash_auto", "dash_nondet", "dash_auto_workers", "fa4_nondet"} <= set(listed)
    assert {f"dash_{n}" for n in names} <= set(listed)
    assert all(p.layout == THD for p in providers if p.family != "flex")
    flex = providers[-1]
    assert flex.layout == BHSD and not flex.deterministic  # flex promises no determinism
    assert all(p.layout == "bshd" for p in providers_for_row(window)[0] if p.family != "flex")


def test_local_mask_schedules_fall_back_when_the_engine_cannot_say(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import dash_attn.schedule as schedule

    def fails(mask: Any) -> list[str]:
        raise TypeError("no local mask here")

    varlen, window = make_rows(["varlen", "window"], 0)
    names, note = dash_schedules(window)  # before issue #12's Mask: no window_left, fallback
    assert names == ["fa3", "descending"] if note is not None else names
    monkeypatch.setattr(schedule, "applicable_schedules", fails)
    names, note = dash_schedules(varlen)
    assert names == ["fa3", "descending"]
    assert note is not None and "no local mask here" in note
    monkeypatch.setattr(schedule, "applicable_schedules", lambda mask: [])
    names, note = dash_schedules(varlen)
    assert names == ["fa3", "descending"] and note is not None and "returned none" in note


def test_missing_keyword_makes_a_provider_unavailable() -> None:
    def old_api(q: Any, k: Any, v: Any, causal: bool = False) -> None:
        return None

    def forwards_all(q: Any, **kwargs: Any) -> None:
        return None

    with pytest.raises(ProviderUnavailable, match="window_size, invariant"):
        require_keywords(old_api, ["causal", "window_size", "invariant"], "dash_attn_func")
    require_keywords(old_api, ["causal"], "dash_attn_func")
    require_keywords(forwards_all, ["window_size"], "f")


def test_dash_varlen_provider_is_unavailable_without_the_api(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import dash_attn

    monkeypatch.setattr(dash_attn, "dash_attn_varlen_func", None, raising=False)
    varlen = make_rows(["varlen"], 0)[0]
    dash = next(p for p in providers_for_row(varlen)[0] if p.name == "dash_auto")
    with pytest.raises(ProviderUnavailable, match="dash_attn_varlen_func"):
        dash.make(varlen, "cpu")


def test_fa4_is_unavailable_with_its_reason_where_it_does_not_import() -> None:
    try:
        import flash_attn.cute  # noqa: F401
    except Exception:  # noqa: BLE001
        pass
    else:
        pytest.skip("flash_attn.cute imports here")
    row = make_rows(["varlen"], 0)[0]
    fa4 = providers_for_row(row)[0][0]
    with pytest.raises(ProviderUnavailable, match="flash_attn.cute does not import"):
        fa4.make(row, "cpu")


# ------------------------------------------------------------------------------------------------
# The run with test doubles

SIZE = {"heads": 2, "kv_heads_gqa": 1, "headdim": 16, "median_doc": 60}
TIMES = {"fa4_det": 2.0, "fast": 1.0, "bhsd": 4.0, "noisy": 0.5}


class Clock:
    """A fake timer: runs the step once and returns the time of the provider that ran last."""

    def __init__(self) -> None:
        self.last: str | None = None

    def __call__(self, step: Any, warmup: float, rep: float, grad_to_none: Any = None) -> float:
        for x in grad_to_none or ():
            x.grad = None
        step()
        return TIMES[self.last]


def eager(name: str, clock: Clock, layout: str = THD, noisy: bool = False) -> Any:
    """Masked attention in fp32 on the CPU, with the row's mask (document, causal, window)."""

    def make(row: PackedRow, device: Any) -> Any:
        idx = torch.arange(row.tokens)
        keep = flex_mask_mod(row, device)(None, None, idx[:, None], idx[None, :])
        group = row.heads // row.kv_heads

        def fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            clock.last = name
            if layout == THD:
                q, k, v = (x.transpose(0, 1) for x in (q, k, v))
            else:
                q, k, v = (x.squeeze(0) for x in (q, k, v))
            k, v = (x.repeat_interleave(group, dim=0) for x in (k, v))
            out = torch.nn.functional.scaled_dot_product_attention(
                q.float(), k.float(), v.float(), attn_mask=keep
            )
            if noisy:  # a "non-deterministic kernel": output and gradients move on every call
                out = Noisy.apply(out)
            out = out.to(q.dtype)
            return out.transpose(0, 1) if layout == THD else out.unsqueeze(0)

        return fn

    return make


def unavailable(row: PackedRow, device: Any) -> Any:
    raise ProviderUnavailable("peer not installed here")


def broken(row: PackedRow, device: Any) -> Any:
    def fn(q: Any, k: Any, v: Any) -> Any:
        raise RuntimeError("kernel exploded\nsecond line")

    return fn


def fake_providers(clock: Clock) -> Any:
    def providers_for(row: PackedRow) -> tuple[list[PackedProvider], str | None]:
        return [
            PackedProvider("fa4_det", "fa4", True, eager("fa4_det", clock)),
            PackedProvider("fast", "dash", True, eager("fast", clock), schedule="fa3"),
            PackedProvider("bhsd", "flex", False, eager("bhsd", clock, BHSD), BHSD),
            PackedProvider("noisy", "dash", False, eager("noisy", clock, noisy=True)),
            PackedProvider("missing", "fa4", True, unavailable),
            PackedProvider("broken", "dash", True, broken),
        ], "a note"

    return providers_for


def read_rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def test_run_writes_csv_json_and_plot_with_ratios(tmp_path: Path) -> None:
    clock = Clock()
    argv = ["--out", str(tmp_path), "--tokens", "256", "--window", "32", "--quick"]
    rc = packed.main(
        argv, device="cpu", timer=clock, providers_for=fake_providers(clock), size=SIZE
    )
    assert rc == 0
    rows = read_rows(tmp_path / "packed.csv")
    assert len(rows) == 3 * 6 * 2  # rows x providers x modes
    assert list(rows[0]) == list(packed_report.CSV_FIELDS)
    by = {(r["row"], r["mode"], r["provider"]): r for r in rows}
    spec = {r.name: r for r in make_rows(["varlen", "window", "varlen_gqa"], 0, total=256,
                                          window_left=32, **SIZE)}  # fmt: skip
    for (row, mode, name), r in by.items():
        if name in TIMES:
            assert r["status"] == "ok" and r["reason"] == ""
            assert float(r["ms"]) == TIMES[name]
            assert float(r["ratio_vs_fa4_det"]) == pytest.approx(TIMES["fa4_det"] / TIMES[name])
            flops = spec[row].flops(mode)
            assert float(r["tflops"]) == pytest.approx(flops / (TIMES[name] * 1e-3) / 1e12)
            assert int(r["pairs"]) == spec[row].pairs
        else:
            assert r["ms"] == r["tflops"] == r["ratio_vs_fa4_det"] == ""
    assert by[("varlen", "bwd", "fast")]["bits_repeatable"] == "True"
    assert by[("varlen", "bwd", "noisy")]["bits_repeatable"] == "False"
    assert by[("window", "fwd", "bhsd")]["bits_repeatable"] == "True"
    # Same mask, same inputs, another layout: the output matches the reference (fa4_det) closely.
    assert float(by[("varlen_gqa", "fwd", "bhsd")]["max_out_diff"]) < 1e-2
    assert float(by[("varlen", "fwd", "fa4_det")]["max_out_diff"]) == 0.0
    missing = by[("window", "bwd", "missing")]
    assert (missing["status"], missing["reason"]) == ("unavailable", "peer not installed here")
    failed = by[("varlen", "fwd", "broken")]
    assert failed["status"] == "error" and failed["reason"] == "RuntimeError: kernel exploded"

    info = json.loads((tmp_path / "packed.json").read_text())
    assert info["command"] == "python -m dash_attn.bench.packed " + " ".join(argv)
    assert {"gpu", "torch", "triton", "flash_attn_4", "commit", "date"} <= set(info["header"])
    assert "cutlass_dsl" in info["header"]
    varlen_spec = info["rows_spec"][0]
    assert varlen_spec["lengths"] == list(spec["varlen"].lengths)
    assert len(varlen_spec["lengths"]) > 1 and varlen_spec["cu_seqlens"][-1] == 256
    assert varlen_spec["cu_seqlens"] == [0, *np.cumsum(varlen_spec["lengths"]).tolist()]
    assert info["schedule_notes"]["window"] == "a note"
    assert info["references"] == {"varlen": "fa4_det", "window": "fa4_det", "varlen_gqa": "fa4_det"}
    assert len(info["rows"]) == len(rows)
    assert (tmp_path / "packed.png").stat().st_size > 0
    assert "vs fa4_det" in (tmp_path / "packed.log").read_text()


def test_provider_and_row_selection(tmp_path: Path) -> None:
    clock = Clock()
    argv = ["--out", str(tmp_path), "--tokens", "128", "--rows", "window",
            "--providers", "fa*,fast", "--repeats", "0"]  # fmt: skip
    assert packed.main(argv, device="cpu", timer=clock, providers_for=fake_providers(clock),
                       size=SIZE) == 0  # fmt: skip
    rows = read_rows(tmp_path / "packed.csv")
    assert {(r["row"], r["provider"]) for r in rows} == {
        ("window", "fa4_det"),
        ("window", "fast"),
    }
    assert all(r["bits_repeatable"] == "" for r in rows)  # --repeats 0: no check


def test_deadline_stops_starting_providers(tmp_path: Path) -> None:
    clock = Clock()
    row = make_rows(["varlen"], 0, total=128, **SIZE)[0]
    rows = packed.run_packed(
        [row], fake_providers(clock), out_dir=tmp_path, meta={}, timer=clock, device="cpu",
        deadline=Deadline(0.0), warmup=1, rep=1,
    )  # fmt: skip
    assert len(rows) == 12
    assert all(r["status"] == "not run" and "--deadline-s" in r["reason"] for r in rows)
    assert read_rows(tmp_path / "packed.csv")[0]["status"] == "not run"
    assert packed_report.plot_packed(rows, tmp_path / "none.png") is None


def test_ratios_need_a_measured_baseline() -> None:
    def row(name: str, ms: float | None, status: str = "ok", mode: str = "bwd") -> dict:
        return {"row": "varlen", "mode": mode, "provider": name, "ms": ms, "status": status}

    rows = [row("fa4_det", 3.0), row("dash_auto", 2.0), row("flex", 6.0), row("x", None, "error"),
            row("dash_auto", 1.0, mode="fwd")]  # fmt: skip
    packed_report.add_ratios(rows)
    assert [r["ratio_vs_fa4_det"] for r in rows] == [1.0, 1.5, 0.5, None, None]
    rows[0]["status"] = "error"
    packed_report.add_ratios(rows)
    assert all(r["ratio_vs_fa4_det"] is None for r in rows)


def test_summary_table_shows_ratios_bits_and_reasons() -> None:
    def row(name: str, mode: str, status: str = "ok", **more: Any) -> dict:
        return {"row": "window", "mode": mode, "provider": name, "deterministic": True,
                "status": status, **more}  # fmt: skip

    rows = [
        row("dash_auto", "fwd", ms=1.0, tflops=300.0, ratio_vs_fa4_det=1.25, bits_repeatable=True),
        row("dash_auto", "bwd", ms=1.0, tflops=280.4, ratio_vs_fa4_det=0.9, bits_repeatable=False),
        row("fa4_det", "fwd", "unavailable", reason="peer not installed here"),
        row("fa4_det", "bwd", "unavailable", reason="peer not installed here"),
    ]
    lines = packed_report.summary_table(rows).splitlines()
    assert lines[0].split() == ["provider", "promise", "window", "fwd", "window", "bwd"]
    assert lines[2].split() == ["dash_auto", "det", "300", "1.25x", "280", "0.90x", "bits!"]
    assert lines[3].split() == ["fa4_det", "det", "unavailable", "unavailable"]
    assert lines[-1] == "  fa4_det (window fwd, window bwd): unavailable: peer not installed here"


def test_no_gpu_exits_without_timing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        packed, "run_info", lambda commit=None: {"cuda_available": False, "gpu": "none"}
    )
    assert packed.main(["--out", str(tmp_path / "x")]) == 1
    assert not (tmp_path / "x").exists()
    assert packed.main(["--out", str(tmp_path), "--rows", "nope"], device="cpu") == 2


def test_dash_rows_record_the_schedule_and_kernel_that_ran(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import dash_attn
    from dash_attn.plan import H200, Problem, make_backward_plan
    from dash_attn.schedule import CAUSAL

    problem = Problem(batch=1, seqlen_q=256, seqlen_k=256, heads=2, kv_heads=2, headdim=128,
                      mask=CAUSAL)  # fmt: skip
    plan = make_backward_plan(problem, device=H200, backend="triton", schedule="descending")
    monkeypatch.setattr(dash_attn, "last_launch_info", lambda: plan)
    dash = PackedProvider("dash_auto", "dash", True, unavailable, schedule="auto")
    assert packed.launched(dash, "bwd") == {
        "schedule": "descending",  # "auto" resolved
        "kernel": f"triton {plan.tiles.label} dq:tma",
    }
    assert packed.launched(dash, "fwd") == {"schedule": "auto", "kernel": None}
    flex = PackedProvider("flex", "flex", False, unavailable, BHSD)
    assert packed.launched(flex, "bwd") == {"schedule": None, "kernel": None}

    def fails() -> None:
        raise RuntimeError("no launch record")

    monkeypatch.setattr(dash_attn, "last_launch_info", fails)
    assert packed.launched(dash, "bwd") == {"schedule": "auto", "kernel": None}


def test_a_broken_cuda_context_stops_the_run_with_the_culprit_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(packed, "gpu_alive", lambda device: False)  # as after an illegal address
    clock = Clock()
    spec = make_rows(["varlen", "window"], 0, total=128, **SIZE)

    def providers_for(row: PackedRow) -> tuple[list[PackedProvider], str | None]:
        fast = PackedProvider("fast", "dash", True, eager("fast", clock))
        return [fast, PackedProvider("broken", "dash", True, broken), fast], None

    rows = packed.run_packed(
        spec, providers_for, out_dir=tmp_path, meta={}, timer=clock, device="cpu",
        deadline=Deadline(None), warmup=1, rep=1, repeats=0,
    )  # fmt: skip
    status = [(r["row"], r["provider"], r["mode"], r["status"], r["reason"]) for r in rows]
    culprit = "CUDA context broken by broken"
    assert status == [
        ("varlen", "fast", "fwd", "ok", None),
        ("varlen", "fast", "bwd", "ok", None),
        ("varlen", "broken", "fwd", "error", "RuntimeError: kernel exploded"),
        ("varlen", "broken", "bwd", "not run", "CUDA context broken"),
        ("varlen", "fast", "fwd", "not run", culprit),
        ("varlen", "fast", "bwd", "not run", culprit),
        *[("window", n, m, "not run", culprit) for n in ("fast", "broken", "fast") for m in
          ("fwd", "bwd")],
    ]  # fmt: skip


class Recorder:
    """Stands in for an attention API with the signature of issue #12's contract (section 7)."""

    def __init__(self) -> None:
        self.calls: list[tuple[tuple, dict]] = []

    def varlen(
        self,
        q: Any,
        k: Any,
        v: Any,
        cu_seqlens_q: Any,
        cu_seqlens_k: Any,
        max_seqlen_q: int,
        max_seqlen_k: int,
        dropout_p: float = 0.0,
        softmax_scale: float | None = None,
        causal: bool = False,
        window_size: tuple[int, int] = (-1, -1),
        softcap: float = 0.0,
        alibi_slopes: Any = None,
        deterministic: bool = True,
        return_attn_probs: bool = False,
        *,
        schedule: str = "auto",
        backend: str = "auto",
        sm_margin: int = 0,
        return_lse: bool = False,
        invariant: bool = True,
    ) -> Any:
        self.calls.append(
            (
                (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k),
                {
                    "causal": causal,
                    "window_size": window_size,
                    "deterministic": deterministic,
                    "schedule": schedule,
                    "backend": backend,
                    "invariant": invariant,
                },
            )
        )
        return q

    def dense(
        self,
        q: Any,
        k: Any,
        v: Any,
        dropout_p: float = 0.0,
        softmax_scale: float | None = None,
        causal: bool = False,
        window_size: tuple[int, int] = (-1, -1),
        softcap: float = 0.0,
        alibi_slopes: Any = None,
        deterministic: bool = True,
        return_attn_probs: bool = False,
        *,
        schedule: str = "auto",
        backend: str = "auto",
        sm_margin: int = 0,
        return_lse: bool = False,
        invariant: bool = True,
    ) -> Any:
        self.calls.append(
            (
                (),
                {
                    "causal": causal,
                    "window_size": window_size,
                    "deterministic": deterministic,
                    "schedule": schedule,
                    "backend": backend,
                    "invariant": invariant,
                },
            )
        )
        return q


def test_dash_providers_call_the_contract_api(monkeypatch: pytest.MonkeyPatch) -> None:
    import dash_attn

    api = Recorder()
    monkeypatch.setattr(dash_attn, "dash_attn_varlen_func", api.varlen, raising=False)
    monkeypatch.setattr(dash_attn, "dash_attn_func", api.dense, raising=False)
    varlen, window = make_rows(["varlen", "window"], 0)
    x = torch.zeros(1)
    for row in (varlen, window):
        for p in providers_for_row(row)[0]:
            if p.family == "dash":
                p.make(row, "cpu")(x, x, x)
    calls = {}
    for (args, kw), name in zip(api.calls, [p.name for r in (varlen, window)
                                            for p in providers_for_row(r)[0]
                                            if p.family == "dash"], strict=True):  # fmt: skip
        calls.setdefault(name, []).append((args, kw))
    (args, kw), (wargs, wkw) = calls["dash_auto"]
    cu, cu_k, max_q, max_k = args
    assert cu.dtype == torch.int32 and cu.tolist() == varlen.cu_seqlens and cu_k is cu
    assert max_q == max_k == max(varlen.lengths)
    assert kw == {"causal": True, "window_size": (-1, -1), "deterministic": True,
                  "schedule": "auto", "backend": "triton", "invariant": True}  # fmt: skip
    assert wargs == () and wkw["window_size"] == (4096, 0) and wkw["causal"] is True
    assert [c[1]["invariant"] for c in calls["dash_auto_workers"]] == [False, False]
    assert [c[1]["deterministic"] for c in calls["dash_nondet"]] == [False, False]
    assert calls["dash_fa3"][0][1]["schedule"] == "fa3"


def test_fa4_providers_pass_varlen_and_window_by_keyword(monkeypatch: pytest.MonkeyPatch) -> None:
    import types

    calls: list[tuple[str, dict]] = []
    fake = types.ModuleType("flash_attn.cute")
    fake.flash_attn_func = lambda q, k, v, **kw: (calls.append(("dense", kw)), (q, None))[1]
    fake.flash_attn_varlen_func = lambda q, k, v, **kw: (calls.append(("varlen", kw)), q)[1]
    package = types.ModuleType("flash_attn")
    package.cute = fake
    monkeypatch.setitem(sys.modules, "flash_attn", package)
    monkeypatch.setitem(sys.modules, "flash_attn.cute", fake)
    varlen, window = make_rows(["varlen", "window"], 0)
    x = torch.ones(2)
    for row in (varlen, window):
        for p in providers_for_row(row)[0]:
            if p.family == "fa4":
                assert p.make(row, "cpu")(x, x, x) is x  # (out, lse) unpacked
    (kind, kw), _, (wkind, wkw), (_, wkw_nondet) = calls
    assert kind == "varlen" and kw["cu_seqlens_q"].tolist() == varlen.cu_seqlens
    assert kw["max_seqlen_q"] == kw["max_seqlen_k"] == max(varlen.lengths)
    assert kw["causal"] is True and kw["deterministic"] is True and "window_size" not in kw
    assert wkind == "dense" and wkw["window_size"] == (4096, 0) and wkw["causal"] is True
    assert wkw_nondet["deterministic"] is False


@pytest.mark.slow
def test_real_flex_provider_matches_the_brute_force_mask_on_cpu() -> None:
    """The compiled FlexAttention provider (forward; flex has no CPU backward) with documents,
    window and GQA at once, against attention with the block-diagonal mask (~30 s: compile)."""
    row = PackedRow("t", (7, 64, 1, 20, 33, 3), 2, 1, 16, window_left=5)
    flex = providers_for_row(row)[0][-1]
    inputs = packed.PackedInputs(row, "cpu", 0)
    q, k, v = (x.float() for x in inputs.get(flex.layout)[:3])
    out = packed.to_thd(flex.make(row, "cpu")(q, k, v), flex.layout)
    keep = torch.from_numpy(block_diagonal_mask(row))
    q, k, v = (x.float().transpose(0, 1) for x in inputs.thd[:3])
    k, v = (x.repeat_interleave(2, dim=0) for x in (k, v))
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=keep)
    torch.testing.assert_close(out, ref.transpose(0, 1), atol=1e-5, rtol=1e-5)


def test_append_keeps_the_other_rows_of_an_earlier_run(tmp_path: Path) -> None:
    clock = Clock()
    common = ["--out", str(tmp_path), "--tokens", "128", "--repeats", "0"]

    def main(*argv: str) -> None:
        assert packed.main([*common, *argv], device="cpu", timer=clock,
                           providers_for=fake_providers(clock), size=SIZE) == 0  # fmt: skip

    main("--rows", "varlen,window", "--providers", "fa4_det,fast")
    first = json.loads((tmp_path / "packed.json").read_text())
    TIMES["fast"] = 0.25  # the second run measures "fast" faster on the rows it redoes
    try:
        main("--rows", "window,varlen_gqa", "--providers", "fa4_det,fast", "--append")
    finally:
        TIMES["fast"] = 1.0
    info = json.loads((tmp_path / "packed.json").read_text())
    rows = read_rows(tmp_path / "packed.csv")
    fast = {
        r["row"]: float(r["ms"]) for r in rows if r["provider"] == "fast" and r["mode"] == "bwd"
    }
    assert fast == {"varlen": 1.0, "window": 0.25, "varlen_gqa": 0.25}
    assert [r["row"] for r in rows].count("window") == 4  # replaced, not duplicated
    assert [s["row"] for s in info["rows_spec"]] == ["varlen", "window", "varlen_gqa"]
    assert [r["rows"] for r in info["runs"]] == [["varlen"], ["window", "varlen_gqa"]]
    assert info["runs"][0]["command"] == first["command"]
    assert info["command"].endswith("--append")
    log = (tmp_path / "packed.log").read_text()
    assert log.count("== varlen:") == 1 and log.count("== window:") == 2


def test_a_plot_failure_leaves_the_tables(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_matplotlib(*args: Any) -> None:
        raise ImportError("No module named 'matplotlib'")

    monkeypatch.setattr(packed, "plot_packed", no_matplotlib)
    clock = Clock()
    argv = ["--out", str(tmp_path), "--tokens", "128", "--rows", "window", "--repeats", "0",
            "--providers", "fa4_det"]  # fmt: skip
    assert packed.main(argv, device="cpu", timer=clock, providers_for=fake_providers(clock),
                       size=SIZE) == 0  # fmt: skip
    assert len(read_rows(tmp_path / "packed.csv")) == 2
    assert not (tmp_path / "packed.png").exists()
    assert "no plot: ImportError: No module named 'matplotlib'" in (
        tmp_path / "packed.log").read_text()  # fmt: skip
