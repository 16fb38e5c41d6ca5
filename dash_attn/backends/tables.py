"""Tables on the device: uploaded once per key and device, shared by the backends (the
backward's schedule tables, the persistent causal forward's tile lists)."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping

import numpy as np
import torch

from ..schedule import TABLE_FIELDS, Schedule

_MAX_CACHED = 64
_cache: dict[tuple[Hashable, torch.device], dict[str, torch.Tensor]] = {}


def upload_once(
    key: Hashable, device: torch.device, make: Callable[[], Mapping[str, np.ndarray]]
) -> dict[str, torch.Tensor]:
    """``make()``'s arrays on ``device``, made and copied on the first call with ``key``; later
    calls return the same tensors (the oldest of more than 64 keys is dropped)."""
    tensors = _cache.get((key, device))
    if tensors is None:
        tensors = {name: torch.from_numpy(a.copy()).to(device) for name, a in make().items()}
        if len(_cache) >= _MAX_CACHED:
            _cache.pop(next(iter(_cache)))
        _cache[key, device] = tensors
    return tensors


def device_tables(schedule: Schedule, device: torch.device) -> dict[str, torch.Tensor]:
    """The schedule's int32 tables on ``device`` (names: ``schedule.TABLE_FIELDS``).

    Keyed by the schedule object itself (``Schedule`` compares and hashes by identity; the key
    keeps it alive, so its id is not reused): ``make_schedule`` returns one object per (name,
    spec), so a training loop uploads once. A key of (name, spec) would hand another schedule
    with the same name and spec (a placement study, a custom order) the first one's tables:
    until session 45 three placement A/B probes timed the shipped tables twice that way."""
    return upload_once(
        ("schedule", schedule),
        device,
        lambda: {name: getattr(schedule, name) for name in TABLE_FIELDS},
    )
