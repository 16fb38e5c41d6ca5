"""dash_attn.errors' bookkeeping on the CPU, with stand-in events: a non-blocking check stops at
the first unfinished launch (oldest first) and frees what it read; a synchronising check reads
everything; a set flag raises once with its launch's description."""

from __future__ import annotations

import numpy as np
import pytest

from dash_attn import errors


class FakeEvent:
    """Stands in for torch.cuda.Event: done or not, counting the queries."""

    def __init__(self, done: bool) -> None:
        self.done = done
        self.queries = 0

    def query(self) -> bool:
        self.queries += 1
        return self.done

    def synchronize(self) -> None:
        self.done = True


@pytest.fixture
def fake_state(monkeypatch: pytest.MonkeyPatch):
    host = np.zeros(8, dtype=np.int32)
    monkeypatch.setattr(errors, "_host_view", host)
    monkeypatch.setattr(errors, "_host", host)  # allocated (the pinned tensor needs a GPU)
    monkeypatch.setattr(errors, "_failed", [])
    monkeypatch.setattr(errors, "_pending", {})
    monkeypatch.setattr(errors, "_free_slots", [])
    monkeypatch.setattr(errors, "_free_events", {})
    return host


def _queue(launch: int, done: bool, flag: int, host: np.ndarray) -> FakeEvent:
    event = FakeEvent(done)
    host[launch] = flag
    errors._pending[launch] = (launch, event, 0, f"launch {launch} timed out")
    return event


def test_non_blocking_check_stops_at_the_first_unfinished_launch(fake_state) -> None:
    events = [_queue(i, done, 0, fake_state) for i, done in enumerate([True, True, False, True])]
    events += [_queue(i, False, 0, fake_state) for i in range(4, 8)]
    errors.check_errors(synchronize=False)
    assert list(errors._pending) == [2, 3, 4, 5, 6, 7]  # 0 and 1 read and freed
    assert sorted(errors._free_slots) == [0, 1]
    assert [e.queries for e in events] == [1, 1, 1, 0, 0, 0, 0, 0]  # nothing after launch 2
    errors.check_errors(synchronize=True)
    assert not errors._pending and sorted(errors._free_slots) == list(range(8))


def test_a_set_flag_raises_once_with_its_description(fake_state) -> None:
    _queue(0, True, 0, fake_state)
    _queue(1, True, 1, fake_state)
    _queue(2, False, 1, fake_state)
    with pytest.raises(RuntimeError, match="launch 1 timed out"):
        errors.check_errors(synchronize=False)
    assert list(errors._pending) == [2]
    with pytest.raises(RuntimeError, match="launch 2 timed out"):
        errors.check_errors(synchronize=True)
    errors.check_errors(synchronize=True)  # each reported once


def test_making_room_keeps_a_set_flag_for_the_next_check(fake_state) -> None:
    events = [_queue(i, False, 1 if i == 0 else 0, fake_state) for i in range(8)]
    # Every slot in flight: the next launch waits for the oldest and frees its slot.
    with errors._lock:
        slot = errors._take_slot()
    assert slot == 0 and events[0].done and list(errors._pending) == list(range(1, 8))
    with pytest.raises(RuntimeError, match="launch 0 timed out"):
        errors.check_errors(synchronize=False)
    errors.check_errors(synchronize=True)  # the others were clean


def test_cpu_flag_raises_at_once() -> None:
    torch = pytest.importorskip("torch")
    errors.record_status(torch.zeros((), dtype=torch.int32), "never", synchronize=False)
    with pytest.raises(RuntimeError, match="cpu launch"):
        errors.record_status(torch.ones((), dtype=torch.int32), "cpu launch", synchronize=False)


def test_a_description_function_is_called_only_for_a_set_flag(fake_state) -> None:
    calls: list[int] = []

    def description(launch: int) -> str:
        calls.append(launch)
        return f"launch {launch} made its text"

    for launch, flag in enumerate([0, 1]):
        fake_state[launch] = flag
        errors._pending[launch] = (launch, FakeEvent(True), 0, lambda n=launch: description(n))
    with pytest.raises(RuntimeError, match="launch 1 made its text"):
        errors.check_errors(synchronize=False)
    assert calls == [1]  # the clean launch's text was never made
    torch = pytest.importorskip("torch")
    with pytest.raises(RuntimeError, match="cpu text"):
        errors.record_status(torch.ones((), dtype=torch.int32), lambda: "cpu text", False)


def test_a_check_during_a_graph_capture_queries_no_event(
    fake_state, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Querying an event is not allowed while a CUDA graph is captured: the queued launches wait
    # for the first check after the capture, and a synchronising check refuses with a reason.
    events = [_queue(i, True, 1, fake_state) for i in range(2)]
    monkeypatch.setattr(errors, "_capturing", lambda: True)
    errors.check_errors(synchronize=False)
    assert [e.queries for e in events] == [0, 0] and list(errors._pending) == [0, 1]
    with pytest.raises(RuntimeError, match="cannot run while a CUDA graph is being captured"):
        errors.check_errors(synchronize=True)
    monkeypatch.setattr(errors, "_capturing", lambda: False)
    with pytest.raises(RuntimeError, match="launch 0 timed out"):
        errors.check_errors(synchronize=False)


def test_a_captured_launch_keeps_its_text_for_every_replay(monkeypatch: pytest.MonkeyPatch) -> None:
    # A replay reports under the number its launch got at capture; eager launches take their
    # text when reported and lose it after _MAPPED_KEEP newer launches, captured ones keep it.
    words = np.zeros(errors._MAX_DEVICES, dtype=np.int32)
    monkeypatch.setattr(errors, "_mapped_words", words)
    monkeypatch.setattr(errors, "_mapped_base", 4096)
    monkeypatch.setattr(errors, "_mapped_texts", {})
    monkeypatch.setattr(errors, "_captured_texts", {})
    monkeypatch.setattr(errors, "_mapped_devices", set())
    monkeypatch.setattr(errors, "_failed", [])
    monkeypatch.setattr(errors, "_pending", {})
    address, launch = errors.mapped_launch("captured launch timed out", 1, captured=True)
    assert address == 4096 + 4 and launch > 0
    for _ in range(errors._MAPPED_KEEP + 1):  # evicts any eager text of that age
        errors.mapped_launch("eager launch", 1)
    for _ in range(2):  # two replays that timed out, each seen by a check
        words[1] = launch
        with pytest.raises(RuntimeError, match="captured launch timed out"):
            errors.check_errors(synchronize=False)
        assert words[1] == 0
