"""The shapes of the packed benchmark (``python -m dash_attn.bench.packed``): no torch needed.

Two rows from issue #12, both on the paper's grid (16k tokens, hidden 2048 = 16 heads of 128):

* ``varlen``: documents with seeded log-normal lengths packed into one 16k-token sequence, causal
  inside each document (``varlen_gqa``: the same documents with 16 query heads and 4 kv heads);
* ``window``: one 16k sequence, causal sliding window of 4096 keys back (``window_size=(4096, 0)``).

FLOPs count the query-key pairs the mask really keeps (``attended_pairs``), not ``s^2 / 2``: a
packed sequence of short documents keeps far fewer pairs than one long causal sequence, and a
TFLOPS figure on the dense count would credit every provider with work nobody does.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .timing import MODE_FLOP_FACTOR

TOTAL_TOKENS = 16384
HIDDEN = 2048
HEADDIM = 128
WINDOW_LEFT = 4096
# Median document 1.5k tokens: the middle of the 1-2k the issue asks for. sigma 1.0 puts about two
# thirds of the documents between 0.55k and 4.2k, a spread like pre-training packs.
MEDIAN_DOC = 1536
SIGMA_DOC = 1.0
MIN_DOC = 64
MAX_DOC = 16384
ROW_NAMES = ("varlen", "window", "varlen_gqa")
GQA_KV_HEADS = 4


def document_lengths(
    seed: int,
    total: int = TOTAL_TOKENS,
    *,
    median: float = MEDIAN_DOC,
    sigma: float = SIGMA_DOC,
    low: int = MIN_DOC,
    high: int = MAX_DOC,
) -> list[int]:
    """Log-normal document lengths (``numpy.random.default_rng(seed)``) that sum to ``total``.

    Each length is drawn, rounded and clipped to ``[low, high]``; the document that would overflow
    is cut to fit. A cut left shorter than ``low`` is merged into the previous document, or, if
    that would pass ``high``, the previous document gives the cut the tokens it lacks (it has more
    than ``high - low >= 2 * low`` of them), so every length stays within the bounds.
    """
    if not 0 < 3 * low <= high:
        raise ValueError(f"need 0 < 3 * low <= high, got low={low}, high={high}")
    if total < low:
        raise ValueError(f"total ({total}) must be at least low ({low})")
    rng = np.random.default_rng(seed)
    lengths: list[int] = []
    used = 0
    while used < total:
        drawn = int(np.clip(round(rng.lognormal(math.log(median), sigma)), low, high))
        length = min(drawn, total - used)
        if length < low:  # not the first document: the first is >= low since total >= low
            if lengths[-1] + length <= high:
                lengths[-1] += length
            else:
                lengths[-1] -= low - length
                lengths.append(low)
        else:
            lengths.append(length)
        used += length
    return lengths


def attended_pairs(
    seqlen_q: int, seqlen_k: int, window_left: int = -1, window_right: int = -1
) -> int:
    """Query-key pairs one head keeps, with flash-attn's row rule (bottom-right aligned).

    Row ``m`` keeps key ``n`` iff ``m + d - window_left <= n <= m + d + window_right`` with
    ``d = seqlen_k - seqlen_q``; -1 leaves a side unbounded. Causal is ``window_right = 0``.
    """
    m = np.arange(seqlen_q, dtype=np.int64)
    d = seqlen_k - seqlen_q
    if window_right < 0:
        hi = np.full_like(m, seqlen_k - 1)
    else:
        hi = np.minimum(m + d + window_right, seqlen_k - 1)
    lo = np.zeros_like(m) if window_left < 0 else np.maximum(m + d - window_left, 0)
    return int(np.clip(hi - lo + 1, 0, None).sum())


def packed_pairs(lengths: Sequence[int], window_left: int = -1, window_right: int = 0) -> int:
    """Pairs kept by a packed sequence: each document attends only to itself (square, causal by
    default)."""
    return sum(attended_pairs(n, n, window_left, window_right) for n in lengths)


def flops_from_pairs(pairs: int, heads: int, headdim: int, mode: str) -> float:
    """``4 * pairs * heads * headdim`` for the forward (two matmuls); the backward is 2.5x that
    (the flash-attention convention of ``timing.attention_flops``)."""
    if mode not in MODE_FLOP_FACTOR:
        raise ValueError(f"mode must be one of {list(MODE_FLOP_FACTOR)}, got {mode!r}")
    return MODE_FLOP_FACTOR[mode] * 4.0 * pairs * heads * headdim


@dataclass(frozen=True)
class PackedRow:
    """One benchmark row.

    Attributes:
        name: ``varlen``, ``varlen_gqa`` or ``window`` (the CSV's ``row``).
        lengths: the documents (one for ``window``); they sum to the tokens of the call.
        heads, kv_heads, headdim: attention heads (``kv_heads < heads``: grouped-query).
        window_left: keys back a query sees (-1: every earlier key of its document).
        varlen: called through the varlen API (cu_seqlens), else as one dense sequence (batch 1).
        dtype: ``bf16``.
    """

    name: str
    lengths: tuple[int, ...]
    heads: int
    kv_heads: int
    headdim: int
    window_left: int = -1
    varlen: bool = True
    dtype: str = "bf16"

    @property
    def tokens(self) -> int:
        return sum(self.lengths)

    @property
    def window(self) -> tuple[int, int]:
        """flash-attn's ``window_size`` of this row (causal: the right side is 0)."""
        return (self.window_left, 0)

    @property
    def local(self) -> bool:
        """Whether the row has a finite window (``window_size`` must then be passed)."""
        return self.window_left >= 0

    @property
    def cu_seqlens(self) -> list[int]:
        return [0, *np.cumsum(self.lengths).tolist()]

    @property
    def max_seqlen(self) -> int:
        return max(self.lengths)

    @property
    def pairs(self) -> int:
        return packed_pairs(self.lengths, self.window_left, 0)

    def flops(self, mode: str) -> float:
        return flops_from_pairs(self.pairs, self.heads, self.headdim, mode)

    def doc_ids(self) -> list[int]:
        """The document of every token (FlexAttention's document mask)."""
        return [i for i, n in enumerate(self.lengths) for _ in range(n)]

    @property
    def label(self) -> str:
        kv = f"/{self.kv_heads}" if self.kv_heads != self.heads else ""
        docs = f"{len(self.lengths)} docs" if self.varlen else "1 seq"
        mask = f"window ({self.window_left}, 0)" if self.local else "causal"
        return (
            f"{self.name}: {self.tokens} tokens, {docs}, h{self.heads}{kv} d{self.headdim}, {mask}"
        )


def make_rows(
    names: Sequence[str],
    seed: int,
    *,
    total: int = TOTAL_TOKENS,
    heads: int = HIDDEN // HEADDIM,
    kv_heads_gqa: int = GQA_KV_HEADS,
    headdim: int = HEADDIM,
    window_left: int = WINDOW_LEFT,
    median_doc: float = MEDIAN_DOC,
) -> list[PackedRow]:
    """The rows ``names`` (in that order); the varlen rows share one draw of document lengths."""
    unknown = [n for n in names if n not in ROW_NAMES]
    if unknown:
        raise ValueError(f"unknown rows {unknown}; choose among {list(ROW_NAMES)}")
    docs = tuple(document_lengths(seed, total, median=median_doc))
    build = {
        "varlen": lambda: PackedRow("varlen", docs, heads, heads, headdim),
        "varlen_gqa": lambda: PackedRow("varlen_gqa", docs, heads, kv_heads_gqa, headdim),
        "window": lambda: PackedRow(
            "window", (total,), heads, heads, headdim, window_left=window_left, varlen=False
        ),
    }
    return [build[n]() for n in names]
