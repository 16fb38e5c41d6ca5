"""Session 50: the polled dQ cast against the cast after the kernel at long static causal rows
(call 2's A/B stopped at 8k; the call-3 sweep read d128 causal 16k at 0.98x FA4-det with it).
For each config the deterministic backward is captured twice, with the plan's cast_sms and with
``POLLED_CAST_HEADDIMS`` emptied, their gradients compared (``torch.equal``), and both timed in
interleaved rounds beside FA4-det. On the GPU machine, from the repository root:
``python3 benchmarks/results/h200/session50-5723982/next-not-run/cast16k_ab.py [rounds]``
"""

from __future__ import annotations

import sys

import torch
from flash_attn.cute import flash_attn_func as fa4

from dash_attn import plan as plan_module
from tools.hopper.bwd_probe import capture
from tools.hopper.fwd_probe import time_contenders

CONFIGS = ((128, 16384), (64, 16384), (128, 8192))  # (head dim, seqlen), causal, 16k tokens


def main(rounds: int) -> None:
    for head_dim, seqlen in CONFIGS:
        heads, batch = 2048 // head_dim, 16384 // seqlen
        gen = torch.Generator(device="cuda").manual_seed(seqlen + head_dim)
        q, k, v = (
            torch.randn((batch, seqlen, heads, head_dim), generator=gen, device="cuda",
                        dtype=torch.bfloat16)
            for _ in range(3)
        )  # fmt: skip
        dout = torch.randn_like(q)

        def leaves(qkv: tuple[torch.Tensor, ...] = (q, k, v)) -> list[torch.Tensor]:
            return [t.detach().clone().requires_grad_() for t in qkv]

        plan_module.make_backward_plan.cache_clear()
        beside = capture(leaves(), dout, causal=True, deterministic=True)
        shipped = plan_module.POLLED_CAST_HEADDIMS
        plan_module.POLLED_CAST_HEADDIMS = ()
        plan_module.make_backward_plan.cache_clear()
        try:
            after = capture(leaves(), dout, causal=True, deterministic=True)
        finally:
            plan_module.POLLED_CAST_HEADDIMS = shipped
            plan_module.make_backward_plan.cache_clear()
        same = all(torch.equal(a, b) for a, b in zip(beside.backward(), after.backward(),
                                                      strict=True))  # fmt: skip
        print(f"== d{head_dim} causal {seqlen}: cast_sms {beside.plan.cast_sms} / "
              f"{after.plan.cast_sms}, grids {beside.plan.grid} / {after.plan.grid}, "
              f"equal {same}", flush=True)  # fmt: skip
        peer = leaves()
        out = fa4(*peer, causal=True, deterministic=True)
        out = out[0] if isinstance(out, tuple) else out
        fns = {
            "after": after.backward,
            "beside": beside.backward,
            "F": lambda out=out, peer=peer, dout=dout: torch.autograd.grad(
                out, peer, dout, retain_graph=True
            ),
        }
        time_contenders(fns, rounds, f"d{head_dim} causal {seqlen} (ms per backward)")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 20)
