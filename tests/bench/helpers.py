"""Shared test doubles of the bench tests: argument parsing, synthetic rows, eager providers."""

from __future__ import annotations

import argparse
import itertools
import math

import pytest
import torch

from dash_attn.bench import main
from dash_attn.bench.providers import BHSD, Case, Provider
from dash_attn.bench.timing import attention_flops


def parse_bench_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(allow_abbrev=False)
    main.add_bench_arguments(parser)
    args = parser.parse_args(argv)
    main._apply_defaults(args)
    return args


SEQLENS = (512, 1024, 2048, 4096)


FACTORS = {
    "dash_auto": 1.2,
    "dash_fa3": 1.0,
    "dash_descending": 1.1,
    "dash_shift": 1.2,
    "dash_symmetric_shift": 1.2,
    "dash_nondet": 1.25,
    "fa4_det": 0.96,
    "fa4_nondet": 1.28,
    "flex": 0.8,
    "sdpa_flash_det": 0.5,
}


META = {
    "gpu": "Test GPU",
    "sm_count": 132,
    "torch": "t",
    "triton": "tr",
    "commit": "c0ffee",
    "date": "2026-01-01",
}


def synthetic_rows(mode: str = "bwd") -> list[dict]:
    rows = []
    for headdim in (64, 128):
        for causal in (False, True):
            for seqlen in SEQLENS:
                heads, batch = 2048 // headdim, 16384 // seqlen
                flops = attention_flops(batch, seqlen, seqlen, heads, headdim, causal, mode)
                curve = 100.0 + 20.0 * math.log2(seqlen / 256) + (10.0 if headdim == 128 else 0)
                for name, factor in FACTORS.items():
                    if name == ("dash_symmetric_shift" if not causal else "dash_shift"):
                        continue
                    value = factor * curve
                    auto = "symmetric_shift" if causal else "shift"
                    schedule = auto if name in ("dash_auto", "dash_nondet") else None
                    if name.startswith("dash_") and schedule is None:
                        schedule = name.removeprefix("dash_")
                    rows.append(
                        {
                            **META,
                            "mode": mode,
                            "dtype": "bf16",
                            "headdim": headdim,
                            "seqlen": seqlen,
                            "batch": batch,
                            "heads": heads,
                            "causal": causal,
                            "provider": name,
                            "deterministic": "nondet" not in name,
                            "schedule": schedule,
                            "ms": flops / (value * 1e12) * 1e3,
                            "tflops": value,
                            "bitwise_repeatable": "nondet" not in name,
                        }
                    )
    return rows


def no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    real = main.machine_info

    def info(commit: str | None = None) -> dict:
        out = real(commit)
        out.update(gpu="none", sm_count=None, cuda_available=False)
        return out

    monkeypatch.setattr(main, "machine_info", info)


class Noisy(torch.autograd.Function):
    """Scales by a factor that differs on every call (forward and backward). Not random: a
    random 1e-3 scale rounded to the same bf16 value in two calls now and then, and a test
    that expects "not repeatable" failed now and then (once in six local runs)."""

    calls = itertools.count(1)

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        # Steps of 3% exceed bf16's relative spacing (2^-7), so every call rounds differently.
        return x * (1 + 0.03 * (next(Noisy.calls) % 8))

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        return grad * (1 + 0.03 * (next(Noisy.calls) % 8))


def eager(layout: str, noisy: bool = False):
    def make(case: Case, device: object):
        def fn(q, k, v):
            if layout != BHSD:
                q, k, v = (x.transpose(1, 2) for x in (q, k, v))
            out = torch.nn.functional.scaled_dot_product_attention(
                q.float(), k.float(), v.float(), is_causal=case.causal
            )
            if noisy:  # a non-deterministic "kernel": output and gradients vary by call
                out = Noisy.apply(out)
            out = out.to(q.dtype)
            return out if layout == BHSD else out.transpose(1, 2)

        return fn

    return make


def broken(case: Case, device: object) -> None:
    raise RuntimeError("kernel exploded\nsecond line")


def fakes(case: Case) -> list[Provider]:
    return [
        Provider("eager_det", "test", True, eager("bshd")),
        Provider("eager_bhsd", "test", True, eager(BHSD), layout=BHSD),
        Provider("eager_noisy", "test", False, eager("bshd", noisy=True)),
        Provider("broken", "test", True, broken),
    ]


def dash_named_fakes(case: Case, workers: int) -> list[Provider]:
    """Eager attention under dash's provider names, so that every stage finds what it needs."""
    names = ["dash_auto", "dash_fa3", "dash_descending", "dash_shift", "dash_nondet"]
    fakes = [
        Provider(n, "dash", n != "dash_nondet", eager("bshd"), schedule=n.removeprefix("dash_"))
        for n in names
    ]
    return [*fakes, Provider("flex", "flex", True, eager(BHSD), layout=BHSD)]


def fa4_installed() -> bool:
    from dash_attn.bench.providers import fa4_status

    return fa4_status() is None
