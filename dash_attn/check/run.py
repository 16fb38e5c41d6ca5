"""``check_determinism``: run the same training step(s) twice from the same state and compare."""

from __future__ import annotations

import copy
import random
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from .compare import LOSS, DeterminismReport, compare_runs
from .plot import plot_differences
from .record import Event, Recorder

# The figure formats ``plot`` may name (matplotlib writes each without extra packages).
PLOT_SUFFIXES = (".png", ".pdf", ".svg")

__all__ = ["check_determinism"]

_EXPECTED_HOOK_WARNINGS = (
    "For backward hooks to be called, module output should be a Tensor",
    "Full backward hook is firing when gradients are computed with respect to module outputs",
)


class _State:
    """Everything a step reads that a step may change: parameters and buffers, the optimizer's
    state and every random generator a training step commonly draws from."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> None:
        self.model = model
        self.optimizer = optimizer
        self.tensors = {k: t.detach().clone() for k, t in model.state_dict().items()}
        self.optim = copy.deepcopy(optimizer.state_dict()) if optimizer is not None else None
        self.cpu_rng = torch.random.get_rng_state()
        # Only devices already in use: initialising CUDA here would be a side effect of its own.
        self.cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
        self.py_rng = random.getstate()
        self.np_rng = _numpy_state()

    def restore(self) -> None:
        with torch.no_grad():
            # In place, so that the optimizer's references to the parameters stay valid.
            for key, tensor in self.model.state_dict().items():
                tensor.copy_(self.tensors[key])
        for param in self.model.parameters():
            param.grad = None
        if self.optimizer is not None:
            self.optimizer.load_state_dict(copy.deepcopy(self.optim))
        torch.random.set_rng_state(self.cpu_rng)
        if self.cuda_rng is not None:
            torch.cuda.set_rng_state_all(self.cuda_rng)
        random.setstate(self.py_rng)
        if self.np_rng is not None:
            import numpy

            numpy.random.set_state(self.np_rng)


def _numpy_state() -> Any:
    try:
        import numpy
    except ImportError:  # numpy is a dependency, but the checker does not need it
        return None
    return numpy.random.get_state()


def _run(
    recorder: Recorder,
    batch_fn: Callable[[int], Any],
    loss_fn: Callable[[torch.nn.Module, Any], torch.Tensor],
    optimizer: torch.optim.Optimizer | None,
    steps: int,
) -> tuple[list[Event], tuple[float, ...]]:
    recorder.start_run()
    losses = []
    for step in range(steps):
        recorder.start_step(step)
        batch = batch_fn(step)
        try:
            loss = loss_fn(recorder.model, batch)
        except RuntimeError as exc:
            if "BackwardHookFunction" not in str(exc):
                raise
            # torch's module backward hooks wrap module outputs; in-place ops on them fail.
            raise RuntimeError(
                "the model modifies a module's output in place, which torch's module backward "
                "hooks forbid: call check_determinism(..., backward_hooks=False) (parameter "
                f"gradients are still compared) ({exc})"
            ) from exc
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1 or not loss.requires_grad:
            raise TypeError(
                "loss_fn must return a one-element tensor that requires grad (the loss to call "
                f".backward() on), got {type(loss).__name__}"
                + (f" of shape {tuple(loss.shape)}" if isinstance(loss, torch.Tensor) else "")
            )
        recorder.record(LOSS, "output", loss, "loss", None)
        recorder.phase = "backward"
        loss.backward()
        if optimizer is not None:
            recorder.phase = "optimizer"
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            recorder.record_parameters()
        else:
            recorder.model.zero_grad(set_to_none=True)
        losses.append(float(loss.detach().float().item()))
    return recorder.start_run(), tuple(losses)


def check_determinism(
    model: torch.nn.Module,
    batch_fn: Callable[[int], Any],
    loss_fn: Callable[[torch.nn.Module, Any], torch.Tensor],
    steps: int = 1,
    optimizer: torch.optim.Optimizer | None = None,
    *,
    plot: str | Path | None = None,
    backward_hooks: bool = True,
) -> DeterminismReport:
    """Run the same training step(s) twice from the same state and report what differs, bitwise.

    Each run starts from the state the call found: parameters and buffers, the optimizer's state
    (if one is given) and the random generators (torch CPU and CUDA, ``random``, NumPy), and the
    model is put back in that state at the end, so the call has no lasting effect. During each
    run hooks copy, in execution order: every module's inputs and outputs (forward), the gradient
    arriving at each module's outputs and the gradient its backward produced (backward), every
    parameter's gradient, and with an optimizer every parameter after ``optimizer.step()``. Tuples,
    lists and dicts are walked; other objects are compared by type (and by value for numbers,
    strings and None). A module called several times gets one record per call.

    The report names the **first** value (forward, then backward, then the optimizer step, step
    after step) whose bits differ between the runs, with max |Δ| and where the difference was
    introduced: a module's own code when what it produced differs but what it was handed did
    not; the calling module's own code (e.g. an attention function that is not a module) when
    what a module was handed differs first. It lists every difference in a table and can plot
    them.

    Args:
        model: the model; its hooks are removed at the end, even on error.
        batch_fn: ``batch_fn(step) -> batch``, called once per step and run: must give the same
            batch for the same step (e.g. from a generator seeded with ``step``).
        loss_fn: ``loss_fn(model, batch) -> loss``, a one-element tensor that requires grad.
        steps: training steps per run (each: forward, backward, optimizer step if given).
        optimizer: stepped after each backward and zeroed; without one, the gradients are
            cleared after each step and the parameters do not change.
        plot: write a figure of where the differences appear (``.png``, ``.pdf``, ``.svg``).
        backward_hooks: record the gradients arriving at and leaving each module (torch's full
            backward hooks). ``False`` for models that modify a module's output in place,
            which those hooks forbid: the backward is then seen through parameter gradients
            only, so a difference is located to the parameters it reaches first.

    Returns:
        A frozen ``DeterminismReport``: ``deterministic``, ``first``, ``differences`` (all, in
        execution order), ``losses``; ``str(report)`` is a readable summary with a table.

    Raises:
        TypeError: ``model`` is not a module, ``batch_fn``/``loss_fn`` not callable, ``loss_fn``
            returns something other than a one-element tensor that requires grad.
        ValueError: ``steps`` < 1, or ``plot`` names no figure format matplotlib writes.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    for name, fn in (("batch_fn", batch_fn), ("loss_fn", loss_fn)):
        if not callable(fn):
            raise TypeError(f"{name} must be callable, got {type(fn).__name__}")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be an int >= 1, got {steps!r}")
    if not isinstance(backward_hooks, bool):
        raise TypeError(f"backward_hooks must be a bool, got {type(backward_hooks).__name__}")
    if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(
            f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}"
        )
    # Checked before the two training runs, which the figure comes after.
    if plot is not None and not isinstance(plot, (str, Path)):
        raise TypeError(f"plot must be a path (str or pathlib.Path), got {type(plot).__name__}")
    if plot is not None and Path(plot).suffix.lower() not in PLOT_SUFFIXES:
        raise ValueError(
            f"plot must end in one of {', '.join(PLOT_SUFFIXES)} (the figure's format), got "
            f"{str(plot)!r}"
        )
    state = _State(model, optimizer)
    try:
        with warnings.catch_warnings(), Recorder(model, backward_hooks) as recorder:
            # Hooking every module makes torch warn about modules whose backward hooks cannot fire
            # (dict outputs) or fire early (no input requires grad): expected here, and the
            # report covers such modules through their neighbours and their parameters.
            for message in _EXPECTED_HOOK_WARNINGS:
                warnings.filterwarnings("ignore", message=message, category=UserWarning)
            state.restore()
            run_1, losses_1 = _run(recorder, batch_fn, loss_fn, optimizer, steps)
            state.restore()
            run_2, losses_2 = _run(recorder, batch_fn, loss_fn, optimizer, steps)
    finally:
        state.restore()
    differences = tuple(compare_runs(run_1, run_2))
    written = None
    if plot is not None:
        title = f"{type(model).__name__}: {len(differences)} of {len(run_1)} values differ"
        written = plot_differences(run_1, differences, Path(plot), title)
    return DeterminismReport(steps, len(run_1), differences, (losses_1, losses_2), written)
