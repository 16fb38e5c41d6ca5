"""Tables on the device: uploaded once per key and device, shared by the backends (the
backward's schedule tables, the persistent causal forward's tile lists)."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping

import numpy as np
import torch

from ..schedule import TABLE_FIELDS, Schedule

_MAX_CACHED = 64
# Per (key, device): the tensors, and the object the key names (kept alive with its entry, so
# an id in a key cannot be reused while the entry exists).
_cache: dict[tuple[Hashable, torch.device], tuple[dict[str, torch.Tensor], object]] = {}
# Entries a CUDA graph was captured with: a replay reads their tensors by address, so they are
# never dropped (a dropped table's memory could hold something else by the next replay).
_pinned: set[tuple[Hashable, torch.device]] = set()


def _capturing(device: torch.device) -> bool:
    """Whether a CUDA graph is being captured on ``device``'s current stream."""
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


def upload_once(
    key: Hashable,
    device: torch.device,
    make: Callable[[], Mapping[str, np.ndarray]],
    owner: object = None,
) -> dict[str, torch.Tensor]:
    """``make()``'s arrays on ``device``, made and copied on the first call with ``key``; later
    calls return the same tensors (beyond 64 keys the oldest is dropped, except those asked for
    during a CUDA graph capture, which stay for the process). ``owner`` is kept alive with the
    entry (for keys that hold an ``id``)."""
    entry = _cache.get((key, device))
    if entry is None:
        tensors = {name: torch.from_numpy(a.copy()).to(device) for name, a in make().items()}
        if len(_cache) >= _MAX_CACHED:
            oldest = next((k for k in _cache if k not in _pinned), None)
            if oldest is not None:
                _cache.pop(oldest)
        entry = _cache[key, device] = (tensors, owner)
    if _capturing(device):
        _pinned.add((key, device))
    return entry[0]


def device_tables(schedule: Schedule, device: torch.device) -> dict[str, torch.Tensor]:
    """The schedule's int32 tables on ``device`` (names: ``schedule.TABLE_FIELDS``).

    Keyed by the schedule object's identity (the entry keeps the object alive, so its id is not
    reused while cached): ``make_schedule`` returns one object per (name, spec), so a training
    loop uploads once. A key of (name, spec) would hand another schedule with the same name and
    spec (a placement study, a custom order) the first one's tables: until session 45 three
    placement A/B probes timed the shipped tables twice that way."""
    return upload_once(
        ("schedule", id(schedule)),
        device,
        lambda: {name: getattr(schedule, name) for name in TABLE_FIELDS},
        owner=schedule,
    )


def dq_counts(schedule: Schedule, device: torch.device) -> torch.Tensor:
    """The schedule's ``dq_tile_counts`` (int32, one per dQ tile) on ``device``, uploaded once
    per schedule object as ``device_tables``."""
    return upload_once(
        ("dq_counts", id(schedule)),
        device,
        lambda: {"dq_counts": schedule.dq_tile_counts()},
        owner=schedule,
    )["dq_counts"]
