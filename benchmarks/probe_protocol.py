"""Tuning probe: where the deterministic backward's time goes, and candidate replacements.

Builds variants of the backward kernel by editing its source and times each against the shipped
det and non-det kernels on a few configs, in one process. Some variants are diagnostics and NOT
correct (they drop the wait); candidates must give gradients bitwise equal to the shipped
deterministic kernel, which every line checks (variants named ``*_nondet`` run
non-deterministic). A developer tool for one device call; nothing here is used by the library.

    PYTHONPATH=$PWD python3 benchmarks/probe_protocol.py [--configs 128:c:16384,128:f:4096]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import pathlib
import sys
import tempfile

import torch
from probe_common import gradients, probe_configs, time_backward

import dash_attn.kernels.bwd as bwd_module
from dash_attn import dash_attn_func

KERNEL_SOURCE = pathlib.Path(bwd_module.__file__)
WAIT_CALL = "failed = _wait_for_turn(sem_ptr, seen, rank, timeout, TIMED_WAIT)"
EARLY_READ = "seen = _load_acquire(sem_ptr, TIMED_WAIT)"
SEM_PTR = "sem_ptr = SEM + (b * q_heads + h) * q_tiles + q_tile\n"
RELEASE = "_release_turn(pending_sem, has_pending, TIMED_WAIT, DQ_TMA)"
# The two places the shipped loop may release the previous step's turn (BackwardTiles'
# release_after_qk picks one); a variant that moves the release removes both.
START_RELEASE = f"                if not RELEASE_AFTER_QK:\n                    {RELEASE}\n"
QK_RELEASE = f"                if RELEASE_AFTER_QK:\n                    {RELEASE}\n"
NO_LOOP_RELEASE = [
    (START_RELEASE, "                pass\n"),
    (QK_RELEASE, "                pass\n"),
]
DK_DOT = "            dk += tl.dot(ds_t, q)\n"


def _release_moved(anchor: str, before: bool) -> list[tuple[str, str]]:
    """Edits that move the deferred release of the previous step next to ``anchor`` (a statement
    inside an ``if DETERMINISTIC:`` block, indented 16)."""
    moved = f"{RELEASE}\n                "
    return NO_LOOP_RELEASE + [
        (anchor, moved + anchor if before else anchor + "\n                " + RELEASE),
    ]


def _release_after(statement: str) -> list[tuple[str, str]]:
    """Edits that move the release to just after ``statement`` (a whole line of the step)."""
    inserted = f"            if DETERMINISTIC:\n                {RELEASE}\n"
    return NO_LOOP_RELEASE + [(statement, statement + inserted)]


# name -> list of (old, new) source edits; every `old` must occur in the kernel source.
def _region(start: str, end: str, new: str) -> tuple[str, str]:
    """An edit replacing the kernel source from ``start`` up to (not including) ``end``."""
    source = KERNEL_SOURCE.read_text()
    if start not in source or end not in source:
        return (start if start not in source else end, new)  # reported as a missing anchor
    first = source.index(start)
    return (source[first : source.index(end, first)], new)


# Register prefetch: the next step's Q, dO, LSE and delta are loaded at the top of this step
# into registers (plain loads, one pipeline stage) and used one step later, so their latency
# hides behind a whole step. Costs 32+ registers: at hd128 the spill stack grows to ~450 B; at
# hd64 with 64x128 tiles it stays at 0 B (compile_report), the case worth timing.
_NEXT_LOADS = """\
            offs_mn = t_n * BLOCK_M + offs_m0
            mask_n = (offs_mn < seqlen_q)[:, None] & d_mask
            q_n = tl.load(
                Q + b * stride_qb + h_n * stride_qh + offs_mn[:, None] * stride_qm
                + offs_d[None, :], mask=mask_n, other=0.0,
            )
            do_n = tl.load(
                DO + b * stride_dob + h_n * stride_doh + offs_mn[:, None] * stride_dom
                + offs_d[None, :], mask=mask_n, other=0.0,
            )
            lse_n = tl.load(LSE2 + (b * q_heads + h_n) * rows_pad + offs_mn)
            delta_n = tl.load(DELTA + (b * q_heads + h_n) * rows_pad + offs_mn)
"""
REGISTER_PREFETCH = (
    """\
        first = tl.minimum(step_lo, step_hi - 1)
        if True:
            h_n = tl.load(STEP_HEAD + first, mask=step_lo < step_hi, other=0)
            t_n = tl.load(STEP_TILE + first, mask=step_lo < step_hi, other=0)
"""
    + _NEXT_LOADS
    + """\
        for step in range(step_lo, step_hi):
            h, q_tile, q, do, lse, delta = h_n, t_n, q_n, do_n, lse_n, delta_n
            ahead = tl.minimum(step + 1, step_hi - 1)
            h_n = tl.load(STEP_HEAD + ahead)
            t_n = tl.load(STEP_TILE + ahead)
"""
    + _NEXT_LOADS
    + """\
            offs_m = q_tile * BLOCK_M + offs_m0
            m_valid = offs_m < seqlen_q
            qo_mask = m_valid[:, None] & d_mask
            bh = b * q_heads + h
