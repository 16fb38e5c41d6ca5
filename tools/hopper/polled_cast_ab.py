"""The dQ cast beside the main kernel (the polled cast, ``plan.cast_sms``) against the cast after
it, at any head dim (session 50 shipped it at ``hopper.POLLED_CAST_HEADDIMS``; this probe also
times the head dims it does not ship at). For each config the deterministic backward is captured
twice (``bwd_probe.capture``): once with the head dim in ``POLLED_CAST_HEADDIMS`` ("beside"),
once with it out ("after"). Their gradients are compared with ``torch.equal`` (the tables are
order-invariant, so fewer workers keep the bits), both repeat bitwise, and both are timed in
interleaved rounds beside FA4-det (``fwd_probe.time_contenders``).

A config is ``headdim:seqlen:full|causal``, on the sweep's grid (16384 tokens, the heads of
``targets_table.SWEEP_HEADS``). A config whose plan leaves no SMs to the cast even with its head
dim listed (its busiest worker would get more steps, or the schedule is dynamic) is reported and
skipped. On the GPU machine, from the repository root (the CuTe-DSL/FA4 kit sourced):

    python3 -m tools.hopper.polled_cast_ab --rounds 15 96:2048:full 128:16384:causal

(The probe's other sides, sessions 51-52's, lost in session 55's H200 run and were removed; they
are in git history at f076920.)
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

from tools.targets_table import SWEEP_HEADS

TOKENS = 16384


@dataclass(frozen=True)
class Config:
    """One sweep shape: ``batch x seqlen x heads`` at ``headdim``."""

    headdim: int
    seqlen: int
    causal: bool

    @property
    def heads(self) -> int:
        return SWEEP_HEADS[self.headdim]

    @property
    def batch(self) -> int:
        return TOKENS // self.seqlen

    @property
    def label(self) -> str:
        mask = "causal" if self.causal else "full"
        return f"d{self.headdim} {mask} {self.seqlen} b{self.batch} h{self.heads}"


def parse_config(text: str) -> Config:
    """``headdim:seqlen:full|causal`` on the sweep's grid.

    >>> parse_config("96:2048:causal")
    Config(headdim=96, seqlen=2048, causal=True)
    >>> parse_config("96:2048:causal").label
    'd96 causal 2048 b8 h32'
    """
    parts = text.split(":")
    if len(parts) != 3 or parts[2] not in ("full", "causal"):
        raise ValueError(f"a config is headdim:seqlen:full|causal, got {text!r}")
    headdim, seqlen = int(parts[0]), int(parts[1])
    if headdim not in SWEEP_HEADS:
        raise ValueError(f"head dim must be one of {sorted(SWEEP_HEADS)}, got {text!r}")
    if seqlen < 1 or TOKENS % seqlen:
        raise ValueError(f"seqlen must divide {TOKENS} tokens, got {text!r}")
    return Config(headdim, seqlen, parts[2] == "causal")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("configs", nargs="+", type=parse_config, help="headdim:seqlen:mask")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--repeats", type=int, default=3, help="bitwise repeats of each side")
    return parser.parse_args(argv)


def run_config(cfg: Config, rounds: int, repeats: int) -> None:  # pragma: no cover - GPU
    import torch
    from flash_attn.cute import flash_attn_func as fa4

    from dash_attn import last_launch_info
    from dash_attn import plan as plan_module
    from dash_attn.backends.hopper import launch as hopper_launch
    from tools.hopper.bwd_probe import capture
    from tools.hopper.fwd_probe import time_contenders

    gen = torch.Generator(device="cuda").manual_seed(cfg.seqlen + cfg.headdim)
    shape = (cfg.batch, cfg.seqlen, cfg.heads, cfg.headdim)
    qkv = [torch.randn(shape, generator=gen, device="cuda", dtype=torch.bfloat16) for _ in "qkv"]
    dout = torch.randn_like(qkv[0])

    def leaves() -> list[torch.Tensor]:
        return [t.detach().clone().requires_grad_() for t in qkv]

    def captured(headdims: tuple[int, ...]) -> Any:
        shipped = plan_module.POLLED_CAST_HEADDIMS
        plan_module.POLLED_CAST_HEADDIMS = headdims
        plan_module.make_backward_plan.cache_clear()
        try:
            return capture(leaves(), dout, causal=cfg.causal, deterministic=True)
        finally:
            plan_module.POLLED_CAST_HEADDIMS = shipped
            plan_module.make_backward_plan.cache_clear()

    others = tuple(d for d in plan_module.POLLED_CAST_HEADDIMS if d != cfg.headdim)
    beside = captured((*others, cfg.headdim))
    after = captured(others)
    name = beside.plan.schedule.name
    print(f"== {cfg.label}: {name}, cast_sms {beside.plan.cast_sms} / {after.plan.cast_sms}, "
          f"grids {beside.plan.grid} / {after.plan.grid}", flush=True)  # fmt: skip
    if beside.plan.cast_sms == 0:
        print("   skipped: the plan leaves no SMs to the cast", flush=True)
        return
    sides = {"after": after, "beside": beside}
    first = after.backward()
    # Each side must run its own captured launch, not one the backward prepared afresh.
    own = True
    for side in sides.values():
        side.backward()
        entry = hopper_launch._launches.get(side.key)
        own &= last_launch_info() is side.plan and entry is not None and entry[1] is side.launch
    same = all(
        all(torch.equal(a, b) for a, b in zip(first, side.backward(), strict=True))
        for side in sides.values()
        for _ in range(repeats)
    )
    print(f"check: own launches {own}; {' / '.join(sides)} equal to after (dq dk dv), "
          f"{repeats} repeats each: {same}", flush=True)  # fmt: skip
    peer = leaves()
    out = fa4(*peer, causal=cfg.causal, deterministic=True)
    out = out[0] if isinstance(out, tuple) else out
    fns = {key: side.backward for key, side in sides.items()}
    fns["F"] = lambda: torch.autograd.grad(out, peer, dout, retain_graph=True)
    time_contenders(fns, rounds, f"{cfg.label} (ms per backward)")


def main(argv: list[str] | None = None) -> int:  # pragma: no cover - needs an sm_90 GPU
    args = parse_args(argv)
    for cfg in args.configs:
        run_config(cfg, args.rounds, args.repeats)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
