"""The fragment-order layout of the Hopper backward's fp32 dQ accumulator.

Each step's dQ partial (block_m x head_dim fp32, held by the 256 MMA threads as WGMMA
accumulator fragments) goes to shared memory and then to global memory *as the threads hold
it*, not row-major. The tile is two halves, one per MMA warpgroup (each warpgroup's registers
are one contiguous half), and in its half thread ``t`` (``t % 128`` within its warpgroup)
writes its registers ``i = 4 j .. 4 j + 3`` as one 16-byte store at float offset
``j * 512 + 4 (t % 128)``. A warp's store then covers 512 contiguous bytes (no bank conflicts,
a quarter of the store instructions of 32-bit pairs), and each half is added to global memory
by one flat bulk reduce (``cp.reduce.async.bulk``), so each warpgroup hands its half over on
its own (or both go as one reduce of the whole tile). The global accumulator is
``(batch, heads, q_tiles, block_m * head_dim)``; only the final scale-and-cast
(:mod:`.dq_cast`) knows where each element lives. FA4 does the same (its postprocess rebuilds
the MMA to decode); here the map is written out, checked against the kernel's own fragment
coordinates at compile time (``HopperAttnBwd``) and by the tests.

Pure Python: no torch, cutlass or triton.

Worked example (block_m 64, head_dim 128: the two MMA warpgroups split the head dim): thread
t = 37 is warpgroup 0, warp 1, lane 5. Its register 6 is (k, j, n8) = (0, 1, 1): row
16 * 1 + 5 // 4 + 8 = 25, column 8 + 2 * (5 % 4) + 0 = 10; it is stored at float offset
(6 // 4) * 512 + 4 * 37 + 6 % 4 = 662. With block_m 80 (dQ^T in the accumulator) the same
register of thread 128 + 37 holds Q row 10, head-dim column 64 + 25 = 89, in warpgroup 1's
half, which starts at 80 * 128 / 2 = 5120: offset 5120 + 512 + 4 * 37 + 2 = 5782.
"""

from __future__ import annotations

MMA_THREADS = 256  # two warpgroups
WG_THREADS = 128
_CHUNK = 4  # fp32 values per 16-byte store


def wg_split(block_m: int) -> str:
    """How the two MMA warpgroups share the dQ tile: "cols" (64 rows: each takes half the head
    dim), "rows" (128 rows: each takes 64 rows) or "swap" (80 rows: the kernel computes dQ^T,
    each warpgroup 64 head-dim rows of it, i.e. half the head dim of all 80 Q rows)."""
    if block_m == 64:
        return "cols"
    if block_m == 128:
        return "rows"
    if block_m == 80:
        return "swap"
    raise ValueError(f"block_m must be 64, 80 or 128 for the dQ fragment layout, got {block_m}")


def registers(block_m: int, head_dim: int) -> int:
    """fp32 accumulator registers per MMA thread: the tile spread over the 256 threads."""
    return block_m * head_dim // MMA_THREADS


def fragment_coords(block_m: int, head_dim: int, thread: int, index: int) -> tuple[int, int]:
    """(row, col) in the dQ tile of accumulator register ``index`` of MMA thread ``thread``.

    The WGMMA m64nN accumulator: within a warpgroup, warp w and lane l hold rows
    16 w + l // 4 (+ 8), and registers come in (k, j, n8) order: column pair bit k, row half j,
    8-column group n8. With "swap" the accumulator is dQ^T: its rows are head-dim columns of
    the tile and its columns Q rows.
    """
    split = wg_split(block_m)
    if not 0 <= thread < MMA_THREADS or not 0 <= index < registers(block_m, head_dim):
        raise ValueError(f"thread {thread} / register {index} out of range")
    wg, warp, lane = thread // 128, (thread % 128) // 32, thread % 32
    k, j, n8 = index % 2, (index // 2) % 2, index // 4
    row = 16 * warp + lane // 4 + 8 * j
    col = 8 * n8 + 2 * (lane % 4) + k
    if split == "cols":
        return row, wg * (head_dim // 2) + col
    if split == "swap":
        return col, 64 * wg + row
    return 64 * wg + row, col


def half_size(block_m: int, head_dim: int) -> int:
    """fp32 values in one warpgroup's half of the tile (warpgroup w's starts at w times it)."""
    return block_m * head_dim // 2


def fragment_offset(block_m: int, head_dim: int, thread: int, index: int) -> int:
    """Float offset in the tile of register ``index`` of MMA thread ``thread``."""
    wg, t = divmod(thread, WG_THREADS)
    return (
        wg * half_size(block_m, head_dim)
        + (index // _CHUNK) * (WG_THREADS * _CHUNK) + t * _CHUNK + index % _CHUNK
    )  # fmt: skip


def tile_offset(block_m: int, head_dim: int, row: int, col: int) -> int:
    """Float offset in the tile of element (row, col): the inverse of ``fragment_coords``
    followed by ``fragment_offset`` (the formula the cast kernel evaluates per element)."""
    split = wg_split(block_m)
    if split == "cols":
        wg, rr, cc = col // (head_dim // 2), row, col % (head_dim // 2)
    elif split == "swap":
        wg, rr, cc = col // 64, col % 64, row
    else:
        wg, rr, cc = row // 64, row % 64, col
    thread = 128 * wg + 32 * (rr // 16) + 4 * (rr % 8) + (cc % 8) // 2
    index = cc % 2 + 2 * ((rr % 16) // 8) + 4 * (cc // 8)
    return fragment_offset(block_m, head_dim, thread, index)
