"""The error flag of a deterministic backward captured in a CUDA graph.

An eager backward queues a copy of its flag and an event (``errors.record_status``) that a later
check reads. Inside a graph that host code runs once, at capture, and never at replay, so the
flags of replays would go unread. A captured launch therefore ends with a one-thread kernel that
writes the launch's number into the host-mapped error word of its device when the flag is set
(``errors.mapped_launch``: the hopper backward's cast does the same at every launch); each replay
re-runs it, and ``check_errors`` (or the next eager backward) raises the launch's error text.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...errors import Description, mapped_launch, mapped_word_address


# Not specialised on the values (one compiled kernel for every launch number and device); the
# address is always 64-bit, the launch number 32-bit.
@triton.jit(do_not_specialize=["word_address", "launch"])
def _report_timeout_kernel(STATUS, word_address, launch):
    # STATUS: int32 [ticket counter, error flag]. The word is host memory mapped into the GPU's
    # address space; the store is visible to the host once the kernel has finished.
    if tl.load(STATUS + 1) != 0:
        tl.store(word_address.to(tl.pointer_type(tl.int32)), launch)


# Devices whose reporting kernel is loaded. A Triton kernel compiles and loads at its first
# launch, which inside a capture could fail: it is launched once by the first eager
# deterministic backward on each device (the warm-up that torch asks before a capture).
_loaded: set[int] = set()


def load_reporting_kernel(device: torch.device) -> None:
    """Compile and load the reporting kernel on ``device`` (once; a no-op after)."""
    if device.index in _loaded:
        return
    address = mapped_word_address(device.index)
    if address:  # with none, a capture raises before launching it
        clean = torch.zeros(2, dtype=torch.int32, device=device)
        _report_timeout_kernel[(1,)](clean, address, 2)  # flag 0: stores nothing
    _loaded.add(device.index)


def report_captured_status(status: torch.Tensor, description: Description) -> None:
    """Queue, on the current (capturing) stream, the report of ``status``'s error flag
    (int32 ``[2]``: ticket counter, flag) into the host-mapped word of its device."""
    address, launch = mapped_launch(description, status.device.index, captured=True)
    if launch == 0:
        raise RuntimeError(
            "dash-attn: a deterministic backward captured in a CUDA graph reports a timed-out "
            "wait through host-mapped memory, which this process could not map (cuda-python's "
            "cudaHostAlloc with cudaHostAllocMapped failed or is not installed); run this "
            "backward outside the graph, or with deterministic=False"
        )
    _report_timeout_kernel[(1,)](status, address, launch)
