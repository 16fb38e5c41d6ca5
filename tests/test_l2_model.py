"""tools/l2_model.py: the LRU replay's bounds (everything misses without a cache, only the
first touch of each tile with an unbounded one), the lane caps, and the study's contenders."""

from __future__ import annotations

from dash_attn.plan import CAUSAL, FULL, H200, Problem, make_backward_plan
from tools import l2_model


def _plan(mask=FULL, seqlen: int = 1000, headdim: int = 128):
    problem = Problem(2, seqlen, seqlen, 4, 2, headdim, mask)
    return make_backward_plan(problem, device=H200, backend="hopper")


def test_replay_bounds() -> None:
    plan = _plan()
    schedule, rows = plan.schedule, (plan.tiles.block_m, plan.tiles.block_n)
    none = l2_model.replay(schedule, 128, *rows, l2_bytes=0)
    assert none.missed_gb == none.touched_gb and none.hit_rate == 0.0
    everything = l2_model.replay(schedule, 128, *rows, l2_bytes=1 << 40)
    spec = schedule.spec
    qdo, dq, kv = (4 * 128 + 8) * rows[0], 4 * 128 * rows[0], 4 * 128 * rows[1]
    tiles = spec.batch * spec.q_heads * spec.q_tiles  # every dQ tile is touched (full mask)
    first_touch = tiles * (qdo + dq) + schedule.num_chains * kv
    assert abs(everything.missed_gb - first_touch / 1e9) < 1e-12
    assert everything.touched_gb == none.touched_gb
    assert 0.0 < everything.hit_rate < 1.0


def test_lane_caps() -> None:
    assert l2_model.lane_cap("32", "shift") == 32
    balanced = l2_model.lane_cap("b64", "symmetric_shift")
    assert balanced(171) == 43  # 86 pairs: two rounds of 43 rather than 64 + 22
    assert l2_model.lane_cap("b64", "shift")(100) == 50


def test_contenders_name_the_shipped_tables_first() -> None:
    problem = Problem(1, 2000, 2000, 2, 2, 64, CAUSAL)
    names = [name for name, _ in l2_model.contenders(problem, ["32"])]
    assert names == [
        "symmetric_shift (shipped)",
        "descending",
        "symmetric_shift invariant=False",
        "symmetric_shift lanes 32",
    ]
