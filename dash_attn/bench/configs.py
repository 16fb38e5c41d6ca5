"""The configs of ``dash-attn bench``: the paper grid by default, ``--configs`` lists, cases.

The grid's numbers are ``dash_attn.schedule.report``'s (the one definition shared with
``dash-attn schedule`` and the tools).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass

from ..schedule.report import (
    PAPER_HEADDIMS,
    PAPER_HIDDEN,
    PAPER_MASKS,
    PAPER_SEQLENS,
    PAPER_TOKENS,
    paper_batch_heads,
)
from .providers import Case

DEFAULT_TOKENS = PAPER_TOKENS
DEFAULT_HIDDEN = PAPER_HIDDEN
DEFAULT_HEADDIMS = PAPER_HEADDIMS
DEFAULT_SEQLENS = PAPER_SEQLENS
DEFAULT_MASKS = PAPER_MASKS
QUICK_SEQLENS = (1024, 8192)

_MASK_NAMES = {"full": False, "f": False, "causal": True, "c": True}


def _int_list(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected integers separated by commas, got {text!r}"
        ) from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


@dataclass(frozen=True)
class HiddenSizes:
    """``--hidden``: heads * head dim of the sweep's cases, one size for every head dim or
    another for some (a head dim must divide its size).

    >>> sizes = parse_hidden("2048,96:3072")
    >>> [sizes.of(d) for d in (64, 96, 128)], str(sizes)
    ([2048, 3072, 2048], '2048,96:3072')

    so ``--headdims 64,96,128 --hidden 2048,96:3072`` sweeps 32, 32 and 16 heads in one run.
    """

    default: int
    per_headdim: tuple[tuple[int, int], ...] = ()

    def of(self, headdim: int) -> int:
        return dict(self.per_headdim).get(headdim, self.default)

    def __str__(self) -> str:
        return ",".join([str(self.default), *(f"{d}:{h}" for d, h in self.per_headdim)])


def parse_hidden(text: str) -> HiddenSizes:
    """``"2048"`` or ``"2048,96:3072"`` (a default, then HEADDIM:HIDDEN overrides)."""
    default, overrides = None, {}
    for item in (x.strip() for x in text.split(",")):
        if not item:
            continue
        headdim, sep, size = item.rpartition(":")
        try:
            value = int(size)
            key = int(headdim) if sep else None
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"--hidden is SIZE or SIZE,HEADDIM:SIZE,..., got {text!r}"
            ) from None
        if value < 1 or (key is not None and key < 1):
            raise argparse.ArgumentTypeError(f"--hidden sizes must be positive, got {text!r}")
        if key is None:
            if default is not None:
                raise argparse.ArgumentTypeError(f"--hidden has two default sizes: {text!r}")
            default = value
        else:
            overrides[key] = value
    if default is None:
        raise argparse.ArgumentTypeError(f"--hidden needs a default size first, got {text!r}")
    return HiddenSizes(default, tuple(sorted(overrides.items())))


def _mask_list(text: str) -> list[str]:
    values = [x.strip() for x in text.split(",") if x.strip()]
    bad = [v for v in values if v not in _MASK_NAMES]
    if not values or bad:
        raise argparse.ArgumentTypeError(f"masks are 'full' and 'causal', got {text!r}")
    return ["causal" if _MASK_NAMES[v] else "full" for v in values]


def parse_configs(text: str) -> list[tuple[int, bool, int]]:
    """``"128:causal:16384,64:full:2048"`` -> ``[(128, True, 16384), (64, False, 2048)]``.

    Masks may be abbreviated ``c`` and ``f``.
    """
    configs = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        parts = item.split(":")
        if len(parts) != 3 or parts[1] not in _MASK_NAMES:
            raise argparse.ArgumentTypeError(
                f"a config is HEADDIM:MASK:SEQLEN with MASK full or causal, got {item!r}"
            )
        try:
            headdim, seqlen = int(parts[0]), int(parts[2])
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"HEADDIM and SEQLEN must be integers in {item!r}"
            ) from None
        if headdim < 1 or seqlen < 1:
            raise argparse.ArgumentTypeError(f"HEADDIM and SEQLEN must be positive in {item!r}")
        configs.append((headdim, _MASK_NAMES[parts[1]], seqlen))
    if not configs:
        raise argparse.ArgumentTypeError("--configs is empty")
    return configs


def resolve_cases(args: argparse.Namespace) -> list[Case]:
    """The sweep's cases, grouped by (head dim, mask), seqlen growing within a group.

    Grouping lets one compile per group serve all its seqlens. Groups run in the order of their
    weight in the paper (head dim 128 before 64, causal before full), so a run stopped by
    ``--deadline-s`` has measured the configs that matter most.
    """
    if args.configs:
        triples = list(args.configs)
    else:
        triples = [
            (d, m == "causal", s)
            for d in args.headdims
            for m in args.masks
            for s in (QUICK_SEQLENS if args.quick else args.seqlens)
        ]
    cases = []
    for headdim, causal, seqlen in triples:
        hidden = args.hidden.of(headdim)
        try:
            batch, heads = paper_batch_heads(headdim, seqlen, args.tokens, hidden)
        except ValueError:
            raise ValueError(f"--hidden {hidden} is not a multiple of head dim {headdim}") from None
        cases.append(Case(batch, seqlen, heads, heads, headdim, causal, args.dtype))
    order = {c: i for i, c in enumerate(cases)}
    return sorted(
        dict.fromkeys(cases), key=lambda c: (-c.headdim, not c.causal, c.seqlen, order[c])
    )


def is_default_grid(args: argparse.Namespace) -> bool:
    return (
        not args.configs
        and not args.quick
        and tuple(args.headdims) == DEFAULT_HEADDIMS
        and tuple(args.seqlens) == DEFAULT_SEQLENS
        and tuple(sorted(args.masks)) == tuple(sorted(DEFAULT_MASKS))
        and args.tokens == DEFAULT_TOKENS
        and args.hidden == HiddenSizes(DEFAULT_HIDDEN)
    )


def determinism_cases(args: argparse.Namespace, cases: Sequence[Case]) -> list[Case]:
    """One case per (head dim, mask) of the sweep, at ``--determinism-seqlen``."""
    seen: dict[tuple[int, bool], Case] = {}
    for case in cases:
        key = (case.headdim, case.causal)
        if key not in seen:
            seqlen = args.determinism_seqlen
            seen[key] = Case(
                max(1, args.tokens // seqlen), seqlen, case.heads, case.kv_heads,
                case.headdim, case.causal, case.dtype,
            )  # fmt: skip
    return list(seen.values())
