"""Schedule tables on the device: uploaded once per (schedule, device), shared by the backends."""

from __future__ import annotations

import torch

from ..schedule import TABLE_FIELDS, Schedule

_MAX_CACHED = 64
_cache: dict[tuple[str, object, torch.device], dict[str, torch.Tensor]] = {}


def device_tables(schedule: Schedule, device: torch.device) -> dict[str, torch.Tensor]:
    """The schedule's int32 tables on ``device`` (names: ``schedule.TABLE_FIELDS``)."""
    key = (schedule.name, schedule.spec, device)
    tables = _cache.get(key)
    if tables is None:
        tables = {
            name: torch.from_numpy(getattr(schedule, name).copy()).to(device)
            for name in TABLE_FIELDS
        }
        if len(_cache) >= _MAX_CACHED:
            _cache.pop(next(iter(_cache)))
        _cache[key] = tables
    return tables
