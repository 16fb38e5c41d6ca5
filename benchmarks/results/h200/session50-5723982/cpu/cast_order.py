"""Which dQ tiles the hopper dQ cast reads first, against the order the main kernel completes
them (DAG simulation of the auto schedule, C = 1, R = 0.3, the sweep's shapes).

The cast's grid is (q tile, batch x head), so it reads tile ids in ascending order; reversed, it
would read the last-completed tiles first, while some may still be in L2 (50 MB against a 134 MB
accumulator). Prints, per config, the share of the cast's first 50/134 of tiles that are among
the last-completed 50/134, in grid order and reversed. Session 50, CPU, from the repository
root: ``PYTHONPATH=. python benchmarks/results/h200/session50-5723982/cpu/cast_order.py``
"""

from __future__ import annotations

import numpy as np

from dash_attn.plan import Problem
from dash_attn.schedule import Mask, auto_schedule_name, make_schedule, simulate
from dash_attn.schedule.report import analysis_spec

TOKENS, HIDDEN, L2_SHARE = 16384, 2048, 50 / 134


def completion_times(headdim: int, causal: bool, seqlen: int) -> tuple[str, np.ndarray]:
    """(schedule name, each dQ tile's last reduce end) with tile id (b * H + h) * M + q tile."""
    heads = HIDDEN // headdim
    problem = Problem(TOKENS // seqlen, seqlen, seqlen, heads, heads, headdim, Mask(causal=causal))
    spec, _ = analysis_spec(problem, 132, backend="hopper")
    name = auto_schedule_name(spec)
    schedule = make_schedule(name, spec)
    result = simulate(schedule, 1.0, 0.3)
    chains = len(schedule.chain_start) - 1
    chain_of_step = np.repeat(np.arange(chains), np.diff(schedule.chain_start))
    batch = chain_of_step // (spec.kv_heads * spec.kv_tiles)
    tile = (batch * spec.q_heads + schedule.step_q_head) * spec.q_tiles + schedule.step_q_tile
    done = np.zeros(spec.batch * spec.q_heads * spec.q_tiles)
    np.maximum.at(done, tile, result.reduce_end)
    return name, done


def main() -> None:
    for headdim in (64, 128):
        for causal in (False, True):
            for seqlen in (1024, 2048, 4096, 16384):
                name, done = completion_times(headdim, causal, seqlen)
                count = int(len(done) * L2_SHARE)
                last = set(np.argsort(done)[len(done) - count :].tolist())
                ids = np.arange(len(done))
                grid = np.mean([t in last for t in ids[:count]])
                reversed_ = np.mean([t in last for t in ids[::-1][:count]])
                mask = "causal" if causal else "full"
                print(
                    f"hd {headdim} {mask} {seqlen} ({name}): first {count} tiles read that are "
                    f"among the last {count} completed: grid order {grid:.2f}, "
                    f"reversed {reversed_:.2f}"
                )


if __name__ == "__main__":
    main()
