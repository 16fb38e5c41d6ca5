"""Recording one run of a training step: every module's inputs and outputs in the forward, the
gradients each module receives and produces in the backward, every parameter's gradient, and the
parameters after the optimizer step, in execution order, through hooks.

What is recorded, per module call (``kind``):

* ``input``, ``output``: forward pre-hook / forward hook (positional and keyword arguments).
* ``grad_output``: full backward pre-hook, the gradient arriving at the module's outputs.
* ``grad_input``: full backward hook, the gradient the module's backward produced for its
  (positional tensor) inputs.
* ``grad``: a parameter's ``.grad`` once accumulated (``register_post_accumulate_grad_hook``).
* ``param``: a parameter after ``optimizer.step()``.

"Received" values (``input``, ``grad_output``) are what a module is handed; "produced" values
are what it computed. The comparison uses the difference to say *where* a difference was
introduced (see ``compare.suspect``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import torch

__all__ = ["ROOT", "Event", "EventKey", "Recorder", "flatten"]

# The name under which the model itself (named_modules' "") appears in reports.
ROOT = "<model>"
RECEIVED_KINDS = ("input", "grad_output")
# Containers nested deeper than this are recorded by type only: real module outputs are shallow,
# and the bound keeps a self-referencing structure from recursing without end.
MAX_DEPTH = 6
# Non-tensor leaves whose value (not only type) is compared: values with a stable repr. Other
# objects (caches, configs) print their address, which differs between runs by construction.
PLAIN_TYPES = (bool, int, float, complex, str, bytes, type(None), torch.dtype, torch.device)


@dataclasses.dataclass(frozen=True)
class EventKey:
    """Identifies one recorded value, the same in both runs when the control flow is the same.

    Attributes:
        step: training step (0-based).
        phase: ``"forward"``, ``"backward"`` or ``"optimizer"``.
        name: module or parameter name (``ROOT`` for the model, ``"<loss>"`` for the loss).
        kind: one of ``input``, ``output``, ``grad_output``, ``grad_input``, ``grad``, ``param``.
        call: how many times this (name, kind) was recorded before in this step: a module called
            several times (shared layers, a loop) has one event per call.
        path: where the value sits in the hook's argument: ``[0]``, ``['logits']``, ``kw:mask``.
    """

    step: int
    phase: str
    name: str
    kind: str
    call: int
    path: str


@dataclasses.dataclass
class Event:
    """A recorded value: a tensor copy, or for other objects their type and (plain types) value."""

    key: EventKey
    value: torch.Tensor | str
    module_type: str
    caller: str | None  # the module whose forward called this one (None: code outside the model)


def flatten(obj: Any, path: str = "", depth: int = 0) -> Iterator[tuple[str, Any]]:
    """Yield ``(path, leaf)`` for every leaf of nested tuples, lists and mappings."""
    if isinstance(obj, torch.Tensor) or depth >= MAX_DEPTH:
        yield path, obj
    elif isinstance(obj, Mapping):
        for key, item in obj.items():
            yield from flatten(item, f"{path}[{key!r}]", depth + 1)
    elif isinstance(obj, (tuple, list)):
        for index, item in enumerate(obj):
            yield from flatten(item, f"{path}[{index}]", depth + 1)
    else:
        yield path, obj


def _snapshot(leaf: Any) -> torch.Tensor | str:
    if isinstance(leaf, torch.Tensor):
        # A copy, not a reference: the model may overwrite the tensor later in the step.
        return leaf.detach().clone()
    if isinstance(leaf, PLAIN_TYPES):
        return f"{type(leaf).__name__}: {leaf!r}"
    return f"{type(leaf).__module__}.{type(leaf).__qualname__}"


class Recorder:
    """Hooks on every module and parameter of ``model``; ``events`` in execution order.

    Use as a context manager (the hooks are removed on exit), set ``step`` and ``phase`` as the
    step advances, and ``start_run()`` before each run.
    """

    def __init__(self, model: torch.nn.Module, backward_hooks: bool = True) -> None:
        self.model = model
        self.backward_hooks = backward_hooks
        self.events: list[Event] = []
        self.step = 0
        self.phase = "forward"
        self._calls: dict[tuple[str, str], int] = {}
        self._stack: list[str] = []  # modules whose forward is running, outermost first
        self._callers: dict[str, str | None] = {}
        self._handles: list[Any] = []
        self._names = {id(m): (name or ROOT) for name, m in model.named_modules()}

    # -- lifecycle ---------------------------------------------------------------------------
    def __enter__(self) -> Recorder:
        for module in self.model.modules():
            self._handles += [
                module.register_forward_pre_hook(self._forward_pre, with_kwargs=True),
                module.register_forward_hook(self._forward_post, with_kwargs=True),
            ]
            if self.backward_hooks:
                self._handles += [
                    module.register_full_backward_pre_hook(self._backward_pre),
                    module.register_full_backward_hook(self._backward_post),
                ]
        for name, param in self.model.named_parameters():
            if param.requires_grad:
                self._handles.append(param.register_post_accumulate_grad_hook(self._grad(name)))
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def start_run(self) -> list[Event]:
        """Begin a new run; return the events of the previous one."""
        events, self.events = self.events, []
        self._stack.clear()
        return events

    def start_step(self, step: int) -> None:
        self.step, self.phase = step, "forward"
        self._calls.clear()

    # -- recording ---------------------------------------------------------------------------
    def record(
        self,
        name: str,
        kind: str,
        value: Any,
        module_type: str = "",
        caller: str | None = None,
        leaves: Iterable[tuple[str, Any]] | None = None,
    ) -> None:
        """Record every leaf of ``value`` (or the given ``(path, leaf)`` pairs) as one event each,
        under this step's next call index of ``(name, kind)``."""
        counter = (name, kind)
        call = self._calls.get(counter, 0)
        self._calls[counter] = call + 1
        for path, leaf in flatten(value) if leaves is None else leaves:
            key = EventKey(self.step, self.phase, name, kind, call, path)
            self.events.append(Event(key, _snapshot(leaf), module_type, caller))

    def record_parameters(self) -> None:
        """Every parameter as it is now (after the optimizer step)."""
        for name, param in self.model.named_parameters():
            self.record(name, "param", param, "Parameter", None)

    def _module_name(self, module: torch.nn.Module) -> str:
        return self._names.get(id(module), type(module).__name__)

    def _forward_pre(self, module: torch.nn.Module, args: Any, kwargs: Any) -> None:
        name = self._module_name(module)
        caller = self._stack[-1] if self._stack else None
        self._callers[name] = caller
        leaves = [
            *(leaf for i, a in enumerate(args) for leaf in flatten(a, f"[{i}]")),
            *(leaf for k, v in kwargs.items() for leaf in flatten(v, f"kw:{k}")),
        ]
        self.record(name, "input", None, type(module).__name__, caller, leaves)
        self._stack.append(name)

    def _forward_post(self, module: torch.nn.Module, args: Any, kwargs: Any, output: Any) -> None:
        name = self._module_name(module)
        # Pop this module's entry (the stack top, unless a hook of a child raised earlier).
        if self._stack and self._stack[-1] == name:
            self._stack.pop()
        self.record(name, "output", output, type(module).__name__, self._callers.get(name))

    def _backward_pre(self, module: torch.nn.Module, grad_output: Any) -> None:
        name = self._module_name(module)
        self.record(
            name, "grad_output", grad_output, type(module).__name__, self._callers.get(name)
        )

    def _backward_post(self, module: torch.nn.Module, grad_input: Any, grad_output: Any) -> None:
        name = self._module_name(module)
        self.record(name, "grad_input", grad_input, type(module).__name__, self._callers.get(name))

    def _grad(self, name: str) -> Any:
        owner = name.rpartition(".")[0] or ROOT

        def hook(param: torch.Tensor) -> None:
            self.record(name, "grad", param.grad, "Parameter", owner)

        return hook
