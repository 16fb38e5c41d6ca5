"""Deterministic training, end to end: a small random-init Llama (transformers) trained on
synthetic tokens, twice from the same seed, compared bitwise (every step's loss and the final
weights), with the loss curves plotted.

One GPU::

    python examples/train_tiny_llama.py --attn dash            # bitwise identical
    python examples/train_tiny_llama.py --attn sdpa            # PyTorch's fused backward: differs

Two GPUs (DDP, or FSDP2 ``fully_shard``; each rank checks its gradients' effect on its weights
or shards, and the verdict is agreed across ranks)::

    torchrun --nproc_per_node 2 examples/train_tiny_llama.py --attn dash --ddp
    torchrun --nproc_per_node 2 examples/train_tiny_llama.py --attn dash --fsdp

On a CPU (the distributed glue only, with the gloo backend and transformers' eager attention)::

    torchrun --nproc_per_node 2 examples/train_tiny_llama.py --device cpu --attn eager --ddp --tiny

The exit status is 0 when the two runs are bitwise identical, 1 when they differ.

The data are learnable on purpose: each sequence is an arithmetic progression modulo the
vocabulary (random start and stride), so the loss curve falls and a drift between runs shows up
in a curve that moves, not in noise around ln(vocab).
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.distributed as dist

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


@dataclasses.dataclass(frozen=True)
class Setup:
    """Where this process runs: device, rank, world size, and the wrapping (none/ddp/fsdp)."""

    device: torch.device
    rank: int
    world: int
    wrap: str  # "none", "ddp" or "fsdp"


@dataclasses.dataclass
class RunResult:
    losses: torch.Tensor  # (steps,) float32, on the CPU
    weights: dict[str, torch.Tensor]  # this rank's parameters (FSDP: its shards), on the CPU


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--attn", choices=["dash", "sdpa", "eager"], default="dash")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch", type=int, default=8, help="sequences per rank and step")
    p.add_argument("--seqlen", type=int, default=512)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", choices=["cuda", "cpu"], default=None, help="default: cuda if any")
    p.add_argument("--tiny", action="store_true", help="a 2-layer, hidden-64 model (CPU tests)")
    p.add_argument(
        "--dtype",
        choices=sorted(DTYPES),
        default=None,
        help="default: bf16 on the GPU, fp32 on the CPU (fp16 for --attn dash in Triton's CPU "
        "interpreter, TRITON_INTERPRET=1)",
    )
    wrap = p.add_mutually_exclusive_group()
    wrap.add_argument("--ddp", action="store_true", help="DistributedDataParallel (torchrun)")
    wrap.add_argument("--fsdp", action="store_true", help="FSDP2 fully_shard (torchrun)")
    p.add_argument("--out", type=Path, default=Path("train_tiny_llama"), help="output folder")
    args = p.parse_args(argv)
    for name in ("steps", "batch", "seqlen"):
        if getattr(args, name) < 1:
            p.error(f"argument --{name}: must be >= 1")
    return args


def setup(args: argparse.Namespace) -> Setup:
    """Start the process group under torchrun (--ddp/--fsdp), pick the device."""
    use_cuda = torch.cuda.is_available() if args.device is None else args.device == "cuda"
    if use_cuda and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device here")
    wrap = "ddp" if args.ddp else "fsdp" if args.fsdp else "none"
    if wrap == "none":
        return Setup(torch.device("cuda" if use_cuda else "cpu"), 0, 1, wrap)
    if "RANK" not in os.environ:
        raise SystemExit(f"--{wrap} needs torchrun (torchrun --nproc_per_node 2 {sys.argv[0]} ...)")
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if use_cuda:
        torch.cuda.set_device(local_rank)
    dist.init_process_group(backend="nccl" if use_cuda else "gloo")
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    return Setup(device, dist.get_rank(), dist.get_world_size(), wrap)


def build_model(args: argparse.Namespace, env: Setup) -> torch.nn.Module:
    import transformers

    if args.attn == "dash":
        from dash_attn.integrations.transformers import register

        register()
    hidden, layers, heads = (64, 2, 2) if args.tiny else (256, 4, 4)
    size = {
        "hidden_size": hidden,
        "intermediate_size": 3 * hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
    }
    config = transformers.LlamaConfig(
        vocab_size=128 if args.tiny else 512,
        num_key_value_heads=1 if args.tiny else 2,
        head_dim=64,  # the smallest head dimension dash-attn's kernels take
        max_position_embeddings=args.seqlen,
        attention_dropout=0.0,
        **size,
    )
    # Same weights on every rank and in both runs: seeded before the random init.
    torch.manual_seed(args.seed)
    # bf16 on the GPU (dash-attn's kernels take fp16/bf16); fp32 for the CPU glue test.
    default = torch.bfloat16 if env.device.type == "cuda" else torch.float32
    dtype = DTYPES[args.dtype] if args.dtype is not None else default
    model = transformers.AutoModelForCausalLM.from_config(
        config, attn_implementation=args.attn, dtype=dtype
    )
    return wrap_model(model.to(env.device), env)


def wrap_model(model: torch.nn.Module, env: Setup) -> torch.nn.Module:
    if env.wrap == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        ids = [env.device.index] if env.device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=ids)
    if env.wrap == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for layer in model.model.layers:
            fully_shard(layer)
        fully_shard(model)
    return model


def batch(args: argparse.Namespace, env: Setup, vocab: int, step: int) -> torch.Tensor:
    """Arithmetic progressions modulo ``vocab``; a different slice of data on every rank."""
    gen = torch.Generator().manual_seed(((args.seed * 1_000_003) + step) * 1009 + env.rank)
    start = torch.randint(0, vocab, (args.batch, 1), generator=gen)
    stride = torch.randint(1, 8, (args.batch, 1), generator=gen)
    ids = (start + stride * torch.arange(args.seqlen).view(1, -1)) % vocab
    return ids.to(env.device)


def train(args: argparse.Namespace, env: Setup) -> RunResult:
    """One full training run from the seed."""
    model = build_model(args, env)
    vocab = (model.module if env.wrap == "ddp" else model).config.vocab_size
    # AdamW keeps its moments in the parameters' dtype: in fp16 its default eps (1e-8) is 0 and
    # so are the tiny second moments, and 0 / 0 made every weight NaN after the first step. An
    # eps fp16 can hold (its smallest normal is 6.1e-5) keeps a pure-fp16 model finite.
    fp16 = next(model.parameters()).dtype == torch.float16
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=args.lr, weight_decay=0.01, eps=1e-4 if fp16 else 1e-8
    )
    losses = []
    for step in range(args.steps):
        ids = batch(args, env, vocab, step)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.detach().float())
    weights = {}
    for name, param in model.named_parameters():
        local = param.to_local() if hasattr(param, "to_local") else param  # FSDP2: the shard
        weights[name] = local.detach().cpu().clone()
    return RunResult(torch.stack(losses).cpu(), weights)


def compare(a: RunResult, b: RunResult) -> list[str]:
    """What differs bitwise between two runs (empty: identical)."""
    problems = []
    if a.losses.shape != b.losses.shape or not torch.equal(
        a.losses.view(torch.int32), b.losses.view(torch.int32)
    ):
        n = min(len(a.losses), len(b.losses))
        steps = (a.losses[:n].view(torch.int32) != b.losses[:n].view(torch.int32)).nonzero()
        first = int(steps[0]) if steps.numel() else n
        problems.append(f"losses differ from step {first} on")
    for name, wa in a.weights.items():
        wb = b.weights.get(name)
        if wb is None or wa.shape != wb.shape or wa.dtype != wb.dtype:
            problems.append(f"{name}: shape/dtype/presence differs")
        elif not torch.equal(wa.view(torch.uint8), wb.view(torch.uint8)):
            delta = (wa.double() - wb.double()).abs().max().item()
            problems.append(f"{name}: final weights differ (max |Δ| {delta:.3g})")
    return problems


def plot_losses(a: RunResult, b: RunResult, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    steps = range(len(a.losses))
    top.plot(steps, a.losses, label="run 1")
    top.plot(steps, b.losses, label="run 2", linestyle="--")
    top.set_ylabel("loss")
    top.set_title(title)
    top.legend()
    delta = (a.losses.double() - b.losses.double()).abs()
    bottom.plot(steps, delta, color="tab:red")
    bottom.set_ylabel("|loss 1 - loss 2|")
    bottom.set_xlabel("step")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def agree(ok: bool, env: Setup) -> bool:
    """True only if every rank found its two runs identical."""
    if env.world == 1:
        return ok
    flag = torch.tensor([0 if ok else 1], device=env.device)
    dist.all_reduce(flag)  # sum of the failures
    return int(flag.item()) == 0


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    env = setup(args)
    try:
        first, second = train(args, env), train(args, env)
        problems = compare(first, second)
        identical = agree(not problems, env)
        label = f"attn={args.attn}, {env.wrap if env.wrap != 'none' else 'single'} x{env.world}"
        if env.rank == 0:
            name = f"loss_{args.attn}_{env.wrap}_{env.world}.png"
            plot_losses(first, second, args.out / name, f"two runs, {label}")
            verdict = "bitwise identical" if identical else "DIFFER"
            print(f"{label}, {args.steps} steps: final loss {first.losses[-1].item():.4f}")
            print(f"two runs: {verdict} (losses of every step and final weights)")
            print(f"loss curves: {args.out / name}")
        for line in problems[:10]:
            print(f"rank {env.rank}: {line}")
        if dist.is_initialized():
            # Every rank leaves together: a rank that tore its process group down while rank 0
            # was still plotting aborted now and then (gloo: "terminate called without an
            # active exception"). The two runs' DDP wrappers hold the group through their
            # reducers: collected here, they let go of it before it is destroyed rather than
            # at interpreter exit. (One abort was still seen after the barrier alone, in CI;
            # it never reproduced locally, so whether this removes it is not known.)
            gc.collect()
            dist.barrier()
        return 0 if identical else 1
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    raise SystemExit(main())
