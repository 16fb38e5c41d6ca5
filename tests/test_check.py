"""``dash_attn.check_determinism`` on the CPU: clean models come out clean, and a deliberately
nondeterministic piece (noise from an unseeded generator, a sum in a random order) is named first.
"""

from __future__ import annotations

import dataclasses
import os
import random

import pytest
import torch

from dash_attn.check import DeterminismReport, check_determinism

DIM = 8


def _fresh_generator() -> torch.Generator:
    # Seeded from the OS on every call: nothing the checker restores can make two runs agree.
    return torch.Generator().manual_seed(int.from_bytes(os.urandom(7), "little"))


class NoisyBackward(torch.autograd.Function):
    """Identity forward; the backward scales the gradient by 1 + 1e-3 * fresh noise."""

    @staticmethod
    def forward(ctx: object, x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    @staticmethod
    def backward(ctx: object, grad: torch.Tensor) -> torch.Tensor:
        return grad * (1 + 1e-3 * torch.rand(grad.shape, generator=_fresh_generator()))


class NoisyBackwardModule(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return NoisyBackward.apply(x)


class RandomOrderSum(torch.nn.Module):
    """Forward: each output row is a sum of many terms added in a random order (like atomics)."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(DIM, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        terms = self.proj(x).unsqueeze(1) * torch.linspace(0.1, 3.0, 64).view(1, 64, 1)
        order = torch.randperm(64, generator=_fresh_generator())
        total = torch.zeros_like(terms[:, 0])
        for i in order.tolist():
            total = total + terms[:, i]
        return total


class Block(torch.nn.Module):
    """Two linears around a functional op; ``noisy`` makes that op's backward nondeterministic
    (the way an attention function called inside an attention module is not a module)."""

    def __init__(self, noisy: bool = False, child: torch.nn.Module | None = None) -> None:
        super().__init__()
        self.up = torch.nn.Linear(DIM, DIM)
        self.down = torch.nn.Linear(DIM, DIM)
        self.noisy = noisy
        self.child = child

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.up(x)
        if self.noisy:
            h = NoisyBackward.apply(h)
        if self.child is not None:
            h = self.child(h)
        return self.down(torch.tanh(h)) + x


class Net(torch.nn.Module):
    """Blocks, a shared module called twice, a dict output with a non-tensor entry."""

    def __init__(self, blocks: list[Block]) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(blocks)
        self.shared = torch.nn.Linear(DIM, DIM)
        self.head = torch.nn.Linear(DIM, 1)

    def forward(self, x: torch.Tensor) -> dict[str, object]:
        for block in self.blocks:
            x = block(x)
        x = self.shared(self.shared(x))
        return {"y": self.head(x), "layers": len(self.blocks), "cache": object()}


def _batch(step: int) -> torch.Tensor:
    return torch.randn(4, DIM, generator=torch.Generator().manual_seed(1000 + step))


def _loss(model: torch.nn.Module, batch: torch.Tensor) -> torch.Tensor:
    out = model(batch)
    return out["y"].square().mean()


def _net(*blocks: Block) -> Net:
    torch.manual_seed(0)
    return Net(list(blocks) or [Block(), Block()])


def test_clean_model_is_deterministic_with_optimizer() -> None:
    model = _net()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    report = check_determinism(model, _batch, _loss, steps=2, optimizer=optimizer)
    assert isinstance(report, DeterminismReport)
    assert report.deterministic
    assert report.first is None and report.differences == ()
    assert report.losses[0] == report.losses[1] and len(report.losses[0]) == 2
    # forward in/out, backward grads and params after the step of 2 steps: many values.
    params = len(list(model.parameters()))
    assert report.compared > 2 * (2 * params)
    assert str(report).startswith("deterministic:")


def test_model_state_and_rng_are_restored() -> None:
    model = _net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rng_before = torch.random.get_rng_state()
    py_before = random.getstate()
    check_determinism(model, _batch, _loss, steps=2, optimizer=optimizer)
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert optimizer.state_dict()["state"] == {}
    assert all(p.grad is None for p in model.parameters())
    assert torch.equal(torch.random.get_rng_state(), rng_before)
    assert random.getstate() == py_before
    # Hooks are gone: the model runs exactly as before the check.
    for module in model.modules():
        assert not module._forward_hooks and not module._forward_pre_hooks
        assert not module._backward_hooks and not module._backward_pre_hooks


def test_names_a_module_whose_own_backward_is_nondeterministic() -> None:
    model = _net(Block(), Block(child=NoisyBackwardModule()), Block())
    report = check_determinism(model, _batch, _loss)
    first = report.first
    assert first is not None and not report.deterministic
    assert (first.phase, first.name, first.kind) == ("backward", "blocks.1.child", "grad_input")
    assert first.module_type == "NoisyBackwardModule"
    assert first.suspect.startswith("blocks.1.child (NoisyBackwardModule): its own backward")
    assert 0 < first.max_abs_diff < 1 and 0 < first.mismatched <= first.numel
    # Every forward value is equal (the noise is backward only), and everything downstream of
    # the noisy module in the backward differs.
    assert all(d.phase == "backward" for d in report.differences)
    assert "blocks.0.up.weight" in report.modules()
    text = str(report)
    assert "NOT deterministic" in text
    assert "first difference: step 0, backward, blocks.1.child: grad_input[0]" in text


def test_names_the_caller_of_a_nondeterministic_function() -> None:
    # The noisy op is a function inside block 1's forward: the first value that differs is the
    # gradient handed to blocks.1.up, and the code that produced it is block 1's own.
    model = _net(Block(), Block(noisy=True), Block())
    report = check_determinism(model, _batch, _loss)
    first = report.first
    assert first is not None
    assert (first.phase, first.name, first.kind) == ("backward", "blocks.1.up", "grad_output")
    assert first.suspect.startswith("blocks.1: its own backward code between submodules")


def test_names_a_random_order_sum_in_the_forward() -> None:
    model = _net(Block(), Block(child=RandomOrderSum()))
    report = check_determinism(model, _batch, _loss)
    first = report.first
    assert first is not None
    assert (first.step, first.phase, first.name, first.kind, first.path) == (
        0,
        "forward",
        "blocks.1.child",
        "output",
        "",
    )
    assert first.suspect.startswith("blocks.1.child (RandomOrderSum): its own forward")
    # Its own parameters were handed the same input: the projection's output is equal.
    assert "blocks.1.child.proj" not in [d.name for d in report.differences if d.phase == "forward"]


def test_module_called_several_times_is_told_apart_by_call() -> None:
    class NoisyOnSecondCall(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.calls = 0

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.calls += 1
            if self.calls % 2 == 0:  # the second call of each step
                return x + 1e-3 * torch.rand(x.shape, generator=_fresh_generator())
            return x * 1.0

    class Twice(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = NoisyOnSecondCall()
            self.head = torch.nn.Linear(DIM, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(self.inner(self.inner(x)))

    model = Twice()
    report = check_determinism(model, _batch, lambda m, b: m(b).sum())
    first = report.first
    assert first is not None
    assert (first.phase, first.name, first.kind, first.call) == ("forward", "inner", "output", 1)
    assert "(call 2)" in first.where


def test_control_flow_difference_is_reported() -> None:
    class Branchy(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = torch.nn.Linear(DIM, DIM)
            self.b = torch.nn.Linear(DIM, DIM)
            self.runs = 0

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.runs += 1
            layer = self.a if self.runs == 1 else self.b
            return layer(x)

    model = Branchy()
    report = check_determinism(model, _batch, lambda m, b: m(b).sum())
    details = {d.name: d.detail for d in report.differences if d.detail}
    assert "run 1 only" in details["a"]
    assert "run 2 only" in details["b"]


def test_non_tensor_outputs_are_compared_by_value_when_plain() -> None:
    class Counter(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(DIM, 1)
            self.count = 0

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, int, object]:
            self.count += 1
            return self.lin(x), self.count, object()

    report = check_determinism(Counter(), _batch, lambda m, b: m(b)[0].sum())
    # The int differs between runs (1 vs 2); the opaque object is compared by type only.
    assert [(d.name, d.kind, d.path) for d in report.differences] == [("<model>", "output", "[1]")]
    assert report.first is not None and report.first.detail == "int: 1 vs int: 2"


def test_plot_is_written(tmp_path: pytest.TempPathFactory) -> None:
    path = tmp_path / "diff.png"  # type: ignore[operator]
    report = check_determinism(_net(Block(noisy=True)), _batch, _loss, plot=path)
    assert report.plot == path
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"plot: {path}" in str(report)


def test_report_is_frozen() -> None:
    report = check_determinism(_net(), _batch, _loss)
    with pytest.raises(dataclasses.FrozenInstanceError):
        report.steps = 3  # type: ignore[misc]


def test_state_restored_and_hooks_removed_when_loss_fn_raises() -> None:
    model = _net()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    calls = []

    def failing(m: torch.nn.Module, batch: torch.Tensor) -> torch.Tensor:
        calls.append(1)
        if len(calls) == 2:
            raise KeyError("boom")
        return _loss(m, batch)

    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    with pytest.raises(KeyError, match="boom"):
        check_determinism(model, _batch, failing, steps=1, optimizer=optimizer)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(not m._forward_hooks for m in model.modules())


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"steps": 0}, ValueError, "steps must be an int >= 1"),
        ({"steps": True}, ValueError, "steps must be an int >= 1"),
        ({"batch_fn": 3}, TypeError, "batch_fn must be callable"),
        ({"loss_fn": None}, TypeError, "loss_fn must be callable"),
        ({"model": lambda x: x}, TypeError, "model must be a torch.nn.Module"),
        ({"optimizer": object()}, TypeError, "optimizer must be a torch.optim.Optimizer"),
        ({"backward_hooks": 1}, TypeError, "backward_hooks must be a bool"),
        ({"plot": 3}, TypeError, "plot must be a path"),
        ({"plot": "differences.txt"}, ValueError, r"plot must end in one of \.png, \.pdf, \.svg"),
        ({"loss_fn": lambda m, b: 1.0}, TypeError, "loss_fn must return a one-element tensor"),
        (
            {"loss_fn": lambda m, b: m(b)["y"]},
            TypeError,
            r"loss_fn must return a one-element tensor .* of shape \(4, 1\)",
        ),
    ],
)
def test_bad_arguments(kwargs: dict, error: type[Exception], match: str) -> None:
    args = {"model": _net(), "batch_fn": _batch, "loss_fn": _loss, **kwargs}
    with pytest.raises(error, match=match):
        check_determinism(**args)


class InPlaceOnOutput(torch.nn.Module):
    """Modifies a child's output in place: torch's module backward hooks forbid that."""

    def __init__(self, noisy: bool) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(DIM, DIM)
        self.head = torch.nn.Linear(DIM, 1)
        self.noisy = noisy

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.lin(x)
        h.mul_(2.0)
        if self.noisy:
            h = NoisyBackward.apply(h)
        return self.head(torch.tanh(h)).sum()


def test_in_place_on_module_output_asks_for_backward_hooks_off() -> None:
    with pytest.raises(RuntimeError, match="backward_hooks=False"):
        check_determinism(InPlaceOnOutput(noisy=False), _batch, lambda m, b: m(b))


def test_without_backward_hooks_parameter_gradients_locate_the_difference() -> None:
    torch.manual_seed(0)
    clean = check_determinism(
        InPlaceOnOutput(noisy=False), _batch, lambda m, b: m(b), backward_hooks=False
    )
    assert clean.deterministic
    noisy = check_determinism(
        InPlaceOnOutput(noisy=True), _batch, lambda m, b: m(b), backward_hooks=False
    )
    first = noisy.first
    assert first is not None
    # head's gradients come before the noise; lin's come after it.
    assert (first.kind, first.name.rpartition(".")[0]) == ("grad", "lin")
    assert all(d.kind in ("grad",) for d in noisy.differences)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without CUDA")
def test_demo_refuses_without_cuda(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("transformers")
    from dash_attn.check import main

    assert main([]) == 2
    err = capsys.readouterr().err
    assert err.startswith("dash-attn check: error: the demo needs a CUDA GPU")
    assert "check_determinism" in err


def test_demo_argument_errors(capsys: pytest.CaptureFixture[str]) -> None:
    from dash_attn.check import main

    with pytest.raises(SystemExit) as info:
        main(["--heads", "8", "--kv-heads", "3"])
    assert info.value.code == 2
    assert "--kv-heads: 3 does not divide --heads 8" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--seqlen", "0"])
    assert "--seqlen: must be >= 1" in capsys.readouterr().err


def test_demo_model_and_check_run_on_cpu() -> None:
    # The command's own code path (model, data, loss, check), small, with transformers' eager
    # attention on the CPU: deterministic there.
    pytest.importorskip("transformers")
    from dash_attn.check.demo import build_parser, run_demo

    args = build_parser().parse_args(
        ["--seqlen", "16", "--hidden", "64", "--heads", "2", "--kv-heads", "1", "--layers", "1"]
    )
    report = run_demo(args, "eager", device="cpu", dtype=torch.float32)
    assert report.deterministic, str(report)
    assert report.compared > 0 and report.losses[0] == report.losses[1]


def test_cli_check_subcommand_hands_over(capsys: pytest.CaptureFixture[str]) -> None:
    from dash_attn import cli

    if "check" not in cli.build_parser().format_help():
        pytest.skip("'dash-attn check' is not wired into dash_attn.cli yet")
    # The demo's own parser sees the arguments after 'check'.
    with pytest.raises(SystemExit) as info:
        cli.main(["check", "--kv-heads", "3"])
    assert info.value.code == 2
    assert "--kv-heads: 3 does not divide --heads 8" in capsys.readouterr().err
