"""save_png writes the figure, then re-encodes it as a palette PNG of the same size in pixels."""

from __future__ import annotations

from pathlib import Path

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
        pairs = zip(a.convert("RGB").getdata(), b.convert("RGB").getdata(), strict=True)
        diff = [abs(x - y) for pa, pb in pairs for x, y in zip(pa, pb, strict=True)]
    assert max(diff) <= 64 and sum(diff) / len(diff) < 1
    assert small.stat().st_size < plain.stat().st_size


def test_save_png_leaves_other_formats_alone(tmp_path: Path) -> None:
    fig, _ = plt.subplots()
    out = save_png(fig, tmp_path / "figure.svg", dpi=100)
    plt.close(fig)
    assert out.read_text().lstrip().startswith("<?xml")