"""
)

VARIANTS: dict[str, list[tuple[str, str]]] = {
    # The protocol of tuning calls 2-4: relaxed polls, then fence.acq_rel; no early read.
    "fence_poll": [
        (EARLY_READ, "seen = rank - 1"),
        ("ld.acquire.gpu.global.b32 %seen, [$1];", "ld.relaxed.gpu.global.b32 %seen, [$1];"),
        ("DONE:\n}", "DONE:\nfence.acq_rel.gpu;\n}"),
    ],
    "late_read": [(EARLY_READ, "seen = rank - 1")],
    "read_at_step_start": [
        (EARLY_READ, "pass"),
        (SEM_PTR, SEM_PTR + "                " + EARLY_READ + "\n"),
    ],
    # Where the previous step's release goes (shipped: at the step's start, after its loads are
    # issued; after the first matmul at head dims 192/256, BackwardTiles.release_after_qk). A
    # later release gives the bulk reduction / atomics longer to complete before the release
    # waits for them, at the cost of a later hand-off to the successor. Tuning call 10: step start
    # +1% (hd128) / +9% (hd64) over after the first matmul, later positions -5 to -10%.
    # (The tables read ahead and the release after the first matmul, variants in session 3, are
    # now the tile options ``a`` and ``r`` of DASH_ATTN_BWD_TILES.)
    "register_prefetch": [
        _region(
            "        if QO_TMA or TABLES_AHEAD:\n            # The next step's loads",
            "            if DETERMINISTIC:\n                # Release the previous step's dQ tile",
            REGISTER_PREFETCH,
        )
    ],
    "release_at_step_end": NO_LOOP_RELEASE
    + [
        (
            "                pending_sem = sem_ptr\n                has_pending = 1\n",
            "                _cta_barrier(TIMED_WAIT, DQ_TMA)\n"
            '                tl.atomic_add(sem_ptr, 1, sem="release")\n'
            "                has_pending = 0\n",
        ),
    ],
    "release_after_dp": _release_moved(EARLY_READ, before=True),
    "release_after_dk": _release_after(DK_DOT),
    "release_at_wait": _release_moved(WAIT_CALL, before=True),
    # Diagnostics, not correct: no wait for the turn (and no release).
    "no_wait": [(WAIT_CALL, "failed = rank < 0")],
    "no_wait_no_release": [(WAIT_CALL, "failed = rank < 0")] + NO_LOOP_RELEASE,
}
# Variants that are wrong on purpose; every other one must give the shipped kernel's bits.
DIAGNOSTICS = frozenset({"no_wait", "no_wait_no_release"})


def load_variant_source(
    name: str, edits: list[tuple[str, str]], workdir: pathlib.Path, extra_source: str = ""
):
    """Import a copy of the kernel module with ``edits`` applied (and ``extra_source`` appended)."""
    source = KERNEL_SOURCE.read_text()
    for old, new in edits:
        if old not in source:
            raise SystemExit(f"variant {name}: edit anchor not found: {old!r}")
        source = source.replace(old, new)
    # Relative imports need the module to live inside the package.
    path = workdir / f"_probe_{name}.py"
    path.write_text(source + extra_source)
    spec = importlib.util.spec_from_file_location(f"dash_attn.kernels._probe_{name}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def load_variant(name: str, edits: list[tuple[str, str]], workdir: pathlib.Path):
    return load_variant_source(name, edits, workdir).attn_bwd_kernel


def dash_gradients(q, k, v, dout, causal: bool, deterministic: bool) -> list[torch.Tensor]:
    return gradients(
        lambda a, b, c: dash_attn_func(a, b, c, causal=causal, deterministic=deterministic),
        q, k, v, dout,
    )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--configs", default="128:c:16384,128:f:4096,64:c:8192")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    shipped = bwd_module.attn_bwd_kernel
    with tempfile.TemporaryDirectory(dir=KERNEL_SOURCE.parent) as tmp:
        kernels = {"det": shipped, "nondet": shipped}
        for name in args.variants.split(","):
            kernels[name] = load_variant(name, VARIANTS[name], pathlib.Path(tmp))
        rows = []
        for config in probe_configs(args.configs):
            item, causal, flops = config.label, config.causal, config.bwd_flops
            q, k, v, dout = config.inputs()
            reference = dash_gradients(q, k, v, dout, causal, deterministic=True)
            for name, kernel in kernels.items():
                deterministic = not name.endswith("nondet")
                bwd_module.attn_bwd_kernel = kernel
                try:
                    ms = time_backward(
                        lambda a, b, c, m=causal, d=deterministic: dash_attn_func(
                            a, b, c, causal=m, deterministic=d
                        ),
                        q, k, v, dout,
                    )  # fmt: skip
                    grads = dash_gradients(q, k, v, dout, causal, deterministic)
                finally:
                    bwd_module.attn_bwd_kernel = shipped
                # A correct deterministic variant adds the same partials in the same order as
                # the shipped kernel: its gradients must be bitwise equal to the reference.
                pairs = list(zip(grads, reference, strict=True))
                equal = all(torch.equal(a, b) for a, b in pairs)
                diff = max(float((a.float() - b.float()).abs().max()) for a, b in pairs)
                tflops = flops / ms / 1e9
                rows.append(
                    dict(config=item, variant=name, ms=ms, tflops=tflops, bitwise_equal=equal,
                         max_diff=diff)
                )  # fmt: skip
                print(
                    f"{item:>12} {name:>20} {ms:8.3f} ms {tflops:7.1f} TFLOPS  "
                    f"{'== shipped det' if equal else f'max |diff| {diff:.1e}'}",
                    flush=True,
                )
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
