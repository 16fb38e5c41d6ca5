"""Tuning probe: backward TFLOPS of each schedule, det vs non-det, vs FA4, on a few configs.

A developer tool for one device call (``dash-attn bench`` is the full sweep). Prints one line per
(config, provider) and the register/spill report of every compiled backward variant.

    PYTHONPATH=$PWD python3 benchmarks/probe_bwd.py [--configs 128:c:16384,64:f:2048] [--json F]
"""

from __future__ import annotations

import argparse
import json
import os

from dash_attn.kernels.bwd import attn_bwd_kernel
from dash_attn.runtime import schedule_spec
from probe_common import gradients, probe_configs, time_backward

from dash_attn import dash_attn_func
from dash_attn.schedule import applicable_schedules

DEFAULT_CONFIGS = "128:c:16384,128:c:2048,128:f:16384,128:f:2048,64:c:8192,64:f:4096"


def _apply_variant(variant: str) -> None:
    """A variant is ``TILES[@REDUCE[@LOAD]]``: DASH_ATTN_BWD_TILES, DASH_ATTN_DQ_REDUCE and
    DASH_ATTN_QO_LOAD; an empty field keeps the library's default (``@@tma``: TMA loads)."""
    tiles, reduce, load = (variant.split("@") + ["", ""])[:3]
    os.environ["DASH_ATTN_BWD_TILES"] = tiles
    os.environ["DASH_ATTN_DQ_REDUCE"] = reduce or "auto"
    os.environ["DASH_ATTN_QO_LOAD"] = load or "pointer"


def _with_tiles(variant: str, fn):
    """Run ``fn`` (forward now, backward later) under a variant's environment overrides."""
    _apply_variant(variant)
    return fn()


def _run_providers(providers, item, q, k, v, dout, causal, flops, rows) -> None:
    """Time every provider; deterministic dash variants are also checked against the first one:
    the knobs change how data moves, not the summation order, so the bits must be the same."""
    reference = None
    for name, fn in providers.items():
        check = ""
        try:
            variant = name.split("/")[0] if "/" in name else ""
            _apply_variant("" if variant == "default" else variant)
            ms = time_backward(lambda a, b, c, f=fn, m=causal: f(a, b, c, m), q, k, v, dout)
            tflops = flops / ms / 1e9
            if name.endswith("/det"):
                grads = gradients(lambda a, b, c, f=fn: f(a, b, c, causal), q, k, v, dout)
                if reference is None:
                    reference, check = grads, "reference"
                else:
                    same = all(a.equal(b) for a, b in zip(grads, reference, strict=True))
                    check = "== first det" if same else "DIFFERS from the first det"
        except Exception as exc:  # noqa: BLE001 - report and go on with the next provider
            print(f"{item:>14} {name:>30} FAILED {type(exc).__name__}: {exc}")
            continue
        rows.append(dict(config=item, provider=name, ms=ms, tflops=tflops, check=check))
        print(f"{item:>14} {name:>30} {ms:8.3f} ms {tflops:7.1f} TFLOPS  {check}", flush=True)


def fa4_providers():
    try:
        from flash_attn.cute import flash_attn_func as fa4
    except Exception as exc:  # noqa: BLE001 - any import failure means "peer not available"
        print(f"# FA4 not available: {type(exc).__name__}: {exc}")
        return {}

    def make(det: bool):
        def call(q, k, v, causal):
            out = fa4(q, k, v, causal=causal, deterministic=det)
            return out[0] if isinstance(out, tuple) else out

        return call

    return {"fa4_det": make(True), "fa4_nondet": make(False)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--configs", default=DEFAULT_CONFIGS, help="headdim:c|f:seqlen,...")
    parser.add_argument("--json", default=None)
    parser.add_argument("--no-fa4", action="store_true")
    parser.add_argument(
        "--variants",
        default=None,
        help="';'-separated variants to compare (auto det + non-det only): TILES[@REDUCE[@LOAD]] "
        "with TILES a DASH_ATTN_BWD_TILES value, REDUCE a DASH_ATTN_DQ_REDUCE value and LOAD a "
        "DASH_ATTN_QO_LOAD value, empty for the default, e.g. ';@@tma;128:64x128w8s3@atomic@tma'",
    )
    args = parser.parse_args()
    peers = {} if args.no_fa4 else fa4_providers()
    rows = []
    for config in probe_configs(args.configs):
        item, causal, flops = config.label, config.causal, config.bwd_flops
        batch, seqlen, heads, headdim = config.batch, config.seqlen, config.heads, config.headdim
        q, k, v, dout = config.inputs()
        spec = schedule_spec(batch, seqlen, seqlen, heads, heads, headdim, causal, 132)
        providers = {}
        if args.variants is not None:
            for variant in args.variants.split(";"):
                for det in (True, False):
                    label = f"{variant or 'default'}/{'det' if det else 'nondet'}"
                    providers[label] = lambda q, k, v, c, t=variant, d=det: _with_tiles(
                        t, lambda: dash_attn_func(q, k, v, causal=c, deterministic=d)
                    )
            providers.update(peers)
            _run_providers(providers, item, q, k, v, dout, causal, flops, rows)
            continue
        for name in applicable_schedules(spec):
            providers[f"dash_{name}"] = lambda q, k, v, c, s=name: dash_attn_func(
                q, k, v, causal=c, schedule=s
            )
        providers["dash_nondet"] = lambda q, k, v, c: dash_attn_func(
            q, k, v, causal=c, deterministic=False
        )
        providers.update(peers)
        for name, fn in providers.items():
            try:
                ms = time_backward(lambda a, b, c, f=fn, m=causal: f(a, b, c, m), q, k, v, dout)
                tflops = flops / ms / 1e9
            except Exception as exc:  # noqa: BLE001 - report and go on with the next provider
                print(f"{item:>14} {name:>22} FAILED {type(exc).__name__}: {exc}")
                continue
            rows.append(dict(config=item, provider=name, ms=ms, tflops=tflops))
            print(f"{item:>14} {name:>22} {ms:8.3f} ms {tflops:7.1f} TFLOPS", flush=True)
    for device_cache in getattr(attn_bwd_kernel, "device_caches", {}).values():
        for key, kernel in device_cache[0].items():
            meta = kernel.metadata
            print(
                f"# bwd variant regs={kernel.n_regs} spills={kernel.n_spills} "
                f"smem={meta.shared} warps={meta.num_warps} stages={meta.num_stages} "
                f"key={key!s:.120}"
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
