"""``dash_attn.determinism``: ``deterministic=`` against ``torch.use_deterministic_algorithms``."""

from __future__ import annotations

import warnings
from collections.abc import Iterator

import pytest
import torch

from dash_attn.determinism import alert_nondeterministic_backward, nondeterministic_message


@pytest.fixture
def restore_switch() -> Iterator[None]:
    # The switch is process-global: every test leaves it as it found it.
    enabled = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    yield
    torch.use_deterministic_algorithms(enabled, warn_only=warn_only)


def _call(deterministic: bool, needs_grad: bool = True) -> list[warnings.WarningMessage]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        alert_nondeterministic_backward(deterministic, needs_grad, "dash_attn_func")
    return list(caught)


@pytest.mark.parametrize("switch", ["off", "on", "warn_only"])
def test_deterministic_true_is_silent_under_every_switch(restore_switch: None, switch: str) -> None:
    if switch != "off":
        torch.use_deterministic_algorithms(True, warn_only=switch == "warn_only")
    else:
        torch.use_deterministic_algorithms(False)
    assert _call(deterministic=True) == []


def test_nondeterministic_allowed_when_switch_off(restore_switch: None) -> None:
    torch.use_deterministic_algorithms(False)
    assert _call(deterministic=False) == []


def test_nondeterministic_raises_when_switch_on(restore_switch: None) -> None:
    torch.use_deterministic_algorithms(True)
    with pytest.raises(RuntimeError) as info:
        _call(deterministic=False)
    text = str(info.value)
    # torch's own wording, then the name of our function and both ways out.
    assert "does not have a deterministic implementation" in text
    assert "torch.use_deterministic_algorithms(True)" in text
    assert "dash_attn_func" in text
    assert "deterministic=True" in text
    assert "warn_only=True" in text


def test_nondeterministic_warns_under_warn_only(restore_switch: None) -> None:
    torch.use_deterministic_algorithms(True, warn_only=True)
    caught = _call(deterministic=False)
    assert len(caught) == 1
    assert caught[0].category is UserWarning
    text = str(caught[0].message)
    assert text == nondeterministic_message("dash_attn_func", warn_only=True)
    assert "'torch.use_deterministic_algorithms(True, warn_only=True)'" in text
    assert "deterministic=True" in text


def test_forward_only_call_is_never_refused(restore_switch: None) -> None:
    torch.use_deterministic_algorithms(True)
    assert _call(deterministic=False, needs_grad=False) == []


def test_message_names_the_function() -> None:
    text = nondeterministic_message("dash_attn_varlen_func")
    assert text.startswith("dash_attn_varlen_func(..., deterministic=False) backward")


@pytest.mark.parametrize("warn_only", [False, True], ids=["error", "warn_only"])
def test_same_kind_and_wording_as_torch(restore_switch: None, warn_only: bool) -> None:
    # torch's Python-side alert (the one its meta kernels use) stands in for a CUDA-only op, so
    # the comparison runs without a GPU: same exception/warning class, same leading sentence.
    from torch._prims_common import alert_not_deterministic

    torch.use_deterministic_algorithms(True, warn_only=warn_only)
    if warn_only:
        with warnings.catch_warnings(record=True) as theirs:
            warnings.simplefilter("always")
            alert_not_deterministic("some_op")
        ours = _call(deterministic=False)
        assert [w.category for w in ours] == [w.category for w in theirs] == [UserWarning]
        their_text, our_text = str(theirs[0].message), str(ours[0].message)
    else:
        with pytest.raises(RuntimeError) as their_error:
            alert_not_deterministic("some_op")
        with pytest.raises(RuntimeError) as our_error:
            _call(deterministic=False)
        their_text, our_text = str(their_error.value), str(our_error.value)
    head = their_text.split("some_op ", 1)[1].split(". ")[0]
    assert head.startswith("does not have a deterministic implementation, but you set")
    assert head in our_text
