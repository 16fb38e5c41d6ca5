"""Errors that surface after a launch: a dQ wait that timed out inside the kernel.

Backward launches do not synchronise with the host. Each deterministic launch leaves an error
flag on the device; an asynchronous copy of it into a slot of a pinned host buffer is queued here
and looked at by the next backward (or by :func:`check_errors`), so a deadlock becomes a
RuntimeError instead of a frozen GPU and the price is no host sync per call.

The pinned slots and the events are reused (allocating a pinned tensor and an event per launch
cost ~50 us of host time, as much as a small backward's kernels take on the GPU).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np
import torch

__all__ = ["check_errors", "record_status"]

# An error text, or a function that makes it, called only if the launch failed (formatting a
# plan's description takes ~7 us of host time, paid by every launch otherwise).
Description = str | Callable[[], str]

_SLOTS = 256  # launches whose flag may be in flight at once; more wait for the oldest

_lock = threading.Lock()
# launch number -> (slot in the pinned buffer, event after the copy, its device index, error
# message), oldest first
_pending: dict[int, tuple[int, torch.cuda.Event, int, Description]] = {}
_launches = 0
_host: torch.Tensor | None = None  # pinned int32 [_SLOTS]
_host_view: np.ndarray | None = None  # the same memory, read without a torch call
_free_slots: list[int] = []
_free_events: dict[int, list[torch.cuda.Event]] = {}  # per device index
_failed: list[Description] = []  # set flags read while making room for a new launch, oldest first


def check_errors(synchronize: bool = True) -> None:
    """Raise RuntimeError if an earlier backward gave up waiting for its dQ order.

    ``synchronize=True`` waits for every launch so far, so the answer is final; ``False`` only
    looks at launches that have finished, oldest first, and stops at the first one that has not
    (launches on one stream finish in order; a later one that finished early on another stream
    is looked at next time). Without that stop, every backward queried every unfinished launch:
    with the host far ahead of the GPU (hundreds of queued launches) that cost more host time
    per call than the kernels took.
    """
    with _lock:
        pending = list(_pending.items())
        failure = _failed.pop(0) if _failed else None
    for launch, (slot, event, device, description) in pending:
        if synchronize:
            event.synchronize()
        elif not event.query():
            break
        with _lock:
            if _pending.pop(launch, None) is None:
                continue  # another thread took it
            flag = _release(slot, event, device)
        if failure is None and flag != 0:
            failure = description
    if failure is not None:
        raise RuntimeError(_text(failure))


def _text(description: Description) -> str:
    return description if isinstance(description, str) else description()


def _release(slot: int, event: torch.cuda.Event, device: int) -> int:
    """The flag in ``slot``, after which the slot and the event are free (caller holds _lock)."""
    flag = int(_host_view[slot])
    _free_slots.append(slot)
    _free_events.setdefault(device, []).append(event)
    return flag


def _take_slot() -> int:
    """A free pinned slot (caller holds _lock). With every slot in flight, waits for the oldest
    launch and reads its flag: a set one is kept for the next check, so that neither it nor the
    launch being recorded goes unchecked."""
    global _host, _host_view
    if _host is None:
        _host = torch.zeros(_SLOTS, dtype=torch.int32, pin_memory=True)
        _host_view = _host.numpy()
        _free_slots.extend(range(_SLOTS - 1, -1, -1))
    while not _free_slots:
        launch, (slot, event, device, description) = next(iter(_pending.items()))
        event.synchronize()
        del _pending[launch]
        if _release(slot, event, device) != 0:
            _failed.append(description)
    return _free_slots.pop()


def record_status(error_flag: torch.Tensor, description: Description, synchronize: bool) -> None:
    """Queue the int32 ``error_flag`` (0-d) of a launch; raise at once if ``synchronize`` (or on
    the CPU, where the launch already ran) and it is set. ``description`` is the error text, or
    a function that returns it (called only when the flag is set)."""
    global _launches
    if error_flag.device.type != "cuda":
        if int(error_flag.item()) != 0:
            raise RuntimeError(_text(description))
        return
    if torch.cuda.is_current_stream_capturing():
        # A graph capture may not copy to the host; the replay's flag is the caller's to read.
        return
    stream = torch.cuda.current_stream(error_flag.device)
    device = stream.device_index
    with _lock:
        slot = _take_slot()
        events = _free_events.get(device)
        event = events.pop() if events else torch.cuda.Event()
        _host[slot].copy_(error_flag, non_blocking=True)
        event.record(stream)
        _launches += 1
        _pending[_launches] = (slot, event, device, description)
    # Without synchronize, the flags of finished launches are read by the next check (each
    # backward starts with one): this launch's cannot have landed yet.
    if synchronize:
        check_errors(synchronize=True)
