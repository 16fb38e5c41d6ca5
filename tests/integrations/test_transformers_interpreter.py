"""``attn_implementation="dash"`` with the real kernels in Triton's CPU interpreter (float16,
tiny models): logits match ``sdpa``, two training runs give bitwise-equal gradients, a padded
batch matches the unpadded sequences.

Run with ``TRITON_INTERPRET=1 python -m pytest -m interpreter``.
"""

from __future__ import annotations

import inspect
import os

import pytest
import torch

if os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip(
        "interpreter tests need TRITON_INTERPRET=1 set before dash_attn's kernels are imported",
        allow_module_level=True,
    )

import dash_attn.interface as interface
from dash_attn.check import check_determinism

pytestmark = [
    pytest.mark.interpreter,
    pytest.mark.filterwarnings("ignore:Conversion of an array with ndim > 0:DeprecationWarning"),
]

DTYPE = torch.float16  # the interpreter's only dtype
TOL = 1e-2  # fp16 logits of two attention implementations after two layers
HAS_VARLEN = hasattr(interface, "dash_attn_varlen_func")
HAS_WINDOW = "window_size" in inspect.signature(interface.dash_attn_func).parameters


def _model(hf, kind: str, attn: str) -> torch.nn.Module:
    return hf.build_model(kind, attn).to(DTYPE)


def _grads_after_two_steps(hf, kind: str, attn: str, ids: torch.Tensor) -> list[torch.Tensor]:
    model = _model(hf, kind, attn)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    grads = []
    for _ in range(2):
        optimizer.zero_grad(set_to_none=True)
        model(input_ids=ids, labels=ids).loss.backward()
        grads = [p.grad.clone() for p in model.parameters()]
        optimizer.step()
    return grads


@pytest.mark.parametrize(
    "kind",
    [
        "llama",
        pytest.param(
            "mistral",
            marks=pytest.mark.skipif(not HAS_WINDOW, reason="dash_attn_func has no window_size"),
        ),
    ],
)
def test_logits_match_sdpa(registered: str, hf, kind: str) -> None:
    ids = hf.tokens(2, 40, seed=0)
    with torch.no_grad():
        ours = _model(hf, kind, registered)(input_ids=ids).logits
        theirs = _model(hf, kind, "sdpa")(input_ids=ids).logits
    assert ours.dtype == DTYPE
    torch.testing.assert_close(ours, theirs, atol=TOL, rtol=TOL)


def test_two_training_runs_bitwise_equal(registered: str, hf) -> None:
    ids = hf.tokens(2, 40, seed=1)
    first = _grads_after_two_steps(hf, "llama", registered, ids)
    second = _grads_after_two_steps(hf, "llama", registered, ids)
    for a, b in zip(first, second, strict=True):
        assert torch.equal(a.view(torch.int16), b.view(torch.int16))


def test_checker_finds_the_dash_model_clean(registered: str, hf) -> None:
    model = _model(hf, "llama", registered)
    ids = hf.tokens(1, 33, seed=2)
    report = check_determinism(
        model, lambda step: ids, lambda m, batch: m(input_ids=batch, labels=batch).loss
    )
    assert report.deterministic, str(report)
    assert report.compared > 50


@pytest.mark.skipif(not HAS_VARLEN, reason="dash_attn_varlen_func not in this version yet")
def test_padded_batch_matches_unpadded(registered: str, hf) -> None:
    model = _model(hf, "llama", registered)
    lengths = [37, 20]
    seqs = [hf.tokens(1, n, seed=20 + i) for i, n in enumerate(lengths)]
    ids = torch.zeros(2, max(lengths), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for b, s in enumerate(seqs):
        ids[b, : s.shape[1]], mask[b, : s.shape[1]] = s[0], 1
    with torch.no_grad():
        padded = model(input_ids=ids, attention_mask=mask).logits
        for b, s in enumerate(seqs):
            alone = model(input_ids=s).logits
            torch.testing.assert_close(padded[b, : s.shape[1]], alone[0], atol=TOL, rtol=TOL)
