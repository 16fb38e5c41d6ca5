"""CUDA graphs (skipped without CUDA): forward + backward captured with ``torch.cuda.graph``,
``torch.cuda.make_graphed_callables`` and ``torch.compile(mode="reduce-overhead")`` give eager's
bits at every replay (deterministic mode, also with another stream busy) and follow new inputs
copied into the captured ones; a timed-out wait in a replay raises at the next check; the varlen
functions refuse to be captured.

Capture as torch's documentation says: warm up on a side stream first, and give the graph leaves
that no eager backward has used (autograd keeps the stream of a leaf's first backward, and a
capture that has to wait for the default stream fails).

Run: ``python -m pytest -q tests/test_gpu_graphs.py`` on a CUDA machine.
"""

from __future__ import annotations

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

if torch.cuda.is_available():
    from dash_attn import check_errors, dash_attn_func, dash_attn_varlen_func
    from dash_attn.device import device_info
    from dash_attn.dispatch import backend_module, problem_of
    from dash_attn.plan import make_backward_plan
    from dash_attn.reference.attention import attention_ref
    from dash_attn.schedule import FULL
    from dash_attn.testing import (
        assert_close_to_ref,
        broken_ranks,
        capture_grad_step,
        grad_step,
        hopper_gap,
    )

BACKENDS = ["triton", "hopper"]
# (batch, seqlen_q, seqlen_k, heads, kv_heads, headdim, causal): not tile multiples, GQA, Sq != Sk.
CASES = [
    pytest.param((2, 1000, 1000, 4, 2, 128, True), id="b2-s1000-gqa4:2-d128-causal"),
    pytest.param((1, 777, 333, 6, 2, 64, False), id="b1-sq777-sk333-gqa6:2-d64-full"),
    pytest.param((1, 333, 777, 6, 6, 64, True), id="b1-sq333-sk777-d64-causal"),
]


def _inputs(case: tuple, seed: int) -> tuple[torch.Tensor, ...]:
    """q, k, v, dout from a CPU generator (a failed capture leaves the CUDA generator unusable
    for the rest of the process)."""
    b, sq, sk, h, hk, d, _ = case
    gen = torch.Generator().manual_seed(seed)
    shapes = ((b, sq, h, d), (b, sk, hk, d), (b, sk, hk, d), (b, sq, h, d))
    return tuple(torch.randn(s, generator=gen).to("cuda", torch.bfloat16) for s in shapes)


def _leaves(*tensors: torch.Tensor) -> list[torch.Tensor]:
    return [t.detach().clone().requires_grad_() for t in tensors]


def _step(fn, q, k, v, dout) -> tuple[torch.Tensor, ...]:
    return grad_step(fn, (q, k, v), dout)()


def _attention(backend: str, causal: bool, deterministic: bool):
    def fn(q, k, v):
        return dash_attn_func(q, k, v, causal=causal, backend=backend, deterministic=deterministic)

    return fn


def _skip_if_uncovered(backend: str, q: torch.Tensor, k: torch.Tensor, causal: bool) -> None:
    if backend == "hopper" and (gap := hopper_gap(q, k, causal)) is not None:
        pytest.skip(f"hopper backend: {gap}")


