"""One transformer block, forward + backward, with a pluggable attention function.

How much of the operator-level gain survives in a model: the block is RMSNorm -> QKV projection ->
RoPE -> attention (GQA) -> output projection -> residual -> RMSNorm -> MLP -> residual, written in
plain PyTorch with bf16 weights drawn from a seeded generator (the same weights for every
attention implementation). Shapes (batch 1, causal, seqlen 8k/16k/32k):

* ``llama3-8b``: hidden 4096, 32 query heads, 8 kv heads, head dim 128, SwiGLU MLP 14336.
* ``qwen2.5-7b``: hidden 3584, 28 query heads, 4 kv heads, head dim 128, SwiGLU MLP 18944.
* ``vit-h-like``: full mask, 4096 tokens, batch 16, hidden 1280, GELU MLP 5120, no RoPE. ViT-Huge
  has 16 heads of dimension 80; dash-attn's kernels support head dims 64, 96, 128, 192 and 256
  only, so this block uses 20 heads of dimension 64 (same hidden size, same attention FLOPs per
  token up to the head split).

Timed: ``block(x).backward(dy)`` with ``do_bench`` (median), gradients of x and every weight
cleared between calls. Providers: dash ``auto`` (deterministic), dash ``fa3`` (the deterministic
FA3 order), dash non-deterministic, FA4 deterministic (when it imports and supports the shape).

    python -m dash_attn.bench.e2e [--models llama3-8b] [--seqlens 8192] [--out-dir DIR]
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .providers import BSHD, Case, Provider, ProviderUnavailable, providers_for_case, select
from .report import e2e_table, write_csv
from .timing import Timer, do_bench_ms

E2E_FIELDS = (
    "gpu",
    "sm_count",
    "torch",
    "triton",
    "commit",
    "date",
    "model",
    "seqlen",
    "batch",
    "tokens",
    "hidden",
    "heads",
    "kv_heads",
    "headdim",
    "causal",
    "provider",
    "deterministic",
    "schedule",
    "ms",
    "tokens_per_s",
    "speedup_vs_dash_fa3",
    "note",
)
# Both dash-attn backends (the Triton ones: auto, the FA3-order baseline, non-det; the hopper
# ones: auto, non-det) and FA4's deterministic mode.
E2E_PROVIDERS = (
    "dash_auto", "dash_fa3", "dash_nondet", "dash_hopper_auto", "dash_hopper_nondet", "fa4_det",
)  # fmt: skip
E2E_WARMUP_MS = 100.0
E2E_REP_MS = 400.0  # a 32k-token block takes ~0.1 s: fewer ms would time a single call


@dataclass(frozen=True)
class BlockConfig:
    """Shape of one transformer block."""

    name: str
    hidden: int
    heads: int
    kv_heads: int
    headdim: int
    intermediate: int
    causal: bool
    mlp: str  # "swiglu" or "gelu"
    rope_theta: float | None  # None: no rotary embedding
    note: str = ""


MODELS = {
    "llama3-8b": BlockConfig("llama3-8b", 4096, 32, 8, 128, 14336, True, "swiglu", 500000.0),
    "qwen2.5-7b": BlockConfig("qwen2.5-7b", 3584, 28, 4, 128, 18944, True, "swiglu", 1000000.0),
    "vit-h-like": BlockConfig(
        "vit-h-like",
        1280,
        20,
        20,
        64,
        5120,
        False,
        "gelu",
        None,
        note="ViT-H has 16 heads x 80; dash-attn has no head dim 80, so 20 heads x 64",
    ),  # fmt: skip
}
# (model, seqlen, batch)
E2E_SHAPES = (
    ("llama3-8b", 8192, 1),
    ("llama3-8b", 16384, 1),
    ("llama3-8b", 32768, 1),
    ("qwen2.5-7b", 8192, 1),
    ("qwen2.5-7b", 16384, 1),
    ("qwen2.5-7b", 32768, 1),
    ("vit-h-like", 4096, 16),
)


def quick_shapes() -> list[tuple[str, int, int]]:
    """The smallest shape of each model."""
    first: dict[str, tuple[str, int, int]] = {}
    for shape in E2E_SHAPES:
        if shape[0] not in first or shape[1] < first[shape[0]][1]:
            first[shape[0]] = shape
    return list(first.values())


AttnFn = Callable[[Any, Any, Any], Any]


def make_block(cfg: BlockConfig, device: Any, seed: int) -> Any:
    """A ``torch.nn.Module`` block with seeded bf16 weights; ``block.attn`` is replaceable."""
    import torch
    import torch.nn.functional as F

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            gen = torch.Generator(device=device).manual_seed(seed)
            std = 0.02

            def weight(*shape: int) -> torch.nn.Parameter:
                w = torch.randn(shape, generator=gen, device=device, dtype=torch.float32) * std
                return torch.nn.Parameter(w.to(torch.bfloat16))

            def ones(n: int) -> torch.nn.Parameter:
                return torch.nn.Parameter(torch.ones(n, device=device, dtype=torch.bfloat16))

            qkv = (cfg.heads + 2 * cfg.kv_heads) * cfg.headdim
            self.norm1, self.norm2 = ones(cfg.hidden), ones(cfg.hidden)
            self.wqkv = weight(qkv, cfg.hidden)
            self.wo = weight(cfg.hidden, cfg.heads * cfg.headdim)
            up = 2 * cfg.intermediate if cfg.mlp == "swiglu" else cfg.intermediate
            self.w_up = weight(up, cfg.hidden)
            self.w_down = weight(cfg.hidden, cfg.intermediate)
            self.attn: AttnFn | None = None
            self.rope: tuple[torch.Tensor, torch.Tensor] | None = None

        def rotary(self, seqlen: int) -> tuple[torch.Tensor, torch.Tensor]:
            if self.rope is None or self.rope[0].shape[0] != seqlen:
                half = cfg.headdim // 2
                exponent = torch.arange(half, device=device, dtype=torch.float32) / half
                inv = 1.0 / (cfg.rope_theta**exponent)
                angles = torch.outer(torch.arange(seqlen, device=device, dtype=torch.float32), inv)
                # (seqlen, 1, headdim): broadcast over batch and heads of (b, s, h, d)
                cos = torch.cat([angles.cos(), angles.cos()], dim=-1)[:, None, :]
                sin = torch.cat([angles.sin(), angles.sin()], dim=-1)[:, None, :]
                self.rope = (cos, sin)
            return self.rope

        def apply_rope(self, x: torch.Tensor) -> torch.Tensor:
            cos, sin = self.rotary(x.shape[1])
            x1, x2 = x.float().chunk(2, dim=-1)
            rotated = torch.cat([-x2, x1], dim=-1)
            return (x.float() * cos + rotated * sin).to(x.dtype)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, s, _ = x.shape
            h = F.rms_norm(x, (cfg.hidden,), self.norm1)
            qkv = F.linear(h, self.wqkv)
            q, k, v = qkv.split(
                [cfg.heads * cfg.headdim, cfg.kv_heads * cfg.headdim, cfg.kv_heads * cfg.headdim],
                dim=-1,
            )
            q = q.view(b, s, cfg.heads, cfg.headdim)
            k = k.view(b, s, cfg.kv_heads, cfg.headdim)
            v = v.reshape(b, s, cfg.kv_heads, cfg.headdim)
            if cfg.rope_theta is not None:
                q, k = self.apply_rope(q), self.apply_rope(k)
            else:
                q, k = q.contiguous(), k.contiguous()
            assert self.attn is not None, "set block.attn before calling the block"
            o = self.attn(q, k, v.contiguous())
            x = x + F.linear(o.reshape(b, s, cfg.heads * cfg.headdim), self.wo)
            h = F.rms_norm(x, (cfg.hidden,), self.norm2)
            up = F.linear(h, self.w_up)
            if cfg.mlp == "swiglu":
                gate, up = up.chunk(2, dim=-1)
                act = F.silu(gate) * up
            else:
                act = F.gelu(up, approximate="tanh")
            return x + F.linear(act, self.w_down)

    return Block()


def e2e_providers(case: Case, workers: int) -> list[Provider]:
    """E2E_PROVIDERS that can run this case, in the flash-attn layout (GQA native)."""
    everything = providers_for_case(case, workers)
    return [p for name in E2E_PROVIDERS for p in everything if p.name == name and p.layout == BSHD]


def run_e2e(
    *,
    meta: dict[str, Any],
    patterns: Sequence[str] | None,
    quick: bool,
    seed: int,
    device: Any,
    workers: int,
    deadline: Any = None,
    skips: Any = None,
    shapes: Sequence[tuple[str, int, int]] | None = None,
    timer: Timer = do_bench_ms,
    warmup: float = E2E_WARMUP_MS,
    rep: float = E2E_REP_MS,
    models: Mapping[str, BlockConfig] = MODELS,
    make_providers: Callable[[Case, int], list[Provider]] = e2e_providers,
) -> list[dict[str, Any]]:
    """Time the block for every shape and provider; returns the rows of e2e.csv.

    ``timer``, ``models`` and ``make_providers`` are replaceable for the CPU tests."""
    import torch

    from .timing import cleanup, gpu_alive, launched_schedule, short_reason

    if shapes is None:
        shapes = quick_shapes() if quick else list(E2E_SHAPES)
    rows: list[dict[str, Any]] = []
    for model_name, seqlen, batch in shapes:
        if deadline is not None and not deadline.allows("report"):
            print("deadline reached: e2e cut short")
            break
        cfg = models[model_name]
        case = Case(batch, seqlen, cfg.heads, cfg.kv_heads, cfg.headdim, cfg.causal)
        block = make_block(cfg, device, seed)
        gen = torch.Generator(device=device).manual_seed(seed + 1)
        x = torch.randn(
            (batch, seqlen, cfg.hidden), generator=gen, device=device, dtype=torch.bfloat16
        ).requires_grad_()
        dy = torch.randn(x.shape, generator=gen, device=device, dtype=torch.bfloat16)
        leaves = [x, *block.parameters()]
        providers = make_providers(case, workers)
        if patterns:
            providers = select(providers, patterns)
        shape_rows: list[dict[str, Any]] = []
        for provider in providers:
            try:
                block.attn = provider.make(case, device)

                def step(block: Any = block, x: Any = x, dy: Any = dy) -> None:
                    block(x).backward(dy)

                ms = timer(step, warmup, rep, leaves)
                schedule = launched_schedule(provider, "fwd_bwd")
            except Exception as exc:  # noqa: BLE001 - e.g. FA4 without deterministic GQA
                reason = short_reason(exc)
                if skips is not None:
                    skips.add("e2e", provider.name, f"{model_name} s{seqlen}", reason, print)
                else:
                    print(f"  skip {provider.name} ({model_name} s{seqlen}): {reason}")
                for p in leaves:
                    p.grad = None
                cleanup(device)
                if not isinstance(exc, ProviderUnavailable) and not gpu_alive(device):
                    print("the CUDA context is broken: stopping e2e")
                    return rows
                continue
            for p in leaves:
                p.grad = None
            shape_rows.append(
                {
                    **meta,
                    "model": model_name,
                    "seqlen": seqlen,
                    "batch": batch,
                    "tokens": batch * seqlen,
                    "hidden": cfg.hidden,
                    "heads": cfg.heads,
                    "kv_heads": cfg.kv_heads,
                    "headdim": cfg.headdim,
                    "causal": cfg.causal,
                    "provider": provider.name,
                    "deterministic": provider.deterministic,
                    "schedule": schedule,
                    "ms": ms,
                    "tokens_per_s": batch * seqlen / (ms * 1e-3),
                    "note": cfg.note,
                }
            )
        base = next((r["ms"] for r in shape_rows if r["provider"] == "dash_fa3"), None)
        for r in shape_rows:
            r["speedup_vs_dash_fa3"] = None if base is None else base / r["ms"]
        rows.extend(shape_rows)
        times = "  ".join(f"{r['provider']} {r['ms']:.1f} ms" for r in shape_rows)
        print(f"  {model_name} seqlen {seqlen} batch {batch}: {times}", flush=True)
        del block, x, dy, leaves
        cleanup(device)
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m dash_attn.bench.e2e",
        description="Forward + backward of one transformer block with each attention provider.",
        allow_abbrev=False,
    )
    parser.add_argument("--models", default=",".join(MODELS), help="comma list of models")
    parser.add_argument("--seqlens", default=None, help="comma list (default: each model's own)")
    parser.add_argument("--providers", default=None, help="comma list or patterns")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out-dir", type=Path, default=None)
    args = parser.parse_args(argv)

    from .runinfo import gpu_slug, machine_info

    info = machine_info()
    if not info["cuda_available"]:
        print("no CUDA GPU: the end-to-end block needs one")
        return 1
    import torch

    models = args.models.split(",")
    unknown = [m for m in models if m not in MODELS]
    if unknown:
        parser.error(f"--models: unknown {unknown}; choose from {list(MODELS)}")
    shapes = [s for s in (quick_shapes() if args.quick else E2E_SHAPES) if s[0] in models]
    if args.seqlens:
        wanted = {int(x) for x in args.seqlens.split(",")}
        shapes = [s for s in shapes if s[1] in wanted]
    meta = {k: info[k] for k in ("gpu", "sm_count", "torch", "triton", "commit", "date")}
    rows = run_e2e(
        meta=meta,
        patterns=args.providers.split(",") if args.providers else None,
        quick=args.quick,
        seed=args.seed,
        device=torch.device("cuda"),
        workers=int(info["sm_count"]),
        shapes=shapes,
    )
    out_dir = args.out_dir or Path("benchmarks") / "results" / gpu_slug(str(info["gpu"]))
    out_dir.mkdir(parents=True, exist_ok=True)
    write_csv(out_dir / "e2e.csv", rows, E2E_FIELDS)
    print(e2e_table(rows))
    return 0 if rows else 1


if __name__ == "__main__":
    raise SystemExit(main())
