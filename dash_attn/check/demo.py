"""``dash-attn check``: the determinism checker on a tiny random-init Llama (transformers), once
with ``attn_implementation="sdpa"`` (PyTorch's flash / memory-efficient backward adds dQ with
atomics: not reproducible, so the checker should name the attention) and once with ``"dash"``
(clean). Needs a CUDA GPU and transformers.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported by the command only once it knows it can run
    import torch

    from .compare import DeterminismReport

PROG = "dash-attn check"
IMPLEMENTATIONS = ("sdpa", "dash")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Run one training step of a tiny random-init Llama twice from the same "
        "state and report the first module whose output or gradient differs bitwise, with "
        "attn_implementation='sdpa' and 'dash'. Needs a CUDA GPU and transformers.",
        allow_abbrev=False,
    )
    p.add_argument("--attn", choices=[*IMPLEMENTATIONS, "both"], default="both")
    p.add_argument("--seqlen", type=int, default=2048, help="tokens per sequence (default 2048)")
    p.add_argument("--batch", type=int, default=2, help="sequences per batch (default 2)")
    p.add_argument("--layers", type=int, default=2, help="decoder layers (default 2)")
    p.add_argument("--hidden", type=int, default=512, help="hidden size (default 512)")
    p.add_argument("--heads", type=int, default=8, help="query heads (default 8)")
    p.add_argument("--kv-heads", type=int, default=2, help="key/value heads (default 2)")
    p.add_argument("--head-dim", type=int, default=64, help="head dimension (default 64)")
    p.add_argument("--steps", type=int, default=1, help="training steps per run (default 1)")
    p.add_argument("--seed", type=int, default=0, help="weights and tokens seed (default 0)")
    p.add_argument(
        "--plot",
        type=Path,
        metavar="PREFIX",
        help="write PREFIX-sdpa.png and PREFIX-dash.png (where the differences appear)",
    )
    return p


def _positive(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    for name in ("seqlen", "batch", "layers", "hidden", "heads", "kv_heads", "head_dim", "steps"):
        if getattr(args, name) < 1:
            parser.error(f"argument --{name.replace('_', '-')}: must be >= 1")
    if args.heads % args.kv_heads:
        parser.error(f"argument --kv-heads: {args.kv_heads} does not divide --heads {args.heads}")


def run_demo(
    args: argparse.Namespace, attn: str, device: str = "cuda", dtype: torch.dtype | None = None
) -> DeterminismReport:
    """One ``check_determinism`` of the demo model with ``attn`` on ``device`` (``dtype``
    default bf16); returns the report. The command runs it on the GPU; tests on the CPU too."""
    import torch
    import transformers

    from ..integrations.transformers import register
    from .run import check_determinism

    register()
    torch.manual_seed(args.seed)
    config = transformers.LlamaConfig(
        vocab_size=1024,
        hidden_size=args.hidden,
        intermediate_size=2 * args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        head_dim=args.head_dim,
        max_position_embeddings=args.seqlen,
    )
    model = transformers.AutoModelForCausalLM.from_config(
        config, attn_implementation=attn, dtype=dtype or torch.bfloat16
    ).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def batch_fn(step: int) -> torch.Tensor:
        gen = torch.Generator().manual_seed(args.seed * 1000 + step)
        ids = torch.randint(0, config.vocab_size, (args.batch, args.seqlen), generator=gen)
        return ids.to(device)

    def loss_fn(m: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
        return m(input_ids=ids, labels=ids).loss

    plot = None if args.plot is None else Path(f"{args.plot}-{attn}.png")
    if attn == "sdpa" and device == "cuda":
        # The fused backends (their backward adds dQ with atomics), not the math fallback.
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]):
            return check_determinism(model, batch_fn, loss_fn, args.steps, optimizer, plot=plot)
    return check_determinism(model, batch_fn, loss_fn, args.steps, optimizer, plot=plot)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``dash-attn check``; prints the reports, returns the exit status (0 when
    the checks ran, whatever they found; 2 when they cannot run here)."""
    parser = build_parser()
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    _positive(parser, args)
    try:
        import torch
        import transformers  # noqa: F401
    except ImportError as exc:
        print(
            f"{PROG}: error: the demo needs torch and transformers (pip install "
            f"'transformers>=5'): {exc}",
            file=sys.stderr,
        )
        return 2
    if not torch.cuda.is_available():
        print(
            f"{PROG}: error: the demo needs a CUDA GPU (it compares PyTorch's fused SDPA "
            "backward with dash-attn's, which only run on the GPU); on the CPU, call "
            "dash_attn.check_determinism(model, batch_fn, loss_fn) on your own model",
            file=sys.stderr,
        )
        return 2
    attns = IMPLEMENTATIONS if args.attn == "both" else (args.attn,)
    summary = []
    for attn in attns:
        print(f"== attn_implementation={attn!r}: Llama, {args.layers} layers, hidden "
              f"{args.hidden}, heads {args.heads}/{args.kv_heads}, batch {args.batch} x "
              f"{args.seqlen} tokens, bf16, {torch.cuda.get_device_name()} ==")  # fmt: skip
        report = run_demo(args, attn)
        print(report, flush=True)
        print()
        first = report.first
        verdict = "deterministic" if first is None else f"first difference in {first.suspect}"
        summary.append(f"{attn}: {verdict}")
    print("summary: " + "; ".join(summary))
    return 0
