"""The busiest worker's load (the DAG model without waits: unit steps, free reductions) of the
hopper backward's plan at every sweep config, on 132 workers (sm_margin=0) and on 128
(sm_margin=4): equal everywhere, so the polled dQ cast can have 4 SMs for free. Session 50,
CPU, from the repository root:
``PYTHONPATH=. python benchmarks/results/h200/session50-5723982/cpu/spare_sms.py``
"""

from __future__ import annotations

from dash_attn.plan import CAUSAL, FULL, H200, Problem, make_backward_plan
from dash_attn.schedule import simulate


def main() -> None:
    for headdim in (64, 128):
        heads = 2048 // headdim
        for mask in (FULL, CAUSAL):
            for seqlen in (512, 1024, 2048, 4096, 8192, 16384):
                problem = Problem(16384 // seqlen, seqlen, seqlen, heads, heads, headdim, mask,
                                  "bfloat16")  # fmt: skip
                runs = []
                for margin in (0, 4):
                    plan = make_backward_plan(problem, device=H200, sm_margin=margin)
                    busiest = simulate(plan.schedule, 1.0, 0.0, ordered=False).makespan
                    runs.append((plan.grid, plan.schedule.name, busiest))
                kind = "causal" if mask.causal else "full"
                print(headdim, kind, seqlen, runs, f"{runs[1][2] / runs[0][2]:.3f}")


if __name__ == "__main__":
    main()
