"""Host-side pieces of the varlen/window launch (no kernel runs): the kernels' window
arguments, the padded-row bookkeeping, and the errors of ``run_backward``'s varlen arguments."""

from __future__ import annotations

import pytest
import torch

from dash_attn.backends.triton.utils import UNBOUNDED, kernel_window
from dash_attn.backends.triton.varlen import padded_row_starts, varlen_rows


@pytest.mark.parametrize(
    "causal, window, expected",
    [
        (False, (-1, -1), ("full", UNBOUNDED, UNBOUNDED)),
        (True, (-1, -1), ("causal", UNBOUNDED, 0)),
        (False, (-1, 0), ("causal", UNBOUNDED, 0)),
        (True, (8, 5), ("local", 8, 0)),  # causal bounds the right side at 0, as flash-attn
        (False, (8, 0), ("local", 8, 0)),
        (False, (-1, 3), ("local", UNBOUNDED, 3)),
        (False, (0, 0), ("local", 0, 0)),
    ],
)
def test_kernel_window(causal: bool, window: tuple[int, int], expected: tuple) -> None:
    assert kernel_window(causal, window) == expected


@pytest.mark.parametrize("window", [(-2, 0), (0, -5)])
def test_kernel_window_rejects_sides_below_minus_one(window: tuple[int, int]) -> None:
    with pytest.raises(ValueError, match="window_(left|right) must be >= -1"):
        kernel_window(False, window)


def test_padded_rows_of_the_docstring_example() -> None:
    assert padded_row_starts((37, 0, 130), 64) == [0, 64, 64, 256]
    rows = varlen_rows(
        ((37, 5), (0, 9), (130, 130)), 64,
        torch.tensor([0, 37, 37, 167], dtype=torch.int32),
        torch.tensor([0, 5, 14, 144], dtype=torch.int32), 167,
    )  # fmt: skip
    assert rows.batch == 3 and rows.rows_pad_total == 256
    assert rows.cu_rows_pad.tolist() == [0, 64, 64, 256]
    assert rows.cu_rows_pad.dtype == torch.int32
    expected = list(range(37)) + list(range(64, 194))
    assert rows.row_index.tolist() == expected and rows.row_index.dtype == torch.int64


def test_varlen_rows_checks_sizes_against_the_plan() -> None:
    cu = torch.tensor([0, 3, 7], dtype=torch.int32)
    with pytest.raises(ValueError, match="len\\(plan.spec.seqlens\\) \\+ 1 = 4"):
        varlen_rows(((3, 3), (4, 4), (1, 1)), 64, cu, cu, 8)
    with pytest.raises(ValueError, match="q has 9 rows but the plan's sequences hold 7"):
        varlen_rows(((3, 3), (4, 4)), 64, cu, cu, 9)


def _varlen_call(plan, **kwargs):
    from dash_attn.backends.triton.launch import run_backward

    q = torch.zeros(7, 2, 64, dtype=torch.float16)
    k = torch.zeros(7, 1, 64, dtype=torch.float16)
    lse = torch.zeros(2, 7)
    return run_backward(plan, q, q, k, k, q, lse, 0.125, **kwargs)


def _plan(**changes):
    import dataclasses
    from types import SimpleNamespace

    from dash_attn.plan import INTERPRETER
    from dash_attn.testing import BandMask, band_plan

    plan = band_plan([(3, 3), (4, 4)], 2, 1, 64, BandMask(True), device=INTERPRETER)
    spec_changes = {key: changes.pop(key) for key in ("seqlens", "block_m") if key in changes}
    fields = {**vars(plan), **changes}
    fields["spec"] = dataclasses.replace(plan.spec, **spec_changes)
    return SimpleNamespace(**fields)


def test_run_backward_varlen_arguments_are_checked_before_any_launch() -> None:
    cu = torch.tensor([0, 3, 7], dtype=torch.int32)
    with pytest.raises(ValueError, match="cu_seqlens_q and cu_seqlens_k must be given together"):
        _varlen_call(_plan(), cu_seqlens_q=cu)
    with pytest.raises(ValueError, match="plan.spec.seqlens is None"):
        _varlen_call(_plan(seqlens=None), cu_seqlens_q=cu, cu_seqlens_k=cu)
    with pytest.raises(ValueError, match="plan.spec.block_m \\(64\\) differs"):
        _varlen_call(_plan(block_m=64), cu_seqlens_q=cu, cu_seqlens_k=cu)
    with pytest.raises(NotImplementedError, match="hopper backward runs padded batches"):
        _varlen_call(_plan(backend="hopper"), cu_seqlens_q=cu, cu_seqlens_k=cu)


@pytest.mark.parametrize("block_m", [64, 128])
def test_every_q_tile_box_stays_inside_its_sequence(block_m: int) -> None:
    # What keeps the TMA dQ reduction correct for packed sequences: the (BLOCK_M x headdim) box
    # of Q tile i of sequence b covers padded rows cu_rows_pad[b] + i * BLOCK_M + [0, BLOCK_M),
    # all inside sequence b's padded range, so no row of another sequence is ever added to; and
    # every real token has its own padded row inside its sequence's range.
    gen = torch.Generator().manual_seed(0)
    for _ in range(50):
        count = int(torch.randint(1, 9, (1,), generator=gen))
        lengths = tuple(int(x) for x in torch.randint(0, 400, (count,), generator=gen))
        starts = padded_row_starts(lengths, block_m)
        cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
        rows = varlen_rows(tuple((n, 1) for n in lengths), block_m, cu, cu, sum(lengths))
        for b, seqlen in enumerate(lengths):
            assert starts[b] % block_m == 0
            for tile in range(-(-seqlen // block_m)):
                box = starts[b] + tile * block_m
                assert starts[b] <= box and box + block_m <= starts[b + 1]
            token_rows = rows.row_index[int(cu[b]) : int(cu[b + 1])]
            assert token_rows.tolist() == list(range(starts[b], starts[b] + seqlen))
        assert rows.rows_pad_total == starts[-1]
