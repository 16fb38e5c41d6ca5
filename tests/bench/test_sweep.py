"""The GPU loops of ``dash_attn.bench.sweep``, run on the CPU with test doubles."""

from __future__ import annotations

from pathlib import Path

import pytest

from dash_attn.bench import report, runinfo, sweep
from dash_attn.bench.providers import Case
from dash_attn.bench.timing import attention_flops, wall_clock_ms

from .helpers import META, fakes


def _logged(name: str, log: list[str]) -> sweep.Provider:
    """The fake provider ``name``, appending its name to ``log`` at every call (in forward mode
    the timed step calls the provider, so a timer sees which one it times)."""
    provider = next(p for p in fakes(Case(2, 32, 2, 2, 16, True)) if p.name == name)

    def build(case: Case, device: object):
        fn = provider.make(case, device)

        def logged(*args):
            log.append(name)
            return fn(*args)

        return logged

    return sweep.Provider(
        name, provider.family, provider.deterministic, build, layout=provider.layout
    )


@pytest.mark.parametrize("mode", ["bwd", "fwd", "fwd_bwd"])
def test_sweep_loop_on_cpu(mode: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cases = [Case(2, 32, 2, 2, 16, True), Case(1, 64, 2, 2, 16, False)]
    skips = sweep.Skips([], set())
    saved = []
    rows = sweep.run_sweep(
        cases, fakes, meta=META, mode=mode, warmup=0.0, rep=1.0, repeats=3, seed=0,
        device="cpu", timer=wall_clock_ms, deadline=runinfo.Deadline(None), skips=skips,
        on_config=lambda r: saved.append(len(r)),
    )  # fmt: skip
    assert saved == [3, 6]
    assert [r["provider"] for r in rows[:3]] == ["eager_det", "eager_bhsd", "eager_noisy"]
    for r in rows:
        assert r["ms"] > 0 and r["mode"] == mode
        flops = attention_flops(
            r["batch"], r["seqlen"], r["seqlen"], r["heads"], r["headdim"], r["causal"], mode
        )
        assert r["tflops"] == pytest.approx(flops / (r["ms"] * 1e-3) / 1e12)
    repeatable = {r["provider"]: r["bitwise_repeatable"] for r in rows}
    assert repeatable["eager_det"] and repeatable["eager_bhsd"]
    assert repeatable["eager_noisy"] is False
    assert [s["provider"] for s in skips.items] == ["broken", "broken"]
    out = capsys.readouterr().out
    assert out.count("skip broken") == 1 and "RuntimeError: kernel exploded" in out
    assert "second line" not in out
    report.write_csv(tmp_path / "bench.csv", rows, report.CSV_FIELDS)
    assert len(report.read_csv(tmp_path / "bench.csv")) == 6


def test_determinism_stage_on_cpu() -> None:
    rows = sweep.run_determinism(
        [Case(2, 32, 2, 2, 16, True)], fakes, meta=META, repeats=4, seed=0, device="cpu",
        deadline=runinfo.Deadline(None), skips=sweep.Skips([], set()),
    )  # fmt: skip
    by_name = {r["provider"]: r for r in rows}
    assert set(by_name) == {"eager_det", "eager_bhsd", "eager_noisy"}
    det = by_name["eager_det"]
    assert det["bitwise_repeatable"] and det["max_diff_dq"] == 0.0 and det["repeats"] == 4
    noisy = by_name["eager_noisy"]
    assert not noisy["bitwise_repeatable"] and noisy["max_diff_dv"] > 0
    assert "eager_noisy" in report.determinism_table(rows)


def test_deadline_stops_the_sweep(capsys: pytest.CaptureFixture[str]) -> None:
    rows = sweep.run_sweep(
        [Case(2, 32, 2, 2, 16, True)], fakes, meta=META, mode="bwd", warmup=0.0, rep=1.0,
        repeats=0, seed=0, device="cpu", timer=wall_clock_ms, deadline=runinfo.Deadline(0.0),
        skips=sweep.Skips([], set()),
    )  # fmt: skip
    assert rows == [] and "deadline reached" in capsys.readouterr().out


def test_rounds_interleave_providers_and_take_the_median() -> None:
    """With rounds=3 every provider is timed once per round (the second round in reverse order,
    rep split over the rounds), and ``ms`` is the median of its three rounds. (Forward mode: its
    step calls the provider, so the timer sees which one it times.)"""
    calls: list[tuple[str, float, float]] = []
    times = {"eager_det": iter([3.0, 1.0, 2.0]), "eager_bhsd": iter([5.0, 9.0, 4.0]),
             "eager_noisy": iter([1.0, 1.0, 7.0])}  # fmt: skip
    called: list[str] = []

    def timer(step, warmup: float, rep: float, grad_to_none) -> float:
        step()
        calls.append((called[-1], warmup, rep))
        return next(times[called[-1]])

    names = ["eager_det", "eager_bhsd", "eager_noisy"]
    rows = sweep.run_sweep(
        [Case(2, 32, 2, 2, 16, True)], lambda case: [_logged(n, called) for n in names], meta=META,
        mode="fwd", warmup=3.0, rep=6.0, repeats=2, seed=0, device="cpu", timer=timer,
        deadline=runinfo.Deadline(None), skips=sweep.Skips([], set()), rounds=3,
    )  # fmt: skip
    assert [name for name, _, _ in calls] == names + names[::-1] + names
    assert all((warmup, rep) == pytest.approx((1.0, 2.0)) for _, warmup, rep in calls)
    by_name = {r["provider"]: r for r in rows}
    assert [r["provider"] for r in rows] == names
    assert by_name["eager_det"]["ms"] == 2.0 and by_name["eager_det"]["ms_rounds"] == (
        "3.0000 1.0000 2.0000"
    )
    assert by_name["eager_bhsd"]["ms"] == 5.0 and by_name["eager_noisy"]["ms"] == 1.0
    assert by_name["eager_det"]["bitwise_repeatable"] is True
    assert by_name["eager_noisy"]["bitwise_repeatable"] is False


def test_a_provider_failing_in_a_later_round_is_skipped_and_the_rest_goes_on(
    capsys: pytest.CaptureFixture[str],
) -> None:
    rounds_seen = {"n": 0}

    def timer(step, warmup: float, rep: float, grad_to_none) -> float:
        step()
        rounds_seen["n"] += 1
        if rounds_seen["n"] == 5:  # eager_bhsd's second round (the second in reverse order)
            raise RuntimeError("lost in round two")
        return 1.0

    skips = sweep.Skips([], set())
    rows = sweep.run_sweep(
        [Case(2, 32, 2, 2, 16, True)], lambda case: fakes(case)[:3], meta=META, mode="bwd",
        warmup=0.0, rep=3.0, repeats=0, seed=0, device="cpu", timer=timer,
        deadline=runinfo.Deadline(None), skips=skips, rounds=2,
    )  # fmt: skip
    assert [r["provider"] for r in rows] == ["eager_det", "eager_noisy"]
    assert all(r["ms_rounds"] == "1.0000 1.0000" for r in rows)
    assert [s["provider"] for s in skips.items] == ["eager_bhsd"]
    assert "lost in round two" in capsys.readouterr().out


def test_rounds_must_be_positive() -> None:
    with pytest.raises(ValueError, match="rounds must be at least 1"):
        sweep.run_sweep(
            [Case(2, 32, 2, 2, 16, True)], fakes, meta=META, mode="bwd", warmup=0.0, rep=1.0,
            repeats=0, seed=0, device="cpu", timer=wall_clock_ms,
            deadline=runinfo.Deadline(None), skips=sweep.Skips([], set()), rounds=0,
        )  # fmt: skip


def test_gpu_idles_before_every_providers_turn(monkeypatch: pytest.MonkeyPatch) -> None:
    """``idle_s`` reaches ``timing.idle_gpu`` once per provider and round, before its timing."""
    events: list[tuple[str, float]] = []
    monkeypatch.setattr(sweep, "idle_gpu", lambda device, s: events.append(("idle", s)))

    def timer(step, warmup: float, rep: float, grad_to_none) -> float:
        step()
        events.append(("time", 0.0))
        return 1.0

    sweep.run_sweep(
        [Case(2, 32, 2, 2, 16, True)], lambda case: fakes(case)[:3], meta=META, mode="bwd",
        warmup=0.0, rep=3.0, repeats=0, seed=0, device="cpu", timer=timer,
        deadline=runinfo.Deadline(None), skips=sweep.Skips([], set()), rounds=2, idle_s=0.25,
    )  # fmt: skip
    assert events == [("idle", 0.25), ("time", 0.0)] * 6


def test_settle_calls_are_the_timers_warm_up_of_every_turn() -> None:
    """``settle_ms`` is added to each turn's warm-up (``warmup / rounds``): the provider's own
    untimed calls run back to back right before its timed ones, in every round."""
    warmups: list[float] = []

    def timer(step, warmup: float, rep: float, grad_to_none) -> float:
        step()
        warmups.append(warmup)
        return 1.0

    sweep.run_sweep(
        [Case(2, 32, 2, 2, 16, True)], lambda case: fakes(case)[:2], meta=META, mode="bwd",
        warmup=8.0, rep=3.0, repeats=0, seed=0, device="cpu", timer=timer,
        deadline=runinfo.Deadline(None), skips=sweep.Skips([], set()), rounds=2, settle_ms=500.0,
    )  # fmt: skip
    assert warmups == [504.0] * 4


def test_settle_must_not_be_negative() -> None:
    with pytest.raises(ValueError, match="settle_ms must be >= 0"):
        sweep.run_sweep(
            [Case(2, 32, 2, 2, 16, True)], fakes, meta=META, mode="bwd", warmup=0.0, rep=1.0,
            repeats=0, seed=0, device="cpu", timer=wall_clock_ms,
            deadline=runinfo.Deadline(None), skips=sweep.Skips([], set()), settle_ms=-1.0,
        )  # fmt: skip


def test_providers_are_primed_before_the_first_round(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every provider is made and called once, untimed, before round one (its compiles happen
    there, not inside a timed round's warm-up), and a priming pass longer than ``PRIME_IDLE_S``
    warms the GPU up again before the rounds."""
    events: list[str] = []

    def timer(step, warmup: float, rep: float, grad_to_none) -> float:
        step()
        events.append(f"timed {events[-1]}")
        return 1.0

    names = ["eager_det", "eager_bhsd"]
    warmed: list[float] = []
    monkeypatch.setattr(sweep, "warm_up_gpu", lambda device, seconds: warmed.append(seconds))
    for idle_s, want_warmed in ((3600.0, []), (-1.0, [sweep.REWARM_S])):
        events.clear()
        warmed.clear()
        monkeypatch.setattr(sweep, "PRIME_IDLE_S", idle_s)
        rows = sweep.run_sweep(
            [Case(2, 32, 2, 2, 16, True)], lambda case: [_logged(n, events) for n in names],
            meta=META, mode="fwd", warmup=0.0, rep=1.0, repeats=0, seed=0, device="cpu",
            timer=timer, deadline=runinfo.Deadline(None), skips=sweep.Skips([], set()), rounds=2,
        )  # fmt: skip
        assert [r["provider"] for r in rows] == names
        assert events == [
            "eager_det", "eager_bhsd",  # primed, untimed
            "eager_det", "timed eager_det", "eager_bhsd", "timed eager_bhsd",
            "eager_bhsd", "timed eager_bhsd", "eager_det", "timed eager_det",
        ]  # fmt: skip
        assert warmed == want_warmed


def test_a_provider_failing_its_priming_call_is_skipped(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The fakes' ``broken`` provider raises when it is made, now in the priming pass: it is
    skipped with its reason, once, and the others are timed in both rounds."""
    skips = sweep.Skips([], set())
    rows = sweep.run_sweep(
        [Case(2, 32, 2, 2, 16, True)], fakes, meta=META, mode="bwd", warmup=0.0, rep=1.0,
        repeats=0, seed=0, device="cpu", timer=wall_clock_ms, deadline=runinfo.Deadline(None),
        skips=skips, rounds=2,
    )  # fmt: skip
    assert "broken" not in {r["provider"] for r in rows} and len(rows) == 3
    assert all(len(r["ms_rounds"].split()) == 2 for r in rows)
    assert [s["provider"] for s in skips.items] == ["broken"]
    assert "RuntimeError: kernel exploded" in capsys.readouterr().out
