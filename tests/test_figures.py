"""save_png writes the figure, then re-encodes it as a palette PNG of the same size in pixels."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

plt = pytest.importorskip("matplotlib.pyplot")
Image = pytest.importorskip("PIL.Image")

from dash_attn.figures import save_png  # noqa: E402


def test_save_png_writes_a_smaller_palette_image(tmp_path: Path) -> None:
    fig, ax = plt.subplots(figsize=(4, 3))
    for k in range(6):
        ax.plot(range(50), [(i * (k + 1)) % 17 for i in range(50)], marker="o")
    plain = tmp_path / "plain.png"
    fig.savefig(plain, dpi=100)
    small = save_png(fig, tmp_path / "small.png", dpi=100)
    plt.close(fig)
    with Image.open(plain) as a, Image.open(small) as b:
        assert a.mode == "RGBA" and b.mode == "P"
        assert a.size == b.size
        # Pixels keep their colours up to the palette's rounding (edge pixels the most).
        # (As arrays: Image.getdata is deprecated from Pillow 12 and goes in Pillow 14.)
        rgb_a, rgb_b = (np.asarray(im.convert("RGB"), dtype=np.int16) for im in (a, b))
        diff = np.abs(rgb_a - rgb_b)
    assert diff.max() <= 64 and diff.mean() < 1
    assert small.stat().st_size < plain.stat().st_size


def test_save_png_leaves_other_formats_alone(tmp_path: Path) -> None:
    fig, _ = plt.subplots()
    out = save_png(fig, tmp_path / "figure.svg", dpi=100)
    plt.close(fig)
    assert out.read_text().lstrip().startswith("<?xml")
