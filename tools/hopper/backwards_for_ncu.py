"""One backward each of dash-attn's hopper backend (deterministic, then not) and of FA4's
(the same), per shape, for Nsight Compute to profile (filter the kernels by name:
``-k regex:"HopperAttnBwd|FlashAttentionBackwardSm90"``): the kernels come in that order per
shape, which is the order of ``ncu_summary.py --table``'s labels.

    ncu --set full -k regex:"..." -o prof python3 tools/hopper/backwards_for_ncu.py \\
        16:1024:8:256:causal 2:8192:8:256:full

Each shape is ``batch:seqlen:heads:head_dim:mask`` (mask ``full`` or ``causal``), bf16, seeded
by its seqlen. Needs a GPU, FA4 (``flash_attn.cute``) and the CuTe-DSL kit.
"""

from __future__ import annotations

import sys


def parse_shape(text: str) -> tuple[int, int, int, int, bool]:
    """``batch:seqlen:heads:head_dim:mask`` -> (batch, seqlen, heads, head_dim, causal)."""
    parts = text.split(":")
    if (
        len(parts) != 5
        or parts[4] not in ("full", "causal")
        or not all(p.isdigit() for p in parts[:4])
    ):
        raise ValueError(f"shape {text!r}: want batch:seqlen:heads:head_dim:full|causal")
    batch, seqlen, heads, head_dim = (int(p) for p in parts[:4])
    return batch, seqlen, heads, head_dim, parts[4] == "causal"


def main(argv: list[str]) -> int:
    import torch
    from flash_attn.cute import flash_attn_func as fa4

    from dash_attn import dash_attn_func

    def ours(q, k, v, causal, det):
        return dash_attn_func(q, k, v, causal=causal, deterministic=det, backend="hopper")

    def theirs(q, k, v, causal, det):
        out = fa4(q, k, v, causal=causal, deterministic=det)
        return out[0] if isinstance(out, tuple) else out

    for text in argv:
        batch, seqlen, heads, head_dim, causal = parse_shape(text)
        gen = torch.Generator(device="cuda").manual_seed(seqlen)
        q, k, v, dout = (
            torch.randn(batch, seqlen, heads, head_dim, device="cuda", dtype=torch.bfloat16,
                        generator=gen)
            for _ in range(4)
        )  # fmt: skip
        for name, attention in (("ours", ours), ("fa4", theirs)):
            for det in (True, False):
                leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
                out = attention(*leaves, causal, det)
                torch.autograd.grad(out, leaves, dout)
                torch.cuda.synchronize()
                print(name, text, "det" if det else "non-det", flush=True)
    print("done")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
