"""Row bookkeeping of a packed (varlen) backward, computed on the host from the sequence lengths.

The backward's per-row buffers (LSE2, delta and the fp32 dQ accumulator) give every sequence a
multiple of the backward's BLOCK_M rows, so that a Q tile of sequence b covers padded rows
``cu_rows_pad[b] + i * BLOCK_M ..`` and never rows of sequence b + 1. Example, BLOCK_M = 64 and
query lengths (37, 0, 130)::

    cu_seqlens_q = [0, 37, 37, 167]      (tokens)
    cu_rows_pad  = [0, 64, 64, 256]      (37 -> 64 rows, 0 -> 0, 130 -> 192)
    row_index    = [0..36, 64..193]      (token t of the pack -> its padded row)

The lengths are the plan's (``plan.spec.seqlens``): the host knows them anyway (the schedule's
tables depend on them), so nothing here reads the device.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch

from .utils import cdiv


@dataclass(frozen=True)
class VarlenRows:
    """The device tensors and sizes a varlen backward launch needs.

    Attributes:
        cu_seqlens_q, cu_seqlens_k: int32 [batch + 1] token boundaries (the caller's tensors).
        cu_rows_pad: int32 [batch + 1] padded-row boundaries (see the module docstring).
        rows_pad_total: cu_rows_pad[-1], the rows per head of LSE2/delta/the dQ accumulator.
        row_index: int64 [total_q], token -> padded row (gathers dQ out of the accumulator).
    """

    cu_seqlens_q: torch.Tensor
    cu_seqlens_k: torch.Tensor
    cu_rows_pad: torch.Tensor
    rows_pad_total: int
    row_index: torch.Tensor

    @property
    def batch(self) -> int:
        return self.cu_rows_pad.numel() - 1


def padded_row_starts(seqlens_q: tuple[int, ...], block_m: int) -> list[int]:
    """[batch + 1] padded-row boundaries: each sequence rounded up to a multiple of block_m."""
    starts = [0]
    for seqlen in seqlens_q:
        starts.append(starts[-1] + cdiv(seqlen, block_m) * block_m)
    return starts


@lru_cache(maxsize=64)
def _padded_rows(
    seqlens_q: tuple[int, ...], block_m: int, device: torch.device
) -> tuple[torch.Tensor, int, torch.Tensor]:
    starts = padded_row_starts(seqlens_q, block_m)
    pieces = [
        torch.arange(start, start + n, dtype=torch.int64)
        for start, n in zip(starts[:-1], seqlens_q, strict=True)
    ]
    index = torch.cat(pieces) if pieces else torch.zeros(0, dtype=torch.int64)
    cu_rows_pad = torch.tensor(starts, dtype=torch.int32)
    return cu_rows_pad.to(device), starts[-1], index.to(device)


def varlen_rows(
    seqlens: tuple[tuple[int, int], ...],
    block_m: int,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    total_q: int,
) -> VarlenRows:
    """The rows of a varlen backward whose sequences have ``(seqlen_q, seqlen_k)`` ``seqlens``
    (the plan's; they must be what the cu_seqlens tensors hold: checking that would read the
    device). Raises ValueError when sizes disagree (cheap host-side checks only)."""
    if cu_seqlens_q.numel() != len(seqlens) + 1 or cu_seqlens_k.numel() != len(seqlens) + 1:
        raise ValueError(
            f"cu_seqlens_q/cu_seqlens_k must have len(plan.spec.seqlens) + 1 = {len(seqlens) + 1} "
            f"entries, got {cu_seqlens_q.numel()} and {cu_seqlens_k.numel()}"
        )
    seqlens_q = tuple(int(sq) for sq, _ in seqlens)
    if sum(seqlens_q) != total_q:
        raise ValueError(
            f"q has {total_q} rows but the plan's sequences hold {sum(seqlens_q)} query tokens"
        )
    cu_rows_pad, total, index = _padded_rows(seqlens_q, block_m, cu_seqlens_q.device)
    return VarlenRows(cu_seqlens_q, cu_seqlens_k, cu_rows_pad, total, index)
