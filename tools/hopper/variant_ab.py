"""A hopper backward kernel variant against the shipped one on the same tables (sessions 45-47
copied this probe per change; this is it once). For each config the shipped deterministic and
non-deterministic backwards are captured (``bwd_probe.capture``), then prepared again for the
variant named ``<shipped variant><suffix>`` (``bwd_launch.VARIANTS``), and

- each variant's gradients are compared with ``torch.equal`` to the shipped kernel's (det: dq,
  dk, dv; non-det: dk and dv, whose order is the chain's; dq is added in arrival order), for a
  variant meant to keep the bits (``--bits same``; ``--bits rule`` checks the variant by the
  flash-attn rule instead);
- det runs repeat bitwise, the shipped kernels meet the rule (up to ``--rule-max`` tokens);
- det and non-det are timed in interleaved rounds beside FA4-det and FA4 non-det
  (``fwd_probe.time_contenders``: medians and per-round ratios).

On the GPU machine, from the repository root (the CuTe-DSL/FA4 kit sourced):

    python3 -m tools.hopper.variant_ab --suffix _tma --rounds 40 1024:full 2048:causal 1000:full:8

``--variant-sm-margin 4`` runs the variant's calls on 4 SMs fewer (session 50 timed the polled dQ
cast this way, then named ``<shipped>_ct``; since it shipped, a deterministic plan whose
``cast_sms`` is set runs any variant with it, and a plan made with ``sm_margin`` never does).

``--replace OLD=NEW`` names the variant ``<shipped>.replace(OLD, NEW)`` first (``--replace
_st=`` times the shipped kernels against themselves without ``dkv_stage``); an empty suffix and
no replacement is an A/A.

``--tiles 64x128`` runs the variant on a plan of its own with other tiles (its schedule tables
built for them, the kernel compiled for them; ``bwd_probe.backward_tiles``): other bits, so
check it with ``--bits rule``. With it alone the variant is the shipped kernel on those tiles.

A config is ``seqlen:mask[:kv_heads]`` at ``--headdim`` (the sweep's shapes: batch 16384 //
seqlen, 2048 // headdim heads; a seqlen that is not a power of two runs batch 3).
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Config:
    """One A/B shape: ``batch x seqlen x heads`` queries against ``kv_heads`` key heads."""

    seqlen: int
    causal: bool
    batch: int
    heads: int
    kv_heads: int

    @property
    def label(self) -> str:
        mask = "causal" if self.causal else "full"
        return f"{mask} {self.seqlen} b{self.batch} h{self.heads}/{self.kv_heads}"


def parse_config(text: str, head_dim: int) -> Config:
    """``seqlen:mask[:kv_heads]`` at ``head_dim``.

    >>> parse_config("1024:full", 64)
    Config(seqlen=1024, causal=False, batch=16, heads=32, kv_heads=32)
    >>> parse_config("1000:causal:8", 64).batch
    3
    """
    parts = text.split(":")
    if len(parts) not in (2, 3) or parts[1] not in ("full", "causal"):
        raise ValueError(f"a config is seqlen:full|causal[:kv_heads], got {text!r}")
    seqlen = int(parts[0])
    if seqlen < 1:
        raise ValueError(f"seqlen must be positive, got {text!r}")
    heads = 2048 // head_dim
    kv_heads = int(parts[2]) if len(parts) == 3 else heads
    if kv_heads < 1 or heads % kv_heads:
        raise ValueError(f"kv_heads must divide the {heads} heads, got {text!r}")
    batch = 16384 // seqlen if seqlen & (seqlen - 1) == 0 and seqlen <= 16384 else 3
    return Config(seqlen, parts[1] == "causal", batch, heads, kv_heads)


def parse_tiles(text: str) -> tuple[int, int]:
    """``BMxBN`` as (block_m, block_n).

    >>> parse_tiles("64x128")
    (64, 128)
    """
    parts = text.lower().split("x")
    if len(parts) != 2 or not all(part.isdigit() and int(part) > 0 for part in parts):
        raise argparse.ArgumentTypeError(f"tiles are BMxBN (e.g. 64x128), got {text!r}")
    return int(parts[0]), int(parts[1])


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("configs", nargs="+", help="seqlen:full|causal[:kv_heads]")
    parser.add_argument("--suffix", default=None, help="variant = shipped variant + suffix")
    parser.add_argument(
        "--replace", default=None, metavar="OLD=NEW",
        help="variant = shipped variant with OLD replaced by NEW (then the suffix)",
    )  # fmt: skip
    parser.add_argument("--headdim", type=int, default=64)
    parser.add_argument(
        "--variant-sm-margin", type=int, default=0, metavar="N",
        help="run the variant's calls with sm_margin=N (its plan on N workers fewer; the "
        "order-invariant tables keep the bits)",
    )  # fmt: skip
    parser.add_argument(
        "--tiles", type=parse_tiles, default=None, metavar="BMxBN",
        help="run the variant with block_m x block_n tiles on a plan of its own",
    )  # fmt: skip
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--bits", choices=("same", "rule"), default="same")
    parser.add_argument("--rule-max", type=int, default=4096, help="longest seqlen checked")
    args = parser.parse_args(argv)
    if args.suffix is None and args.replace is None and args.tiles is None:
        parser.error("name the variant: --suffix, --replace and/or --tiles")
    if args.tiles is not None and args.variant_sm_margin:
        parser.error("--tiles and --variant-sm-margin: one at a time")
    if args.variant_sm_margin < 0:
        parser.error(f"--variant-sm-margin must be >= 0, got {args.variant_sm_margin}")
    if args.replace is not None and "=" not in args.replace:
        parser.error(f"--replace takes OLD=NEW, got {args.replace!r}")
    args.configs = [parse_config(text, args.headdim) for text in args.configs]
    return args


def variant_name(shipped: str, args: argparse.Namespace) -> str:
    """The variant a shipped kernel is timed against (``--replace``, then ``--suffix``).

    >>> variant_name("t128_a_st", parse_args(["--replace", "_st=", "1024:full"]))
    't128_a'
    >>> variant_name("t128_a_st", parse_args(["--suffix", "_tma", "1024:full"]))
    't128_a_st_tma'
    """
    if args.replace is not None:
        old, new = args.replace.split("=", 1)
        if old not in shipped:
            raise ValueError(f"--replace: {old!r} is not in the shipped variant {shipped!r}")
        shipped = shipped.replace(old, new)
    return shipped + (args.suffix or "")


def variant_label(args: argparse.Namespace) -> str:
    """How the report names the variant."""
    label = "<shipped>"
    if args.replace is not None:
        old, new = args.replace.split("=", 1)
        label += f".replace({old!r}, {new!r})"
    label += args.suffix or ""
    if args.tiles is not None:
        label += " on {}x{} tiles".format(*args.tiles)
    return label


def run(args: argparse.Namespace) -> None:  # pragma: no cover - needs an sm_90 GPU
    for cfg in args.configs:
        run_config(cfg, args)
    print("done")


def run_config(cfg: Config, args: argparse.Namespace) -> None:  # pragma: no cover - GPU
    """The checks and the timed rounds of one config, printed."""
    import torch
    from flash_attn.cute import flash_attn_func as fa4

    from tools.hopper.bwd_probe import backward_tiles, capture, grad_verdict, variant_launch
    from tools.hopper.fwd_probe import time_contenders

    hd = args.headdim
    q, k, v, dout, refs = config_inputs(cfg, hd, args.rule_max)
    runs = {}
    for base, det in (("S", True), ("ND", False)):
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        runs[base] = capture(leaves, dout, causal=cfg.causal, deterministic=det)
        # The variant on the shipped call's plan, or on its own call with SMs left free or
        # with other tiles.
        own = runs[base]
        tiles = contextlib.nullcontext()
        if args.tiles is not None:
            tiles = backward_tiles(hd, cfg.causal, *args.tiles)
        with tiles:
            if args.variant_sm_margin or args.tiles is not None:
                leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
                own = capture(leaves, dout, causal=cfg.causal, deterministic=det,
                              sm_margin=args.variant_sm_margin)  # fmt: skip
            prepared = variant_launch(own.plan, leaves[0], lambda n: variant_name(n, args))
        runs[base + "_v"] = own.with_launch(prepared)
    det_plan, nondet_plan = runs["S"].plan, runs["ND"].plan
    print(
        f"== d{hd} {cfg.label}: det {det_plan.schedule.name} {det_plan.dispatch.name}, "
        f"non-det {nondet_plan.schedule.name} {nondet_plan.dispatch.name}; variant "
        f"{variant_label(args)}",
        flush=True,
    )
    first: dict[str, list[torch.Tensor]] = {}
    for tag, captured in runs.items():
        got = [t.clone() for t in captured.backward()]
        base, det = tag.partition("_")[0], captured.plan.deterministic
        line = f"check {tag}:"
        if refs is not None and (tag == base or args.bits == "rule"):
            line += f" {grad_verdict(tag, got, *refs)};"
        if det:
            again = captured.backward()
            same = all(torch.equal(a, b) for a, b in zip(got, again, strict=True))
            line += f" repeats bitwise {same};"
        if base in first and args.bits == "same":
            # Non-det dq is added in arrival order: only dk and dv can be compared.
            skip = 0 if det else 1
            pairs = zip(got[skip:], first[base][skip:], strict=True)
            which = "dq dk dv" if det else "dk dv"
            line += f" equal to {base} ({which}) {all(torch.equal(a, b) for a, b in pairs)}"
        first.setdefault(base, got)
        print(line, flush=True)
    del refs, first
    peers = {}
    for tag, det in (("F", True), ("FN", False)):
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        out = fa4(*leaves, causal=cfg.causal, deterministic=det)
        out = out[0] if isinstance(out, tuple) else out
        peers[tag] = replay(out, leaves, dout)
    for mode, base, peer in (("det", "S", "F"), ("nondet", "ND", "FN")):
        fns = {base: runs[base].backward, base + "_v": runs[base + "_v"].backward}
        fns[peer] = peers[peer]
        time_contenders(fns, args.rounds, f"ab {mode} d{hd} {cfg.label} (ms per backward)")
    del runs, peers
    torch.cuda.empty_cache()


def config_inputs(
    cfg: Config, head_dim: int, rule_max: int, seed: int = 0
) -> tuple[Any, Any, Any, Any, Any]:  # pragma: no cover - GPU
    """q, k, v, dout of ``cfg`` in bf16 on the GPU (random, seeded by the config and ``seed``)
    and the two sides of the flash-attn rule for them (``bwd_probe.grad_references``; None
    past ``rule_max`` tokens)."""
    import torch

    from tools.hopper.bwd_probe import grad_references

    dev = torch.device("cuda", 0)
    gen = torch.Generator(device=dev).manual_seed(cfg.seqlen + head_dim + seed)
    q, k, v = (
        torch.randn((cfg.batch, cfg.seqlen, heads, head_dim), generator=gen, device=dev,
                    dtype=torch.bfloat16)
        for heads in (cfg.heads, cfg.kv_heads, cfg.kv_heads)
    )  # fmt: skip
    dout = torch.randn_like(q)
    refs = None
    if cfg.seqlen <= rule_max:
        refs = grad_references(q, k, v, dout, causal=cfg.causal)
    torch.cuda.empty_cache()
    return q, k, v, dout, refs


def replay(out: Any, leaves: list[Any], dout: Any) -> Callable[[], object]:  # pragma: no cover
    """A peer's backward, callable again (its graph kept)."""
    import torch

    return lambda: torch.autograd.grad(out, leaves, dout, retain_graph=True)


def main(argv: list[str] | None = None) -> int:
    run(parse_args(argv))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
