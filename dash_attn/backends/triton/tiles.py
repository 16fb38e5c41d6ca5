"""Tile sizes of the Triton backward per head dimension (pure Python: plans are made without torch).

The schedule engine works in tiles; this table turns a (seqlen, headdim) shape into the tiles the
Triton backward actually runs, so that the model and the kernel talk about the same DAG.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

SUPPORTED_HEADDIMS = (64, 96, 128, 192, 256)


@dataclass(frozen=True)
class BackwardTiles:
    """Launch configuration of the backward kernel for one head dimension.

    Attributes:
        block_m: Q rows per step (BLOCK_M).
        block_n: KV rows per chain (BLOCK_N, a multiple of block_m).
        num_warps: warps per program.
        num_stages: software-pipelining depth.
        atomic_num_stages: the depth when dQ is added with per-thread atomics instead of TMA
            bulk reductions, where that differs (the atomics' addresses take registers, and
            the atomics path must also fit pre-Hopper GPUs' shared memory).
        tables_ahead: read the step tables one step ahead, so that the next step's loads do
            not wait for a table load (TABLES_AHEAD).
        release_after_qk: release the previous step's dQ tile after this step's first matmul
            instead of at its start (RELEASE_AFTER_QK; deterministic mode only).

    Block sizes set the schedule's tiles and so the summation order; the two options move
    loads and the hand-off only and give the same bits either way.
    """

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    atomic_num_stages: int | None = None
    tables_ahead: bool = False
    release_after_qk: bool = False

    @property
    def label(self) -> str:
        """The spelling :func:`parse_tiles` reads, e.g. ``64x128w8s3a``."""
        flags = ("a" if self.tables_ahead else "") + ("r" if self.release_after_qk else "")
        return f"{self.block_m}x{self.block_n}w{self.num_warps}s{self.num_stages}{flags}"

    @property
    def tile_ratio(self) -> int:
        return self.block_n // self.block_m

    def for_dq_reduce(self, dq_reduce: str) -> BackwardTiles:
        """These tiles as launched with dQ reduction ``dq_reduce`` ("tma" or "atomic")."""
        if dq_reduce == "atomic" and self.atomic_num_stages is not None:
            return replace(self, num_stages=self.atomic_num_stages, atomic_num_stages=None)
        return replace(self, atomic_num_stages=None)


# Measured on the H200 (benchmarks/NOTES.md): at head dim 64 the two-stage pipeline spills with
# atomics (one stage is 11% faster there) but not with TMA, where it is 4-6% faster non-det. At
# 96/128 a third stage only keeps a third buffer when the step tables are read ahead (attempt
# 13; the atomics path keeps two, as three would not fit in an A100's shared memory); at 192/256
# releasing at the step's start spills, after the first matmul does not (14).
_BACKWARD_TILES: dict[int, BackwardTiles] = {
    64: BackwardTiles(block_m=128, block_n=128, num_warps=8, num_stages=2, atomic_num_stages=1),
    96: BackwardTiles(
        block_m=64, block_n=128, num_warps=8, num_stages=3, atomic_num_stages=2, tables_ahead=True
    ),
    128: BackwardTiles(
        block_m=64, block_n=128, num_warps=8, num_stages=3, atomic_num_stages=2, tables_ahead=True
    ),
    192: BackwardTiles(block_m=64, block_n=64, num_warps=8, num_stages=1, release_after_qk=True),
    256: BackwardTiles(block_m=64, block_n=64, num_warps=8, num_stages=1, release_after_qk=True),
}


_TILES = re.compile(r"(\d+)x(\d+)w(\d+)s(\d+)(a?)(r?)")


def parse_tiles(text: str) -> BackwardTiles:
    """Tiles spelled ``BMxBNwWARPSsSTAGES[a][r]``, e.g. ``64x128w8s3a``: a trailing ``a`` reads
    the step tables ahead, ``r`` releases after the first matmul (see BackwardTiles)."""
    match = _TILES.fullmatch(text)
    if match is None:
        raise ValueError(f"tiles {text!r} are not BMxBNwWARPSsSTAGES[a][r], e.g. 64x128w8s2")
    block_m, block_n, warps, stages = map(int, match.groups()[:4])
    if block_n % block_m:
        raise ValueError(f"tiles {text!r}: BN must be a multiple of BM")
    ahead, late = (flag != "" for flag in match.groups()[4:])
    return BackwardTiles(block_m, block_n, warps, stages, tables_ahead=ahead, release_after_qk=late)


def backward_tiles(headdim: int, dq_reduce: str = "tma") -> BackwardTiles:
    """The backward tiles for ``headdim`` with dQ reduction ``dq_reduce`` ("tma" or "atomic");
    raises NotImplementedError for unsupported head dims. Block sizes do not depend on
    ``dq_reduce`` (the schedule's tiles are the same either way), only the pipeline depth may.
    Experiments pass other tiles to ``make_backward_plan`` explicitly (see :func:`parse_tiles`).
    """
    if headdim not in _BACKWARD_TILES:
        raise NotImplementedError(
            f"headdim must be one of {list(SUPPORTED_HEADDIMS)}, got {headdim}"
        )
    return _BACKWARD_TILES[headdim].for_dq_reduce(dq_reduce)
