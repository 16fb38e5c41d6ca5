"""tools/hopper/bwd_probe.py on the CPU: the reference itself meets the rule, a perturbed
gradient fails it, and grads() leaves the graph for another call."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from tools.hopper import bwd_probe  # noqa: E402


def test_rule_accepts_the_reference_and_rejects_a_perturbed_gradient() -> None:
    gen = torch.Generator().manual_seed(0)
    q, k, v, dout = (
        torch.randn(1, 37, 2, 16, generator=gen, dtype=torch.bfloat16) for _ in range(4)
    )
    ref, same = bwd_probe.grad_references(q, k, v, dout, causal=True)
    assert bwd_probe.grad_verdict("same", same, ref, same) == "rule ok"
    bad = [g.clone() for g in same]
    bad[1][0, 5, 1, 3] += 1.0
    assert bwd_probe.grad_verdict("bad", bad, ref, same).startswith("FAILS dk bad")


def test_grads_keeps_the_graph() -> None:
    leaves = [torch.randn(1, 5, 1, 8, requires_grad=True) for _ in range(3)]
    out = (leaves[0] * leaves[1] + leaves[2]).sum(-1, keepdim=True).expand(1, 5, 1, 8)
    dout = torch.ones_like(out)
    first, again = bwd_probe.grads(out, leaves, dout), bwd_probe.grads(out, leaves, dout)
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))


def test_variant_launch_prepares_the_named_variant_and_restores_the_choice(monkeypatch) -> None:
    pytest.importorskip("cutlass")
    from dash_attn.backends.hopper import launch as hopper_launch

    shipped = hopper_launch.bwd_variant
    seen = []
    monkeypatch.setattr(
        hopper_launch, "_prepare", lambda plan, q: seen.append(hopper_launch._variant(plan))
    )
    plan = type("Plan", (), {})()
    plan.problem = type("Problem", (), {"headdim": 64, "seqlen_k": 1024})()
    plan.problem.mask = type("Mask", (), {"causal": False})()
    plan.deterministic = True
    bwd_probe.variant_launch(plan, torch.empty(0), lambda name: name + "_x")
    assert seen == [shipped(64, False, 1024, True) + "_x"]
    assert hopper_launch.bwd_variant is shipped
    monkeypatch.setattr(hopper_launch, "_prepare", lambda plan, q: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        bwd_probe.variant_launch(plan, torch.empty(0), lambda name: name)
    assert hopper_launch.bwd_variant is shipped


def test_captured_backward_installs_its_launch_alone(monkeypatch) -> None:
    pytest.importorskip("cutlass")
    from dash_attn.backends.hopper import launch as hopper_launch

    monkeypatch.setattr(hopper_launch, "_launches", {"other": (None, None)})
    leaves = tuple(torch.randn(1, 4, 1, 8, requires_grad=True) for _ in range(3))
    out = leaves[0] * leaves[1] + leaves[2]
    base = bwd_probe.Captured(out, leaves, torch.ones_like(out), "key", "plan", "launch")
    swapped = base.with_launch("launch2")
    assert (swapped.plan, swapped.launch) == ("plan", "launch2")
    assert base.with_launch("launch3", plan="plan3").plan == "plan3"
    grads = swapped.backward()
    assert hopper_launch._launches == {"key": ("plan", "launch2")}
    assert torch.equal(grads[2], torch.ones_like(out))
    assert torch.equal(swapped.backward()[0], leaves[1].detach())


def test_captured_backward_hands_the_dispatcher_its_plan(monkeypatch) -> None:
    """The dispatcher makes its plan again at every backward; a captured backward pins it to
    the captured plan (else a cleared plan cache gives a new plan, and a fresh launch is timed),
    and restores the dispatcher's afterwards."""
    pytest.importorskip("cutlass")
    from dash_attn import dispatch
    from dash_attn.backends.hopper import launch as hopper_launch

    monkeypatch.setattr(hopper_launch, "_launches", {})
    seen = []

    class Planned(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x: torch.Tensor) -> torch.Tensor:
            return x * 2

        @staticmethod
        def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
            seen.append(dispatch.make_backward_plan("problem", schedule="auto"))
            return grad * 2

    leaf = torch.randn(4, requires_grad=True)
    base = bwd_probe.Captured(Planned.apply(leaf), (leaf,), torch.ones(4), "key", "plan", "l")
    made = dispatch.make_backward_plan
    (grad,) = base.backward()
    assert seen == ["plan"] and torch.equal(grad, torch.full((4,), 2.0))
    assert dispatch.make_backward_plan is made


def test_capture_refuses_other_than_one_launch(monkeypatch) -> None:
    pytest.importorskip("cutlass")
    import dash_attn
    from dash_attn.backends.hopper import launch as hopper_launch

    monkeypatch.setattr(hopper_launch, "_launches", {})

    def fake(q, k, v, backend, **kwargs):
        assert backend == "hopper" and kwargs == {"causal": True}
        hopper_launch._launches["k1"] = ("plan", "launch")
        return q * k + v

    monkeypatch.setattr(dash_attn, "dash_attn_func", fake)
    leaves = [torch.randn(1, 4, 1, 8, requires_grad=True) for _ in range(3)]
    dout = torch.ones(1, 4, 1, 8)
    got = bwd_probe.capture(leaves, dout, causal=True)
    assert (got.key, got.plan, got.launch) == ("k1", "plan", "launch")

    def two(q, k, v, backend, **kwargs):
        hopper_launch._launches.update(k1=("plan", "launch"), k2=("plan", "launch"))
        return q * k + v

    monkeypatch.setattr(dash_attn, "dash_attn_func", two)
    with pytest.raises(ValueError, match="one backward launch, got 2"):
        bwd_probe.capture(leaves, dout)
