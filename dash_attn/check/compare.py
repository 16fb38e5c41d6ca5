"""Bitwise comparison of two recorded runs, and the report.

Two tensors are equal when they have the same dtype and shape and the same bytes: NaNs with the
same payload are equal, +0.0 and -0.0 are not. That is the property "bitwise reproducible"
promises, and stricter than ``torch.equal``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from pathlib import Path

import torch

from ..testing import max_abs_diff
from .record import RECEIVED_KINDS, ROOT, Event, EventKey

__all__ = ["DeterminismReport", "Difference", "compare_runs", "suspect"]

LOSS = "<loss>"
# What each kind of event is, for the report.
KIND_TEXT = {
    "input": "input (what the module was handed)",
    "output": "output",
    "grad_output": "gradient arriving at the module's output",
    "grad_input": "gradient the module's backward produced for its inputs",
    "grad": "parameter gradient",
    "param": "parameter after the optimizer step",
}
TABLE_ROWS = 25  # rows of the table in str(report); the full list is report.differences


@dataclasses.dataclass(frozen=True)
class Difference:
    """One recorded value that differs between the two runs.

    Attributes:
        index: position of the event in run 1's execution order (forward, then backward, then
            the optimizer step, step after step).
        step, phase, name, kind, call, path: the event (see ``record.EventKey``).
        module_type: class name of the module (``"Parameter"`` for parameters).
        max_abs_diff: max |run 1 - run 2| in float64; ``inf`` when the two cannot be subtracted
            (shape, dtype or type differs, an event only one run has, NaN against a number).
        mismatched: elements whose bits differ (0 for non-tensor values).
        numel: elements of the value (0 for non-tensor values).
        detail: what differs when it is not the values (shape, dtype, missing in one run).
        suspect: where the difference was introduced (see ``suspect``).
    """

    index: int
    step: int
    phase: str
    name: str
    kind: str
    call: int
    path: str
    module_type: str
    max_abs_diff: float
    mismatched: int
    numel: int
    detail: str
    suspect: str

    @property
    def where(self) -> str:
        """One line: step, phase, name, call and value path."""
        call = f" (call {self.call + 1})" if self.call else ""
        return f"step {self.step}, {self.phase}, {self.name}{call}: {self.kind}{self.path}"


@dataclasses.dataclass(frozen=True)
class DeterminismReport:
    """What ``check_determinism`` found. ``str(report)`` is the readable summary and table.

    Attributes:
        steps: training steps per run.
        compared: values compared (tensors and other leaves of hook arguments).
        differences: every differing value, in run 1's execution order.
        losses: the loss of each step, per run (two tuples).
        plot: the figure written, if one was asked for.
    """

    steps: int
    compared: int
    differences: tuple[Difference, ...]
    losses: tuple[tuple[float, ...], tuple[float, ...]]
    plot: Path | None = None

    @property
    def deterministic(self) -> bool:
        return not self.differences

    @property
    def first(self) -> Difference | None:
        """The first differing value in execution order (forward, then backward)."""
        return self.differences[0] if self.differences else None

    def modules(self) -> tuple[str, ...]:
        """Names of the modules and parameters with a difference, in order of first appearance."""
        return tuple(dict.fromkeys(d.name for d in self.differences))

    def __str__(self) -> str:
        runs = f"two runs of {self.steps} training step{'s' if self.steps != 1 else ''}"
        if self.deterministic:
            return (
                f"deterministic: {runs} from the same state, all {self.compared} recorded values "
                "(module inputs and outputs, gradients, parameters) bitwise equal"
            )
        first = self.differences[0]
        lines = [
            f"NOT deterministic: {runs} from the same state, {len(self.differences)} of "
            f"{self.compared} recorded values differ",
            f"first difference: {first.where}",
            f"  {KIND_TEXT.get(first.kind, first.kind)}, {_delta(first)}",
            f"  introduced by: {first.suspect}",
            "",
            _table(self.differences[:TABLE_ROWS]),
        ]
        if len(self.differences) > TABLE_ROWS:
            lines.append(f"... {len(self.differences) - TABLE_ROWS} more (report.differences)")
        losses = [
            f"  step {i}: {a!r} vs {b!r}"
            for i, (a, b) in enumerate(zip(*self.losses, strict=True))
            if a != b
        ]
        if losses:
            lines += ["losses that differ:", *losses]
        if self.plot is not None:
            lines.append(f"plot: {self.plot}")
        return "\n".join(lines)


def _delta(d: Difference) -> str:
    if d.detail:
        return d.detail
    return f"max |Δ| {d.max_abs_diff:.3g} ({d.mismatched} of {d.numel} elements differ)"


def _table(diffs: Sequence[Difference]) -> str:
    header = ("#", "step", "phase", "module / parameter", "type", "what", "max |Δ|", "differ")
    rows = [header]
    for d in diffs:
        what = d.kind + d.path + (f" (call {d.call + 1})" if d.call else "")
        delta = d.detail if d.detail else f"{d.max_abs_diff:.3g}"
        share = f"{d.mismatched}/{d.numel}" if d.numel else "-"
        rows.append((str(d.index), str(d.step), d.phase, d.name, d.module_type, what, delta, share))
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows
    )


def suspect(event: Event) -> str:
    """Where the difference first seen at ``event`` was introduced, assuming every earlier event
    was equal in both runs.

    A value a module *produced* (output, the gradient its backward produced, a parameter's
    gradient) that differs while everything it was handed was equal points at that module's own
    code. A value a module was *handed* (its input, the gradient arriving at its output) that
    differs while everything earlier was equal points at code between modules: the forward of
    the module that called it (a functional op there, such as an attention function that is not
    a module), or code outside the model (``batch_fn``, ``loss_fn``).
    """
    key = event.key
    if key.name == LOSS:
        return "loss_fn (the loss differs while every module output was equal)"
    if key.kind == "param":
        return "the optimizer step (every gradient was equal)"
    if key.kind == "grad":
        owner = event.caller or ROOT
        return (
            f"{owner}: its backward (the gradient of its parameter {key.name.rpartition('.')[2]})"
        )
    if key.kind in RECEIVED_KINDS:
        if event.caller is None:
            where = "batch_fn" if key.kind == "input" else "loss_fn (the loss's backward)"
            return f"code outside the model ({where})"
        direction = "forward" if key.kind == "input" else "backward"
        return (
            f"{event.caller}: its own {direction} code between submodules (a function that is "
            "not a module, e.g. an attention call)"
        )
    direction = "forward" if key.kind == "output" else "backward"
    return f"{key.name} ({event.module_type}): its own {direction}"


def _compare_values(a: torch.Tensor | str, b: torch.Tensor | str) -> tuple[float, int, int, str]:
    """``(max |Δ|, mismatched elements, numel, detail)``; ``detail`` empty when comparable."""
    if isinstance(a, str) or isinstance(b, str):
        if a == b if isinstance(a, str) and isinstance(b, str) else False:
            return 0.0, 0, 0, ""
        shown = [x if isinstance(x, str) else f"tensor {tuple(x.shape)}" for x in (a, b)]
        return math.inf, 0, 0, f"{shown[0]} vs {shown[1]}"
    if a.dtype != b.dtype or a.shape != b.shape:
        return (
            math.inf,
            0,
            a.numel(),
            f"{a.dtype} {tuple(a.shape)} vs {b.dtype} {tuple(b.shape)}",
        )
    if a.device != b.device:
        b = b.to(a.device)
    numel = a.numel()
    if numel == 0:
        return 0.0, 0, 0, ""
    # Compare bytes: the bits themselves, for every dtype (view needs a contiguous copy).
    bytes_a = a.contiguous().reshape(-1).view(torch.uint8).reshape(numel, -1)
    bytes_b = b.contiguous().reshape(-1).view(torch.uint8).reshape(numel, -1)
    mismatched = int((bytes_a != bytes_b).any(dim=1).sum().item())
    if mismatched == 0:
        return 0.0, 0, numel, ""
    delta = max_abs_diff(a.abs() if a.is_complex() else a, b.abs() if b.is_complex() else b)
    return delta, mismatched, numel, ""


def compare_runs(run_a: Sequence[Event], run_b: Sequence[Event]) -> list[Difference]:
    """Every event whose value differs, matched by key; events only one run has count too."""
    by_key: dict[EventKey, Event] = {e.key: e for e in run_b}
    seen: set[EventKey] = set()
    diffs: list[Difference] = []

    def add(index: int, event: Event, delta: float, mism: int, numel: int, detail: str) -> None:
        k = event.key
        diffs.append(
            Difference(
                index, k.step, k.phase, k.name, k.kind, k.call, k.path, event.module_type,
                delta, mism, numel, detail, suspect(event),
            )
        )  # fmt: skip

    for index, event in enumerate(run_a):
        other = by_key.get(event.key)
        if other is None:
            add(index, event, math.inf, 0, 0, "recorded in run 1 only (the control flow differs)")
            continue
        seen.add(event.key)
        delta, mismatched, numel, detail = _compare_values(event.value, other.value)
        if mismatched or detail:
            add(index, event, delta, mismatched, numel, detail)
    for index, event in enumerate(run_b):
        if event.key not in seen:
            add(
                len(run_a) + index, event, math.inf, 0, 0,
                "recorded in run 2 only (the control flow differs)",
            )  # fmt: skip
    return diffs
