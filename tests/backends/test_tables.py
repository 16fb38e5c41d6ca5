"""The device-table cache (``backends.tables``): one upload per schedule object, never another
schedule's tables (CPU tensors stand in for the GPU)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from dash_attn.backends.tables import device_tables  # noqa: E402
from dash_attn.schedule import CAUSAL, ScheduleSpec, make_schedule  # noqa: E402
from dash_attn.schedule.generators import legacy_symmetric_shift  # noqa: E402
from dash_attn.schedule.invariant import invariant_schedule  # noqa: E402


def test_same_name_and_spec_with_other_tables_gets_its_own_upload() -> None:
    """Two schedules of one name and spec but other tables (here the lanes of the canonical
    layout, a study's argument) each get their own tensors: keyed by (name, spec), the second
    was handed the first one's tables, so probes timed the same order twice."""
    spec = ScheduleSpec(batch=2, q_heads=2, kv_heads=2, q_tiles=24, kv_tiles=24, mask=CAUSAL,
                        workers=40)  # fmt: skip
    shipped = make_schedule("symmetric_shift", spec)
    wider = invariant_schedule("symmetric_shift", spec, legacy_symmetric_shift, 4)
    assert (shipped.name, shipped.spec) == (wider.name, wider.spec)
    assert not np.array_equal(shipped.step_q_tile, wider.step_q_tile)
    cpu = torch.device("cpu")
    first, second = device_tables(shipped, cpu), device_tables(wider, cpu)
    for name, tensor in second.items():
        assert np.array_equal(tensor.numpy(), getattr(wider, name)), name
    assert not torch.equal(first["step_q_tile"], second["step_q_tile"])
    # The same object again: the same tensors, no second upload.
    again = device_tables(shipped, cpu)
    assert all(again[name] is first[name] for name in first)


def test_a_stand_in_schedule_need_not_be_hashable() -> None:
    """The interpreter tests pass duck-typed schedules (a ``SimpleNamespace`` with the table
    fields); the cache keys them by identity and keeps them alive with their entry."""
    from types import SimpleNamespace

    from dash_attn.schedule import TABLE_FIELDS

    spec = ScheduleSpec(batch=1, q_heads=1, kv_heads=1, q_tiles=3, kv_tiles=3, mask=CAUSAL,
                        workers=2)  # fmt: skip
    real = make_schedule("fa3", spec)
    stand_in = SimpleNamespace(**{name: getattr(real, name) for name in TABLE_FIELDS})
    tables = device_tables(stand_in, torch.device("cpu"))  # type: ignore[arg-type]
    assert np.array_equal(tables["step_q_tile"].numpy(), real.step_q_tile)
    assert device_tables(stand_in, torch.device("cpu")) is tables  # type: ignore[arg-type]


def test_tables_a_cuda_graph_was_captured_with_are_never_dropped(monkeypatch) -> None:
    """A replay reads the tables by address: those asked for during a capture stay however many
    other keys come after, while the oldest of the others are dropped beyond the cache's size."""
    from dash_attn.backends import tables

    monkeypatch.setattr(tables, "_cache", {})
    monkeypatch.setattr(tables, "_pinned", set())
    cpu = torch.device("cpu")

    def upload(key: int) -> dict[str, torch.Tensor]:
        return tables.upload_once(("test", key), cpu, lambda: {"t": np.arange(3, dtype=np.int32)})

    first = upload(0)  # before any capture
    monkeypatch.setattr(tables, "_capturing", lambda device: True)
    captured = upload(1)
    monkeypatch.setattr(tables, "_capturing", lambda device: False)
    for key in range(2, 2 + 2 * tables._MAX_CACHED):
        upload(key)
    assert upload(1) is captured  # the same tensors: never dropped
    assert (("test", 0), cpu) not in tables._cache  # the oldest unpinned went
    assert upload(0) is not first
    assert len(tables._cache) == tables._MAX_CACHED
