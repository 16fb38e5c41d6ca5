"""Writing matplotlib figures as small PNGs (imported only by the plotting modules).

The figures are line and bar charts in a handful of flat colours; matplotlib writes them as
32-bit RGBA with anti-aliased edges, about four times the bytes of the same picture as an
8-bit palette PNG. The benchmark plots are committed with their result files, so the difference
counts against the repository's size.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

PALETTE_COLORS = 256


def save_png(fig: Any, path: str | Path, dpi: int) -> Path:
    """``fig.savefig(path, dpi=dpi)``, then re-encode the PNG with a 256-colour palette.

    Pillow comes with matplotlib; if it is missing, or ``path`` is not a PNG, the file stays as
    matplotlib wrote it.
    """
    path = Path(path)
    fig.savefig(path, dpi=dpi)
    if path.suffix.lower() == ".png":
        shrink_png(path)
    return path


def shrink_png(path: str | Path) -> None:
    """Rewrite the PNG at ``path`` as an optimised palette image (no-op without Pillow)."""
    try:
        from PIL import Image
    except ImportError:
        return
    with Image.open(path) as image:
        palette = image.convert("RGB").quantize(
            colors=PALETTE_COLORS, method=Image.Quantize.MEDIANCUT
        )
    palette.save(path, optimize=True)