def _busy_side_stream() -> None:
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
        for _ in range(20):
            a = (a @ a).clamp_(-1, 1)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("deterministic", [True, False], ids=["det", "nondet"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_replays_give_eager_bits_and_follow_new_inputs(backend, deterministic, case):
    causal = case[-1]
    q0, k0, v0, dout = _inputs(case, 5)
    _skip_if_uncovered(backend, q0, k0, causal)
    fn = _attention(backend, causal, deterministic)
    eager = _step(fn, *_leaves(q0, k0, v0), dout)
    q, k, v = _leaves(q0, k0, v0)
    replay, static = capture_grad_step(fn, (q, k, v), dout)
    replay()
    first = [t.clone() for t in static]
    _busy_side_stream()
    replay()
    torch.cuda.synchronize()
    check_errors()
    names = ("out", "dq", "dk", "dv")
    if deterministic:
        for name, a, b, c in zip(names, eager, first, static, strict=True):
            assert torch.equal(a, b), f"{name}: replay differs from eager [{backend}]"
            assert torch.equal(b, c), f"{name}: replays differ with a stream busy [{backend}]"
    # New inputs copied into the captured ones: eager on them, and fp32 by the flash-attn rule.
    q2, k2, v2, dout2 = _inputs(case, 6)
    with torch.no_grad():
        for static_input, new in zip((q, k, v, dout), (q2, k2, v2, dout2), strict=True):
            static_input.copy_(new)
    replay()
    torch.cuda.synchronize()
    ref = _step(
        lambda a, b, c: attention_ref(a, b, c, causal=causal)[0], *_leaves(q2, k2, v2), dout2
    )
    same = _step(
        lambda a, b, c: attention_ref(a, b, c, causal=causal, upcast=False)[0],
        *_leaves(q2, k2, v2), dout2,
    )  # fmt: skip
    for name, got, r, s in zip(names, static, ref, same, strict=True):
        assert_close_to_ref(f"{name} replayed [{backend}]", got, r, s, atol=1e-3)
    if deterministic:
        eager2 = _step(fn, *_leaves(q2, k2, v2), dout2)
        for name, a, b in zip(names, eager2, static, strict=True):
            assert torch.equal(a, b), f"{name}: replay on new inputs differs from eager [{backend}]"


@pytest.mark.parametrize("backend", BACKENDS)
def test_make_graphed_callables_matches_eager(backend):
    case = (2, 1000, 1000, 4, 2, 128, True)
    q0, k0, v0, dout = _inputs(case, 7)
    _skip_if_uncovered(backend, q0, k0, True)
    fn = _attention(backend, True, True)
    eager = _step(fn, *_leaves(q0, k0, v0), dout)
    leaves = _leaves(q0, k0, v0)
    graphed = torch.cuda.make_graphed_callables(fn, tuple(leaves))
    for _ in range(2):
        got = _step(graphed, *leaves, dout)
        for name, a, b in zip(("out", "dq", "dk", "dv"), eager, got, strict=True):
            assert torch.equal(a, b), f"{name}: graphed callable differs from eager [{backend}]"


@pytest.mark.parametrize("backend", BACKENDS)
def test_reduce_overhead_compile_matches_eager(backend):
    case = (1, 777, 333, 6, 2, 64, False)
    q0, k0, v0, dout = _inputs(case, 8)
    _skip_if_uncovered(backend, q0, k0, False)
    fn = _attention(backend, False, True)
    eager = _step(fn, *_leaves(q0, k0, v0), dout)
    compiled = torch.compile(fn, mode="reduce-overhead")
    leaves = _leaves(q0, k0, v0)
    for _ in range(4):  # warm-up, recording, then replays
        got = [t.clone() for t in _step(compiled, *leaves, dout)]
        for name, a, b in zip(("out", "dq", "dk", "dv"), eager, got, strict=True):
            assert torch.equal(a, b), f"{name}: reduce-overhead differs from eager [{backend}]"


@pytest.mark.parametrize("backend", BACKENDS)
def test_timed_out_wait_in_a_replay_raises_at_the_next_check(backend):
    # The broken table of test_gpu.py (every rank + 1: no dQ tile's first turn ever comes),
    # captured: each replay's timeout raises at the next check, with the plan's text.
    batch, seqlen, heads, headdim = 1, 1024, 2, 64
    q0, k0, v0, dout = _inputs((batch, seqlen, seqlen, heads, heads, headdim, False), 9)
    _skip_if_uncovered(backend, q0, k0, False)
    out, lse = dash_attn_func(q0, k0, v0, return_lse=True, backend=backend)
    good = make_backward_plan(
        problem_of(q0, k0, FULL), device=device_info(q0.device), schedule="shift",
        backend=backend, timeout_s=0.2,
    )  # fmt: skip
    broken = broken_ranks(good)
    run_backward = backend_module(backend).run_backward
    args = (dout, q0, k0, v0, out, lse, headdim**-0.5)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up: kernels, tables, and the eager launch's own error
        run_backward(good, *args)
        run_backward(broken, *args)
    torch.cuda.current_stream().wait_stream(side)
    with pytest.raises(RuntimeError, match="timed out.*'broken'"):
        check_errors()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        grads = run_backward(broken, *args)
    for _ in range(2):
        graph.replay()
        with pytest.raises(RuntimeError, match="timed out.*'broken'"):
            check_errors()
        assert torch.isnan(grads[0].float()).any()
    check_errors()  # each replay's error was reported once
    again = dash_attn_func(q0, k0, v0, backend=backend)
    assert torch.isfinite(again.float()).all()


def test_varlen_refuses_to_be_captured():
    lens = torch.tensor([0, 300, 700], dtype=torch.int32, device="cuda")
    q, k, v = (
        torch.randn(700, 4, 64, device="cuda", dtype=torch.bfloat16).requires_grad_()
        for _ in range(3)
    )
    dash_attn_varlen_func(q, k, v, lens, lens, 400, 400)  # eager: fine, and cached
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    refused = pytest.raises(RuntimeError, match="cannot be captured in a CUDA graph")
    with torch.cuda.stream(side), refused, torch.cuda.graph(graph):
        dash_attn_varlen_func(q, k, v, lens, lens, 400, 400)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
