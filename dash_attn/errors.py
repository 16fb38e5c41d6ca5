"""Errors that surface after a launch: a dQ wait that timed out inside the kernel.

Backward launches do not synchronise with the host. Each deterministic launch leaves an error
flag on the device; a pinned copy of it is queued here and looked at by the next backward (or by
:func:`check_errors`), so a deadlock becomes a RuntimeError instead of a frozen GPU and the price
is no host sync per call.
"""

from __future__ import annotations

import threading

import torch

__all__ = ["check_errors", "record_status"]

_lock = threading.Lock()
# launch number -> (pinned host copy of the error flag, event after the copy, error message)
_pending: dict[int, tuple[torch.Tensor, torch.cuda.Event, str]] = {}
_launches = 0


def check_errors(synchronize: bool = True) -> None:
    """Raise RuntimeError if an earlier backward gave up waiting for its dQ order.

    ``synchronize=True`` waits for every launch so far, so the answer is final; ``False`` only
    looks at launches that have finished.
    """
    with _lock:
        pending = list(_pending.items())
    failure = None
    for launch, (flag, event, description) in pending:
        if synchronize:
            event.synchronize()
        elif not event.query():
            continue
        with _lock:
            _pending.pop(launch, None)
        if failure is None and int(flag.item()) != 0:
            failure = description
    if failure is not None:
        raise RuntimeError(failure)


def record_status(error_flag: torch.Tensor, description: str, synchronize: bool) -> None:
    """Queue the int32 ``error_flag`` (0-d) of a launch; raise at once if ``synchronize`` (or on
    the CPU, where the launch already ran) and it is set. ``description`` is the error text."""
    global _launches
    if error_flag.device.type != "cuda":
        if int(error_flag.item()) != 0:
            raise RuntimeError(description)
        return
    if torch.cuda.is_current_stream_capturing():
        # A graph capture may not copy to the host; the replay's flag is the caller's to read.
        return
    host = torch.empty((), dtype=torch.int32, pin_memory=True)
    host.copy_(error_flag, non_blocking=True)
    event = torch.cuda.Event()
    event.record()
    with _lock:
        _launches += 1
        _pending[_launches] = (host, event, description)
    check_errors(synchronize=synchronize)
