"""GPU tests of the integrations (skipped without CUDA): the SDPA-shaped wrapper, transformers'
``attn_implementation="dash"`` (Llama GQA, Qwen2 and Mistral with sliding windows), the
determinism switch wired into ``dash_attn_func``, the ``dash-attn check`` demo, and the
deterministic-training example on one and two GPUs.

Run: ``python -m pytest -q tests/test_gpu_integrations.py`` on a CUDA machine.
"""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

ROOT = Path(__file__).resolve().parents[1]
DTYPE = torch.bfloat16


def _interface():
    import dash_attn.interface as interface

    return interface


def _has_varlen() -> bool:
    return hasattr(_interface(), "dash_attn_varlen_func")


def _has_window() -> bool:
    return "window_size" in inspect.signature(_interface().dash_attn_func).parameters


def _bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (
        a.dtype == b.dtype
        and a.shape == b.shape
        and torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))
    )


# -- SDPA-shaped wrapper ---------------------------------------------------------------------


@pytest.mark.parametrize("is_causal", [False, True])
def test_sdpa_wrapper_matches_torch(is_causal: bool) -> None:
    from dash_attn import sdpa

    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(2, 8, 1000, 128, device="cuda", generator=gen).to(DTYPE).requires_grad_()
    k = torch.randn(2, 2, 1000, 128, device="cuda", generator=gen).to(DTYPE).requires_grad_()
    v = torch.randn(2, 2, 1000, 128, device="cuda", generator=gen).to(DTYPE).requires_grad_()
    grad = torch.randn(2, 8, 1000, 128, device="cuda", generator=gen).to(DTYPE)
    out = sdpa.scaled_dot_product_attention(q, k, v, is_causal=is_causal, enable_gqa=True)
    ref32 = F.scaled_dot_product_attention(
        q.float(), k.float(), v.float(), is_causal=is_causal, enable_gqa=True
    )
    ref16 = F.scaled_dot_product_attention(q, k, v, is_causal=is_causal, enable_gqa=True)
    # flash-attn's rule: at most twice the error of the same-dtype PyTorch computation.
    ours_err = (out.float() - ref32).abs().max().item()
    torch_err = (ref16.float() - ref32).abs().max().item()
    assert ours_err <= 2 * torch_err + 1e-3
    grads = torch.autograd.grad(out, (q, k, v), grad)
    again = torch.autograd.grad(
        sdpa.scaled_dot_product_attention(q, k, v, is_causal=is_causal, enable_gqa=True),
        (q, k, v),
        grad,
    )
    assert all(_bits_equal(a, b) for a, b in zip(grads, again, strict=True))


# -- determinism switch (needs interface.py to call dash_attn.determinism) --------------------


def test_torch_deterministic_switch_refuses_nondeterministic_backward() -> None:
    from dash_attn import dash_attn_func

    q = torch.randn(1, 128, 2, 64, device="cuda", dtype=DTYPE, requires_grad=True)
    enabled = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    try:
        torch.use_deterministic_algorithms(True)
        with pytest.raises(RuntimeError, match="does not have a deterministic implementation"):
            dash_attn_func(q, q, q, causal=True, deterministic=False)
        dash_attn_func(q, q, q, causal=True).sum().backward()  # deterministic=True: fine
        torch.use_deterministic_algorithms(True, warn_only=True)
        with pytest.warns(UserWarning, match="deterministic=False"):
            dash_attn_func(q, q, q, causal=True, deterministic=False)
    finally:
        torch.use_deterministic_algorithms(enabled, warn_only=warn_only)


# -- transformers ----------------------------------------------------------------------------


def _config(kind: str):
    transformers = pytest.importorskip("transformers")
    common = {
        "vocab_size": 256,
        "hidden_size": 256,
        "intermediate_size": 512,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "max_position_embeddings": 1024,
        "attention_dropout": 0.0,
    }
    if kind == "llama":
        return transformers.LlamaConfig(**common)
    if kind == "qwen2":
        return transformers.Qwen2Config(
            use_sliding_window=True, sliding_window=128, max_window_layers=1, **common
        )
    return transformers.MistralConfig(sliding_window=128, **common)


def _model(kind: str, attn: str, dtype: torch.dtype = DTYPE) -> torch.nn.Module:
    import transformers

    from dash_attn.integrations.transformers import register

    register()
    torch.manual_seed(0)  # the same fp32 init for every implementation, then cast
    model = transformers.AutoModelForCausalLM.from_config(_config(kind), attn_implementation=attn)
    return model.to(device="cuda", dtype=dtype)


