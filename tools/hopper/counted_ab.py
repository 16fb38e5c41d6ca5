"""The counted non-deterministic hopper backward against the kernel without turns (session 59).

A counted kernel (``hopper.counted_nondet_twin``, ``HopperAttnBwd``'s nondet_first_store) stores
each dQ tile's first partial, adds the others in arrival order once that store has landed and
counts every add on the tile's semaphore, so its backward needs no zero fill of the dQ
accumulator and its plan leaves SMs to the dQ cast beside it, as a deterministic backward's
does. For each config:

- the shipped deterministic backward (``S``) is captured, the non-deterministic one on the
  kernel without turns (``ND``, ``bwd_probe.nondet_kernels(counted=False)``: the kernels shipped
  before session 59) and on the counted one (``NC``, ``counted=True``), each a call of its own
  (their plans differ: ``cast_sms``);
- ``NC``'s dk and dv (each chain's own order) must equal ``ND``'s bit for bit, and all three
  meet the flash-attn rule (up to ``--rule-max`` tokens);
- the three are timed in interleaved rounds beside FA4's non-det backward (``FN``): medians and
  per-round ratios against ``ND``.

On the GPU machine, from the repository root (the CuTe-DSL/FA4 kit sourced):

    python3 -m tools.hopper.counted_ab --headdim 64 --rounds 12 512:full 2048:causal 4096:full

Configs as ``variant_ab``'s (``seqlen:mask[:kv_heads]``, the sweep's shapes).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from tools.hopper.variant_ab import Config, config_inputs, parse_config, replay


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("configs", nargs="+", help="seqlen:full|causal[:kv_heads]")
    parser.add_argument("--headdim", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--rule-max", type=int, default=4096, help="longest seqlen checked")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds must be >= 1, got {args.rounds}")
    args.configs = [parse_config(text, args.headdim) for text in args.configs]
    return args


def run_config(cfg: Config, args: argparse.Namespace) -> None:  # pragma: no cover - GPU
    """The checks and the timed rounds of one config, printed."""
    import torch
    from flash_attn.cute import flash_attn_func as fa4

    from tools.hopper.bwd_probe import capture, grad_verdict, nondet_kernels
    from tools.hopper.fwd_probe import time_contenders

    hd = args.headdim
    q, k, v, dout, refs = config_inputs(cfg, hd, args.rule_max, seed=59)

    def leaves() -> list[torch.Tensor]:
        return [t.detach().clone().requires_grad_() for t in (q, k, v)]

    runs = {"S": capture(leaves(), dout, causal=cfg.causal, deterministic=True)}
    for tag, counted in (("ND", False), ("NC", True)):
        with nondet_kernels(counted):
            runs[tag] = capture(leaves(), dout, causal=cfg.causal, deterministic=False)
    plans = {tag: run.plan for tag, run in runs.items()}
    print(
        f"== d{hd} {cfg.label}: "
        + "; ".join(
            f"{tag} {p.schedule.name} {p.dispatch.name} grid {p.grid} cast_sms {p.cast_sms}"
            for tag, p in plans.items()
        ),
        flush=True,
    )
    got = {}
    for tag, captured in runs.items():
        got[tag] = [t.clone() for t in captured.backward()]
        line = f"check {tag}:"
        if refs is not None:
            line += f" {grad_verdict(tag, got[tag], *refs)};"
        if tag == "S":
            again = captured.backward()
            line += f" repeats bitwise {all(map(torch.equal, got[tag], again))};"
        if tag == "NC":
            same = all(torch.equal(a, b) for a, b in zip(got["NC"][1:], got["ND"][1:], strict=True))
            line += f" dk dv equal to ND {same}"
        print(line, flush=True)
    del refs, got
    peer_leaves = leaves()
    out = fa4(*peer_leaves, causal=cfg.causal, deterministic=False)
    out = out[0] if isinstance(out, tuple) else out
    fns: dict[str, Callable[[], object]] = {tag: runs[tag].backward for tag in ("ND", "NC", "S")}
    fns["FN"] = replay(out, peer_leaves, dout)
    time_contenders(fns, args.rounds, f"ab counted d{hd} {cfg.label} (ms per backward)")
    del runs, fns
    torch.cuda.empty_cache()


def main(argv: list[str] | None = None) -> int:  # pragma: no cover - needs an sm_90 GPU
    args = parse_args(argv)
    for cfg in args.configs:
        run_config(cfg, args)
    print("done")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
