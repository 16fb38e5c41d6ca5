"""The deferred error flags (dash_attn.errors) on a GPU: pinned slots and events are reused, a set
flag raises at the next check however many launches came before it, and a full slot ring waits
for the oldest launch instead of losing a flag."""

from __future__ import annotations

import pytest
import torch

from dash_attn import errors

pytestmark = pytest.mark.gpu


def _flag(value: int) -> torch.Tensor:
    return torch.full((), value, device="cuda", dtype=torch.int32)


def test_flags_of_more_launches_than_slots_are_all_read() -> None:
    errors.check_errors()
    clean = _flag(0)
    for _ in range(3 * errors._SLOTS):  # wraps the slot ring three times
        errors.record_status(clean, "never raised", synchronize=False)
    errors.check_errors()  # nothing set: no error
    assert not errors._pending
    assert len(errors._free_slots) == errors._SLOTS


def test_a_set_flag_raises_with_its_description_once() -> None:
    errors.check_errors()
    # It raises at the first check after the flag's copy has landed (each backward starts with
    # one; here check_errors), not at the launches recorded after it.
    with pytest.raises(RuntimeError, match="launch 2 timed out"):
        errors.record_status(_flag(0), "clean launch", synchronize=False)
        errors.record_status(_flag(1), "launch 2 timed out", synchronize=False)
        errors.record_status(_flag(0), "clean launch", synchronize=False)
        errors.check_errors()
    errors.check_errors()  # reported once, then gone
    assert not errors._pending


def test_synchronize_raises_at_once() -> None:
    errors.check_errors()
    with pytest.raises(RuntimeError, match="at once"):
        errors.record_status(_flag(1), "at once", synchronize=True)
