"""Masks with windows, per-sequence geometry, and the schedules and checks built on them."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from dash_attn.schedule import (
    CAUSAL,
    FULL,
    Mask,
    ScheduleSpec,
    applicable_schedules,
    make_schedule,
    schedule_from_json,
    schedule_to_json,
    validate,
)
from dash_attn.schedule.geometry import tile_geometry, token_geometry

# ------------------------------------------------------------------------------------------------
# Mask


def test_mask_normalises_causal_and_right_zero_windows() -> None:
    assert Mask(causal=True).window == (-1, 0)
    assert Mask(window_right=0) == CAUSAL
    assert Mask(causal=True, window_left=7) == Mask(window_left=7, window_right=0)
    assert Mask(causal=True, window_right=5).window_right == 0  # flash-attn: causal wins
    assert hash(Mask(window_right=0)) == hash(CAUSAL)


@pytest.mark.parametrize(
    ("mask", "kind", "name"),
    [
        (FULL, "full", "full"),
        (CAUSAL, "causal", "causal"),
        (Mask(window_left=4096, window_right=0), "local", "local(4096,0)"),
        (Mask(window_left=-1, window_right=3), "local", "local(-1,3)"),
        (Mask(window_left=2, window_right=-1), "local", "local(2,-1)"),
        (Mask(window_left=0, window_right=0), "local", "local(0,0)"),
    ],
)
def test_mask_kind_name_parse(mask: Mask, kind: str, name: str) -> None:
    assert (mask.kind, mask.name) == (kind, name)
    assert Mask.parse(name) == mask
    assert Mask.parse(name.replace(",", ", ")) == mask


@pytest.mark.parametrize("bad", ["local", "local(1)", "local(a,b)", "window(1,2)", "Causal"])
def test_mask_parse_rejects(bad: str) -> None:
    with pytest.raises(ValueError, match="'full', 'causal' or 'local\\(L,R\\)'"):
        Mask.parse(bad)


def test_mask_rejects_bad_windows() -> None:
    with pytest.raises(ValueError, match="window_left must be -1"):
        Mask(window_left=-2)
    with pytest.raises(TypeError, match="window_right must be an int"):
        Mask(window_right=1.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="causal must be a bool"):
        Mask(causal=1)  # type: ignore[arg-type]


def test_keeps_is_the_flash_attn_row_rule() -> None:
    rng = np.random.default_rng(1)
    for _ in range(200):
        sq, sk = (int(x) for x in rng.integers(1, 40, 2))
        left, right = (int(x) for x in rng.integers(-1, 10, 2))
        mask = Mask(window_left=left, window_right=right)
        m, n = np.arange(sq)[:, None], np.arange(sk)[None, :]
        got = mask.keeps(m, n, sq, sk)
        d = sk - sq
        want = np.ones((sq, sk), bool)
        if right >= 0:
            want &= n <= m + d + right
        if left >= 0:
            want &= n >= m + d - left
        np.testing.assert_array_equal(got, want)
        assert bool(mask.keeps(sq, 0, sq, sk)) is False  # rows past the sequence: never


# ------------------------------------------------------------------------------------------------
# Geometry


def _brute_meets(sq: int, sk: int, bm: int, bn: int, mask: Mask) -> np.ndarray:
    m, n = np.arange(sq)[:, None], np.arange(sk)[None, :]
    keep = mask.keeps(m, n, sq, sk)
    q_tiles, kv_tiles = -(-sq // bm), -(-sk // bn)
    meets = np.zeros((q_tiles, kv_tiles), bool)
    for i in range(q_tiles):
        for j in range(kv_tiles):
            meets[i, j] = keep[i * bm : (i + 1) * bm, j * bn : (j + 1) * bn].any()
    return meets


def test_token_geometry_is_token_exact() -> None:
    rng = np.random.default_rng(2)
    for _ in range(400):
        sq, sk = (int(x) for x in rng.integers(0, 120, 2))
        bm = int(rng.choice([4, 8, 16]))
        bn = bm * int(rng.integers(1, 4))
        mask = Mask(
            window_left=int(rng.choice([-1, 0, 3, 20, 50])),
            window_right=int(rng.choice([-1, 0, 2, 30])),
        )
        geometry = token_geometry(sq, sk, bm, bn, mask)
        meets = _brute_meets(sq, sk, bm, bn, mask)
        for j in range(geometry.kv_tiles):
            lo, hi = geometry.q_range(j)
            assert np.flatnonzero(meets[:, j]).tolist() == list(range(lo, hi)), (sq, sk, mask, j)
        for i in range(geometry.q_tiles):
            lo, hi = geometry.kv_range(i)
            assert np.flatnonzero(meets[i]).tolist() == list(range(lo, hi)), (sq, sk, mask, i)
        assert geometry.num_pairs == int(meets.sum())


def test_tile_geometry_agrees_with_tokens_for_dense_masks() -> None:
    rng = np.random.default_rng(3)
    for _ in range(300):
        sq, sk = (int(x) for x in rng.integers(1, 200, 2))
        bm = int(rng.choice([8, 16]))
        ratio = int(rng.integers(1, 4))
        for mask in (FULL, CAUSAL):
            spec = ScheduleSpec.from_shape(
                batch=1,
                seqlen_q=sq,
                seqlen_k=sk,
                q_heads=1,
                kv_heads=1,
                block_m=bm,
                block_n=bm * ratio,
                mask=mask,
                workers=1,
            )
            tokens = token_geometry(sq, sk, bm, bm * ratio, mask)
            tiles = tile_geometry(
                spec.q_tiles, spec.kv_tiles, ratio, spec.causal_offset, mask.causal
            )
            if mask.causal and tokens.q_lo[-1] == tokens.q_tiles:
                continue  # a KV tile no query sees: a spec in tiles cannot express it
            for name in ("q_lo", "q_hi", "kv_lo", "kv_hi"):
                np.testing.assert_array_equal(getattr(tokens, name), getattr(tiles, name))


# ------------------------------------------------------------------------------------------------
# ScheduleSpec with sequences

WINDOW = Mask(window_left=20, window_right=0)


def _varlen(mask: Mask = WINDOW, **kwargs: object) -> ScheduleSpec:
    args: dict[str, object] = dict(
        seqlens=[(50, 50), (13, 30), (0, 9), (70, 40), (9, 0)],
        q_heads=4,
        kv_heads=2,
        block_m=8,
        block_n=16,
        mask=mask,
        workers=6,
    )
    args.update(kwargs)
    return ScheduleSpec.from_seqlens(**args)  # type: ignore[arg-type]


def test_from_seqlens_pads_the_grid() -> None:
    spec = _varlen()
    assert (spec.batch, spec.q_tiles, spec.kv_tiles, spec.tile_ratio) == (5, 9, 4, 2)
    assert [spec.seq_tiles(b) for b in range(5)] == [(7, 4), (2, 2), (0, 1), (9, 3), (2, 0)]
    assert spec.seqlens == ((50, 50), (13, 30), (0, 9), (70, 40), (9, 0))
    assert spec.q_tile_range(2, 0) == (0, 0)  # no query: the KV tile meets nothing
    assert spec.q_tile_range(1, 3) == (0, 0)  # padding
    assert spec.kv_tile_range(4, 1) == (0, 0)  # no key
    # Window 20 behind the diagonal, d = -30: Q tile 8 (rows 64..69) sees keys 14..39.
    assert spec.kv_tile_range(3, 8) == (0, 3)
    assert spec.kv_tile_range(3, 3) == (0, 1)  # rows 24..31 see keys <= 1
    assert spec.kv_tile_range(3, 2) == (0, 0)  # rows 16..23 see no key (n <= m - 30 < 0)
    # Chain (b * 2 + g) * 4 + j for j below each sequence's KV tiles (4, 2, 1, 3, 0).
    live = [*range(8), 8, 9, 12, 13, 16, 20, 24, 25, 26, 28, 29, 30]
    assert spec.live_chains().tolist() == live


def test_dense_spec_keeps_first_q_tile_and_kv_tiles_of() -> None:
    spec = ScheduleSpec.from_shape(
        batch=2,
        seqlen_q=40,
        seqlen_k=56,
        q_heads=1,
        kv_heads=1,
        block_m=8,
        block_n=16,
        mask=CAUSAL,
        workers=4,
    )
    assert spec.seqlens == ((40, 56),) * 2 and spec.block_m == 8 and spec.block_n == 16
    assert [spec.first_q_tile(j) for j in range(spec.kv_tiles)] == [0, 0, 2, 4]
    assert [spec.kv_tiles_of(i) for i in range(spec.q_tiles)] == [2, 2, 3, 3, 4]
    with pytest.raises(ValueError, match="q_tile_range"):
        _varlen().first_q_tile(0)
    with pytest.raises(ValueError, match="kv_tile_range"):
        _varlen(mask=CAUSAL).kv_tiles_of(0)


@pytest.mark.parametrize("mask", [FULL, CAUSAL, WINDOW])
def test_kv_tiles_need_not_be_a_multiple_of_q_tiles(mask: Mask) -> None:
    """80 x 128 tiles (the hopper backward's at hd 128, full mask): the token geometry is exact
    and every schedule for the mask gives valid tables, on lengths that are no tile multiples."""
    for seqlen_q, seqlen_k in [(333, 333), (200, 457), (457, 200), (80, 128)]:
        spec = ScheduleSpec.from_shape(
            batch=2, seqlen_q=seqlen_q, seqlen_k=seqlen_k, q_heads=4, kv_heads=2, block_m=80,
            block_n=128, mask=mask, workers=5,
        )  # fmt: skip
        assert (spec.block_m, spec.block_n, spec.tile_ratio) == (80, 128, 1)
        assert (spec.q_tiles, spec.kv_tiles) == (-(-seqlen_q // 80), -(-seqlen_k // 128))
        meets = _brute_meets(seqlen_q, seqlen_k, 80, 128, mask)
        assert spec.num_tasks() == int(meets.sum()) * spec.q_heads * spec.batch
        for name in applicable_schedules(spec):
            _check_tables(spec, name)
    packed = ScheduleSpec.from_seqlens(
        seqlens=[(170, 170), (0, 9), (81, 300)], q_heads=2, kv_heads=1, block_m=80,
        block_n=128, mask=mask, workers=4,
    )  # fmt: skip
    assert packed.block_n == 128
    for name in applicable_schedules(packed):
        _check_tables(packed, name)
    back = schedule_from_json(json.loads(json.dumps(schedule_to_json(make_schedule("fa3", spec)))))
    assert back.spec == spec


def test_spec_checks_block_n() -> None:
    spec = ScheduleSpec.from_shape(
        batch=1, seqlen_q=100, seqlen_k=100, q_heads=1, kv_heads=1, block_m=64, block_n=128,
        mask=FULL, workers=1,
    )  # fmt: skip
    assert (spec.block_n, spec.tile_ratio) == (128, 2)
    # Without block_n, it is block_m x tile_ratio.
    assert dataclasses.replace(spec, block_n=None).block_n == 128
    with pytest.raises(ValueError, match=r"tile_ratio=1 does not match block_m=64, block_n=128"):
        dataclasses.replace(spec, tile_ratio=1)
    with pytest.raises(ValueError, match="block_n must be >= 1"):
        dataclasses.replace(spec, block_n=0)
    with pytest.raises(ValueError, match="a spec given in tiles needs block_n"):
        ScheduleSpec(
            batch=1, q_heads=1, kv_heads=1, q_tiles=2, kv_tiles=2, mask=FULL, block_m=80,
            block_n=128,
        )  # fmt: skip


def test_spec_rejects_inconsistent_sequences() -> None:
    spec = _varlen()
    with pytest.raises(ValueError, match="do not match seqlens"):
        dataclasses.replace(spec, q_tiles=spec.q_tiles + 1)
    with pytest.raises(ValueError, match="seqlens has 5 sequences, but batch is 4"):
        dataclasses.replace(spec, batch=4)
    with pytest.raises(ValueError, match="needs block_m"):
        dataclasses.replace(spec, block_m=None)
    with pytest.raises(ValueError, match=r"seqlens\[1\]\[0\] \(seqlen_q\) must be >= 0"):
        _varlen(seqlens=[(5, 5), (-1, 5)])
    with pytest.raises(ValueError, match="at least one sequence"):
        _varlen(seqlens=[])
    with pytest.raises(ValueError, match=r"local\(20,0\) mask needs token lengths"):
        ScheduleSpec(batch=1, q_heads=1, kv_heads=1, q_tiles=2, kv_tiles=2, mask=WINDOW)
    with pytest.raises(TypeError, match="invariant must be a bool"):
        dataclasses.replace(spec, invariant=1)


# ------------------------------------------------------------------------------------------------
# Generators and the validator on sequences


def _check_tables(spec: ScheduleSpec, name: str) -> None:
    schedule = make_schedule(name, spec)
    assert validate(schedule).valid
    assert schedule.num_steps == spec.num_tasks()
    listed = sorted(schedule.order.tolist())
    assert listed == spec.live_chains().tolist()
    for chain in range(spec.num_chains):
        b, kv_head, j = schedule.chain_coords(chain)
        steps = schedule.chain_steps(chain)
        lo, hi = spec.q_tile_range(b, j)
        assert sorted({q for _, q, _ in steps}) == list(range(lo, hi))
        if j >= spec.seq_tiles(b)[1]:
            assert steps == []
        for _, q, rank in steps:
            kv_lo, kv_hi = spec.kv_tile_range(b, q)
            assert 0 <= rank < kv_hi - kv_lo
            if name in ("fa3", "descending"):
                assert rank == j - kv_lo  # counts contributing KV tiles only


@pytest.mark.parametrize("name", ["fa3", "descending"])
@pytest.mark.parametrize("mask", [FULL, CAUSAL, WINDOW, Mask(window_left=9, window_right=17)])
def test_dynamic_generators_on_varlen_and_windows(name: str, mask: Mask) -> None:
    _check_tables(_varlen(mask=mask), name)


def test_descending_walks_each_band_top_down() -> None:
    spec = _varlen(mask=Mask(window_left=9, window_right=17))
    schedule = make_schedule("descending", spec)
    for chain in schedule.order.tolist():
        tiles = [
            q for h, q, _ in schedule.chain_steps(chain) if h == schedule.chain_steps(chain)[0][0]
        ]
        assert tiles == sorted(tiles, reverse=True)


def test_applicable_schedules_by_kind() -> None:
    assert applicable_schedules(WINDOW) == ["fa3", "descending"]
    with pytest.raises(ValueError, match=r"not the local\(20,0\) mask"):
        make_schedule("symmetric_shift", _varlen())


def test_validator_rejects_padding_and_pairs_outside_the_window() -> None:
    spec = _varlen()
    schedule = make_schedule("fa3", spec)
    padded = spec.chain_id(1, 0, 3)
    order = np.append(schedule.order, padded)
    broken = dataclasses.replace(schedule, order=order, worker_start=[0, len(order)])
    report = validate(broken, raise_on_error=False)
    assert any("padding past sequence 1's 2 KV tiles" in e for e in report.errors)

    missing = dataclasses.replace(
        schedule, order=schedule.order[:-1], worker_start=[0, len(schedule.order) - 1]
    )
    assert any("order misses chain" in e for e in validate(missing, raise_on_error=False).errors)

    tiles = schedule.step_q_tile.copy()
    chain = spec.chain_id(3, 0, 0)
    step = int(schedule.chain_start[chain])  # KV tile 0 of sequence 3 meets Q tiles 4..8
    tiles[step] = 0
    moved = dataclasses.replace(schedule, step_q_tile=tiles)
    with pytest.raises(ValueError, match=r"outside the local\(20,0\) mask \(KV tile 0 of sequence"):
        validate(moved)


def test_json_round_trip_keeps_sequences_and_window() -> None:
    schedule = make_schedule("descending", _varlen())
    data = json.loads(json.dumps(schedule_to_json(schedule)))
    assert data["spec"]["mask"] == "local(20,0)"
    assert (data["spec"]["window_left"], data["spec"]["window_right"]) == (20, 0)
    back = schedule_from_json(data)
    assert back.spec == schedule.spec
    for field in ("chain_start", "step_q_tile", "step_rank", "order"):
        np.testing.assert_array_equal(getattr(back, field), getattr(schedule, field))
    data["spec"]["window_left"] = 3
    with pytest.raises(ValueError, match="contradicts mask"):
        schedule_from_json(data)


def test_json_without_invariant_reads_as_worker_dependent() -> None:
    spec = ScheduleSpec(batch=1, q_heads=1, kv_heads=1, q_tiles=3, kv_tiles=3, mask=FULL, workers=3)
    data = schedule_to_json(make_schedule("fa3", spec))
    for key in ("seqlens", "block_m", "invariant", "window_left", "window_right"):
        del data["spec"][key]
    assert schedule_from_json(data).spec.invariant is False
