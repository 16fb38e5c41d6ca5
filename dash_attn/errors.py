"""Errors that surface after a launch: an ordered wait (dQ, or in-kernel dK/dV) that timed out
inside the kernel.

Backward launches do not synchronise with the host. Each deterministic launch leaves an error
flag on the device; an asynchronous copy of it into a slot of a pinned host buffer is queued here
and looked at by the next backward (or by :func:`check_errors`), so a deadlock becomes a
RuntimeError instead of a frozen GPU and the price is no host sync per call.

The pinned slots and the events are reused (allocating a pinned tensor and an event per launch
cost ~50 us of host time, as much as a small backward's kernels take on the GPU).

The hopper backward needs neither the copy nor the event (``mapped_launch``): its last kernel
writes the launch's number into a host-mapped word of its device when the launch's flag is set,
and the checks read those words. Per launch that is a dictionary entry instead of a copy and an
event record (~15-40 us of host time on the H200 machine). A Triton backward captured in a CUDA
graph reports the same way (``backends.triton.captured_status``), since no host code runs at a
replay: there the error surfaces at the first check after the replay that timed out.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np
import torch

__all__ = ["check_errors", "mapped_launch", "record_status"]

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

# Host-mapped error words, one per device index (pinned host memory the GPU writes directly):
# 0, or the number of a launch whose dQ wait timed out. Made on first use; None if the CUDA
# runtime could not map host memory (launches then take the copy path).
_MAX_DEVICES = 64
_MAPPED_KEEP = 4096  # launches whose error text is kept (older ones get a generic text)
_mapped_words: np.ndarray | None = None
_mapped_base: int | None = None  # device address of word 0
_mapped_unavailable = False
_mapped_texts: dict[int, Description] = {}  # launch number -> error text, oldest first
# Texts of launches captured in CUDA graphs: a replay reuses its launch's number, so these are
# kept as long as the process (one per captured backward) and not taken when reported.
_captured_texts: dict[int, Description] = {}
_mapped_devices: set[int] = set()  # devices that ran mapped launches (synchronize waits for them)
_mapped_count = 0


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
        mapped_devices = list(_mapped_devices) if synchronize else []
    if (pending or mapped_devices) and _capturing():
        if synchronize:
            raise RuntimeError(
                "dash-attn: check_errors(synchronize=True) cannot run while a CUDA graph is "
                "being captured (it would synchronise the device); call it after a replay"
            )
        # Querying an event is not allowed during a capture either: the queued launches are
        # looked at by the first check after it. The mapped words are plain host memory.
        pending = []
    for device in mapped_devices:
        torch.cuda.synchronize(device)
    if failure is None:
        failure = _mapped_failure()
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


def _capturing() -> bool:
    """Whether the current CUDA stream is capturing a graph (False where torch has no CUDA)."""
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def _mapped_failure() -> Description | None:
    """The error text of a launch whose mapped word is set (the word is cleared), or None."""
    words = _mapped_words
    if words is None or not words.any():
        return None
    with _lock:
        set_words = np.flatnonzero(words)
        if not set_words.size:  # another thread took it
            return None
        device = int(set_words[0])
        launch = int(words[device])
        words[device] = 0
        text = _mapped_texts.pop(launch, None) or _captured_texts.get(launch)
    if text is None:
        return (
            f"dash-attn backward: an ordered wait (dQ, or dK/dV) timed out (launch {launch} on "
            f"cuda:{device}, older than the last {_MAPPED_KEEP} backward launches); its gradients "
            "were poisoned with NaN. Likely causes: SMs held by a concurrent kernel (raise "
            "sm_margin) or a broken schedule."
        )
    return text


def _map_words() -> None:
    """Allocate the host-mapped words (caller holds _lock); on failure, mark them unavailable."""
    global _mapped_words, _mapped_base, _mapped_unavailable
    try:
        import ctypes

        from cuda.bindings import runtime

        flags = runtime.cudaHostAllocMapped | runtime.cudaHostAllocPortable
        err, host = runtime.cudaHostAlloc(4 * _MAX_DEVICES, flags)
        if err != runtime.cudaError_t.cudaSuccess:
            raise RuntimeError(f"cudaHostAlloc: {err}")
        err, device = runtime.cudaHostGetDevicePointer(host, 0)
        if err != runtime.cudaError_t.cudaSuccess:
            raise RuntimeError(f"cudaHostGetDevicePointer: {err}")
        # The allocation lives as long as the process (256 bytes).
        words = np.ctypeslib.as_array((ctypes.c_int32 * _MAX_DEVICES).from_address(int(host)))
        words[:] = 0
        _mapped_words, _mapped_base = words, int(device)
    except Exception:  # no cuda-python, no mapping: the launches take the copy path
        _mapped_unavailable = True


def mapped_launch(
    description: Description, device: int | None, captured: bool = False
) -> tuple[int, int]:
    """``(address, launch)`` for a launch on CUDA device ``device`` that reports through a
    host-mapped word: the kernel writes ``launch`` (> 0) to ``address`` if its dQ wait timed
    out, and the next check raises ``description``. ``(0, 0)`` where host memory cannot be
    mapped: the caller then queues its flag with ``record_status``. ``captured``: the launch is
    being captured in a CUDA graph, whose replays report under the same number (its text is
    kept for the life of the process)."""
    global _mapped_count
    if _mapped_unavailable or device is None or not 0 <= device < _MAX_DEVICES:
        return 0, 0
    with _lock:
        if _mapped_base is None:
            _map_words()
            if _mapped_base is None:
                return 0, 0
        _mapped_count = _mapped_count % 0x7FFFFFFF + 1
        launch = _mapped_count
        if captured:
            _captured_texts[launch] = description
        else:
            texts = _mapped_texts
            texts[launch] = description
            if len(texts) > _MAPPED_KEEP:
                del texts[next(iter(texts))]
        _mapped_devices.add(device)
        return _mapped_base + 4 * device, launch


def mapped_word_address(device: int) -> int:
    """Device address of ``device``'s host-mapped error word, or 0 where none can be mapped."""
    with _lock:
        if _mapped_base is None and not _mapped_unavailable:
            _map_words()
        return 0 if _mapped_base is None else _mapped_base + 4 * device


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
        # The copy and the event would run at capture only, never at replay: a captured launch
        # reports through a mapped word (backends.triton.captured_status).
        raise RuntimeError(
            "dash-attn: record_status cannot queue an error flag inside a CUDA graph capture "
            "(a replay would never copy it); report it with "
            "backends.triton.captured_status.report_captured_status"
        )
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
