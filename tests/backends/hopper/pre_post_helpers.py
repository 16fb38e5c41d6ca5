"""What the tests of the hopper backward's kernels around the main one share
(``test_bwd_pre_post.py``): the skip markers, the dtypes and the (head dim, block_m) of every
shipped backward variant."""

from __future__ import annotations

import importlib.util

import pytest
import torch

needs_cute_dsl = pytest.mark.skipif(
    importlib.util.find_spec("cutlass") is None or importlib.util.find_spec("tvm_ffi") is None,
    reason="needs nvidia-cutlass-dsl and apache-tvm-ffi",
)

DTYPES = [torch.float16, torch.bfloat16]
# (head dim, block_m) of every shipped backward variant.
SHIPPED = [(64, 128), (96, 64), (128, 80), (128, 64), (192, 64), (256, 64)]


def cutlass_dtype(dtype: torch.dtype):
    """torch's 16-bit dtype as cutlass's."""
    import cutlass

    return {torch.float16: cutlass.Float16, torch.bfloat16: cutlass.BFloat16}[dtype]


def hopper_gpu() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


gpu = pytest.mark.skipif(not hopper_gpu(), reason="needs an sm_90 GPU")


def assert_repeats_and_replays(grads, first, attention, inputs, dout) -> None:
    """``grads()`` equals ``first`` (bitwise) five times alone and five times while another
    stream runs matmuls, and ``attention``'s gradient step captured in a CUDA graph replays to
    the same bits three times (``inputs``: q, k, v)."""
    from dash_attn.testing import capture_grad_step

    side = torch.cuda.Stream()
    x = torch.randn(4096, 4096, device="cuda")
    for busy in (False, True):
        for _ in range(5):
            if busy:
                with torch.cuda.stream(side):
                    x = x @ x / 64
            again = grads()
            assert all(torch.equal(a, b) for a, b in zip(again, first, strict=True))
    torch.cuda.synchronize()
    leaves = [t.detach().clone().requires_grad_() for t in inputs]
    replay, outputs = capture_grad_step(attention, leaves, dout)
    for _ in range(3):
        replay()
        torch.cuda.synchronize()
        assert all(torch.equal(a, b) for a, b in zip(outputs[1:], first, strict=True))


def record_kernel_calls(monkeypatch) -> list[tuple[str, tuple]]:
    """The kernels of a ``FullBackward`` (the main kernel, the preprocess and the dQ cast)
    replaced by stand-ins that append ``(name, args)`` to the returned list at each launch:
    ``main``, ``pre``, ``cast``."""
    from dash_attn.backends.hopper import bwd_launch

    calls: list[tuple[str, tuple]] = []
    recorder = {name: (lambda *args, name=name: calls.append((name, args)))
                for name in ("pre", "main", "cast")}  # fmt: skip
    monkeypatch.setattr(bwd_launch, "compile_bwd", lambda *a, **kw: recorder["main"])
    hopper = "dash_attn.backends.hopper"
    for target, name in (
        ("bwd_pre_post.compile_preprocess", "pre"),
        ("bwd_pre_post.compile_dq_cast", "cast"),
    ):
        monkeypatch.setattr(f"{hopper}.{target}", lambda *a, name=name, **kw: recorder[name])
    return calls