def _ids(batch: int, seqlen: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (batch, seqlen), generator=gen).cuda()


def _needs(kind: str) -> None:
    if kind != "llama" and not _has_window():
        pytest.skip("sliding windows need dash_attn_func(..., window_size=)")


@pytest.mark.parametrize("kind", ["llama", "qwen2", "mistral"])
def test_transformers_logits_match_sdpa(kind: str) -> None:
    _needs(kind)
    ids = _ids(2, 500, seed=1)
    with torch.no_grad():
        ours = _model(kind, "dash")(input_ids=ids).logits.float()
        theirs = _model(kind, "sdpa")(input_ids=ids).logits.float()
        ref = _model(kind, "sdpa", torch.float32)(input_ids=ids).logits
    ours_err = (ours - ref).abs().max().item()
    theirs_err = (theirs - ref).abs().max().item()
    assert ours_err <= 2 * theirs_err + 1e-2, (ours_err, theirs_err)


@pytest.mark.parametrize("kind", ["llama", "qwen2", "mistral"])
def test_transformers_two_training_runs_bitwise_equal(kind: str) -> None:
    _needs(kind)

    def run() -> list[torch.Tensor]:
        model = _model(kind, "dash")
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        grads: list[torch.Tensor] = []
        for step in range(2):
            ids = _ids(2, 700, seed=10 + step)
            model(input_ids=ids, labels=ids).loss.backward()
            grads = [p.grad.clone() for p in model.parameters()]
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        return grads

    first, second = run(), run()
    assert all(_bits_equal(a, b) for a, b in zip(first, second, strict=True))


@pytest.mark.parametrize("kind", ["llama", "mistral"])
def test_transformers_padded_batch_matches_unpadded(kind: str) -> None:
    _needs(kind)
    if not _has_varlen():
        pytest.skip("padding needs dash_attn_varlen_func")
    model = _model(kind, "dash")
    lengths = [600, 333]
    seqs = [_ids(1, n, seed=20 + i) for i, n in enumerate(lengths)]
    ids = torch.zeros(2, max(lengths), dtype=torch.long, device="cuda")
    mask = torch.zeros_like(ids)
    for b, s in enumerate(seqs):
        ids[b, : s.shape[1]], mask[b, : s.shape[1]] = s[0], 1
    with torch.no_grad():
        padded = model(input_ids=ids, attention_mask=mask).logits.float()
        for b, s in enumerate(seqs):
            alone = model(input_ids=s).logits.float()
            torch.testing.assert_close(padded[b, : s.shape[1]], alone[0], atol=2e-2, rtol=2e-2)


# -- the checker's demo ------------------------------------------------------------------------


def _demo_args(**overrides: object):
    from dash_attn.check.demo import build_parser

    args = build_parser().parse_args(["--seqlen", "2048", "--batch", "2"])
    for key, value in overrides.items():
        setattr(args, key, value)
    return args


def test_check_demo_dash_is_clean() -> None:
    pytest.importorskip("transformers")
    from dash_attn.check.demo import run_demo

    report = run_demo(_demo_args(), "dash")
    assert report.deterministic, str(report)


def test_check_demo_sdpa_names_the_attention() -> None:
    pytest.importorskip("transformers")
    from dash_attn.check.demo import run_demo

    # PyTorch's fused backward adds dQ with atomics; whether two runs differ is up to the
    # scheduling, so a few tries. When they differ, the first difference must be the attention.
    for _ in range(3):
        report = run_demo(_demo_args(), "sdpa")
        if not report.deterministic:
            break
    else:
        pytest.skip("sdpa's backward happened to be reproducible in 3 tries on this GPU")
    print(report)
    assert "self_attn" in report.first.suspect, str(report)


# -- deterministic training example -----------------------------------------------------------


def test_train_example_one_gpu_dash_identical(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    command = [sys.executable, str(ROOT / "examples" / "train_tiny_llama.py"), "--attn", "dash",
               "--steps", "100", "--out", str(tmp_path)]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, env=_env())
    print(done.stdout)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "two runs: bitwise identical" in done.stdout


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
@pytest.mark.parametrize("wrap", ["--ddp", "--fsdp"])
def test_train_example_two_gpus_dash_identical(wrap: str, tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
               "2", str(ROOT / "examples" / "train_tiny_llama.py"), "--attn", "dash", wrap,
               "--steps", "100", "--out", str(tmp_path)]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, env=_env())
    print(done.stdout)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "two runs: bitwise identical" in done.stdout


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}
