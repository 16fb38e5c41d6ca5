"""The dQ cast beside the main kernel (the polled cast, ``plan.cast_sms``) against the cast after
it, at any head dim (session 50 shipped it at ``hopper.POLLED_CAST_HEADDIMS``; this probe also
times the head dims it does not ship at). For each config the deterministic backward is captured
twice (``bwd_probe.capture``): once with the head dim in ``POLLED_CAST_HEADDIMS`` ("beside"),
once with it out ("after"). Their gradients are compared with ``torch.equal`` (the tables are
order-invariant, so fewer workers keep the bits), both repeat bitwise, and both are timed in
interleaved rounds beside FA4-det (``fwd_probe.time_contenders``).

``--tail`` adds a third side: the plan on every worker (the "after" plan) with the polled cast
all the same. The cast's CTAs then find no free SM until the main kernel's CTAs end (the
programmatic launch waits for every main CTA to have started, so none of them can be kept off
an SM by a waiting cast CTA); they cast the tiles done by then in the main kernel's tail, where
a static schedule's shorter workers or dynamic dispatch's last tickets leave SMs idle. A
question for the plans that leave no SMs free (dynamic dispatch; hd 192 and 256 at short
lengths).

``--lean`` adds, where the plan keeps every worker, its tables made on 4 workers fewer with the
cast beside them all the same, and prints how many steps the busiest worker gains (a step or
two of 700-1500 at some hd-192 and hd-256 shapes: less than the cast's time?).

``--pre`` adds, where the plan leaves SMs to the cast, the same plan with the preprocess beside
the main kernel too (``hopper/bwd_pre_beside.py``, session 52: on the free SMs, each Q tile's
rows published by a ready flag that the main kernel's producer waits for), as "pre": against
"beside" it times the ~40 us preprocess moved off the main kernel's start.

A config is ``headdim:seqlen:full|causal``, on the sweep's grid (16384 tokens, the heads of
``targets_table.SWEEP_HEADS``). A config whose plan leaves no SMs to the cast even with its head
dim listed (its busiest worker would get more steps, or the schedule is dynamic) is reported and
skipped without ``--tail`` or ``--lean``. On the GPU machine, from the repository root (the
CuTe-DSL/FA4 kit sourced):

    python3 -m tools.hopper.polled_cast_ab --rounds 15 96:2048:full 128:16384:causal
    python3 -m tools.hopper.polled_cast_ab --tail 256:1024:full 64:16384:full
    python3 -m tools.hopper.polled_cast_ab --pre 64:2048:full 128:4096:full
"""

from __future__ import annotations

import argparse
import dataclasses
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
    parser.add_argument(
        "--tail", action="store_true",
        help="also time the plan on every worker with the polled cast launched beside it",
    )  # fmt: skip
    parser.add_argument(
        "--lean", action="store_true",
        help="where the plan keeps every worker, also time its tables on 4 workers fewer with "
        "the cast beside them",
    )  # fmt: skip
    parser.add_argument(
        "--pre", action="store_true",
        help="where the plan leaves SMs to the cast, also time it with the preprocess beside "
        "the main kernel too",
    )  # fmt: skip
    return parser.parse_args(argv)


def run_config(  # pragma: no cover - GPU
    cfg: Config,
    rounds: int,
    repeats: int,
    tail: bool = False,
    lean: bool = False,
    pre: bool = False,
) -> None:
    import torch
    from flash_attn.cute import flash_attn_func as fa4

    from dash_attn import last_launch_info
    from dash_attn import plan as plan_module
    from dash_attn.backends.hopper import launch as hopper_launch
    from dash_attn.schedule import Dispatch
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
    sides = {"after": after}
    if tail:
        # The plan on every worker with the polled cast launched as its programmatic dependent:
        # the cast's CTAs get an SM only as the main kernel's CTAs end, so they cast the tiles
        # done by then in the main kernel's tail instead of all after it.
        polled = dataclasses.replace(after.plan, cast_sms=1)
        prepared = hopper_launch._prepare(polled, after.leaves[0], pre_beside=False)
        sides["tail"] = after.with_launch(prepared, polled)
    if beside.plan.cast_sms:
        # The preprocess before the main kernel on every side but "pre", whatever
        # PRE_BESIDE_HEADDIMS lists.
        prepared = hopper_launch._prepare(beside.plan, beside.leaves[0], pre_beside=False)
        sides["beside"] = beside.with_launch(prepared)
        if pre:
            # The same plan and kernels but for pre_beside, the preprocess on the free SMs.
            prepared = hopper_launch._prepare(beside.plan, beside.leaves[0], pre_beside=True)
            sides["pre"] = beside.with_launch(prepared)
    elif lean and after.plan.dispatch is Dispatch.STATIC:
        # The plan's own rule with any number of extra steps allowed: the tables on 4 workers
        # fewer even though the busiest worker gets more steps there (how many is printed),
        # the cast beside them on the SMs left free.
        busiest = after.plan.schedule.busiest_worker_steps()
        tables, cast_sms = plan_module._leave_sms_to_the_cast(
            after.plan.schedule, max_extra_steps=busiest
        )
        grown = tables.busiest_worker_steps() - busiest
        print(f"   lean: busiest worker {grown:+d} steps (of {busiest})", flush=True)
        plan = dataclasses.replace(
            after.plan, schedule=tables, grid=plan_module._grid(tables), cast_sms=cast_sms
        )
        prepared = hopper_launch._prepare(plan, after.leaves[0], pre_beside=False)
        sides["lean"] = after.with_launch(prepared, plan)
    if len(sides) == 1:
        print("   skipped: the plan leaves no SMs to the cast", flush=True)
        return
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
        run_config(cfg, args.rounds, args.repeats, args.tail, args.lean, args.pre)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
