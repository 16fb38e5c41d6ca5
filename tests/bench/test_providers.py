"""Provider names, selection and the real peers on the CPU (``dash_attn.bench.providers``)."""

from __future__ import annotations

import pytest
import torch

from dash_attn.bench import report, runinfo, sweep
from dash_attn.bench.providers import Case, Provider, provider_names, select
from dash_attn.bench.timing import wall_clock_ms

from .helpers import META, fa4_installed, synthetic_rows


def test_provider_selection_by_family_name_and_pattern() -> None:
    def make(case: Case, device: object) -> None:
        return None

    names = provider_names()
    fakes = [Provider(n, n.split("_")[0], "nondet" not in n, make) for n in names]
    assert [p.name for p in select(fakes, ["fa4"])] == ["fa4_det", "fa4_nondet"]
    assert [p.name for p in select(fakes, ["flex", "dash_auto"])] == ["dash_auto", "flex"]
    assert {p.name for p in select(fakes, ["sdpa_flash*"])} == {"sdpa_flash_det", "sdpa_flash"}
    assert len(select(fakes, None)) == len(select(fakes, ["all"])) == len(names)


def test_missing_peer_gives_dash_instead_of_crash() -> None:
    rows = [r for r in synthetic_rows() if r["provider"] not in ("flex", "fa4_det")]
    text = report.ratio_table(rows)
    assert "-" in text.splitlines()[2]
    assert "dash auto / flex" in report.summary_table(rows)


def test_real_peer_providers_on_cpu(capsys: pytest.CaptureFixture[str]) -> None:
    """SDPA flash runs on the CPU too: the deterministic-mode context, the (b, h, s, d) layout,
    a backend that is missing (cuDNN) and a peer that is not installed (FA4) go through the
    same code as on the GPU."""
    from dash_attn.bench.providers import peer_providers

    chosen = select(peer_providers(), ["sdpa_*", "fa4_det"])
    skips = sweep.Skips([], set())
    rows = sweep.run_sweep(
        [Case(2, 64, 2, 2, 64, True)], lambda case: chosen, meta=META, mode="bwd",
        warmup=0.0, rep=1.0, repeats=3, seed=0, device="cpu", timer=wall_clock_ms,
        deadline=runinfo.Deadline(None), skips=skips,
    )  # fmt: skip
    assert [r["provider"] for r in rows] == ["sdpa_flash_det", "sdpa_flash"]
    assert all(r["bitwise_repeatable"] for r in rows)
    assert not torch.are_deterministic_algorithms_enabled()  # the context was undone
    assert {s["provider"] for s in skips.items} <= {"fa4_det", "sdpa_cudnn"}
    assert "fa4_det" in {s["provider"] for s in skips.items} or fa4_installed()


@pytest.mark.parametrize(
    ("mode", "headdim", "gap"),
    [
        ("fwd", 192, None),  # the forward covers 192 and 256
        ("fwd", 256, None),
        ("bwd", 192, "bwd head dims"),  # the backward here does not: skipped with the reason
        ("fwd_bwd", 256, "bwd head dims"),
        ("bwd", 128, None),
        ("fwd", 80, "fwd head dims"),
    ],
)
def test_hopper_provider_checks_the_directions_its_mode_runs(
    monkeypatch: pytest.MonkeyPatch, mode: str, headdim: int, gap: str | None
) -> None:
    """A forward sweep times the hopper forward wherever it runs; a sweep that times backwards
    skips it where the backward is missing (before, every mode asked for the backward). The
    backward's head dims are those it had until session 40 (64, 96, 128), so that the two
    directions' coverage differs as it may again."""
    import dash_attn.device
    from dash_attn.backends import hopper
    from dash_attn.bench.providers import ProviderUnavailable, providers_for_case
    from dash_attn.plan import DeviceInfo

    monkeypatch.setattr(hopper, "cutlass_available", lambda: True)
    monkeypatch.setattr(hopper, "BWD_HEADDIMS", (64, 96, 128))
    h100 = DeviceInfo(sm_count=132, capability=(9, 0), name="H100")
    monkeypatch.setattr(dash_attn.device, "device_info", lambda device: h100)
    case = Case(2, 512, 4, 4, headdim, True)
    chosen = select(providers_for_case(case, 132, mode), ["dash_hopper_auto"])
    assert [p.name for p in chosen] == ["dash_hopper_auto"]
    if gap is None:
        assert callable(chosen[0].make(case, "cuda"))
    else:
        with pytest.raises(ProviderUnavailable, match=gap):
            chosen[0].make(case, "cuda")
