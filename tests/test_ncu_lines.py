"""tools/hopper/ncu_lines.py on hand-made exports in Nsight Compute's formats: source lines and
their instructions from the ``cuda,sass`` text page, stall reasons from the SASS CSV page."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from tools.hopper import ncu_lines


def _row(key: str, text: str, metrics: list[int] | None = None) -> str:
    """One physical line of the text export: key (line number or indented address), text from
    character 19, metrics from character 80."""
    line = f"{key:<19}{text:<61}"
    return line + "  ".join(str(m) for m in metrics) if metrics else line.rstrip()


def _section(path: str, function: str, rows: list[str]) -> list[str]:
    return [
        "/*", f"File Path: {path}", "*/", "/*", f"Function Name: {function}", "*/",
        "-" * 20 + " " + "-" * 60, "Address            Source", "-" * 20, *rows,
    ]  # fmt: skip


def _exports(tmp_path: Path) -> tuple[Path, Path]:
    text = [
        # Kernel "ours": two files, sorted by path; line 12's source wraps onto a second line.
        *_section("/repo/a.py", "ours", [
            _row("12", "x = s * scale - lse"),
            _row("", "  [m, stage]", [300, 200, 300, 64]),
            "-" * 20,
            _row("    0x0010", "      FFMA R1, R2, UR6, -R3", [250, 180, 250, 32]),
            _row("    0x0020", "@!P0  MUFU.EX2 R1, R1", [50, 20, 50, 32]),
        ]),
        *_section("/repo/b.py", "ours", [
            _row("7", "cute.arch.barrier(...)", [100, 90, 100, 8]),
            "-" * 20,
            _row("    0x0030", "      BAR.SYNC.DEFER_BLOCKING 0x1, 0x100", [100, 90, 100, 8]),
        ]),
        # Kernel "theirs": its first path sorts before the last one's: a new kernel.
        *_section("/kit/fa.py", "theirs", [
            _row("40", "exp2(...)", [80, 10, 80, 32]),
            "-" * 20,
            _row("    0x0010", "      MUFU.EX2 R4, R4", [80, 10, 80, 32]),
        ]),
    ]  # fmt: skip
    lines = tmp_path / "lines.txt"
    lines.write_text("\n".join(text) + "\n")
    sass = tmp_path / "sass.csv"
    header = ["Address", "Source", "stall_short_sb", "stall_wait", "stall_barrier",
              "stall_short_sb (Not Issued)"]  # fmt: skip
    with open(sass, "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["Kernel Name", "ours"])
        out.writerow(header)
        out.writerow(["0x0010", "FFMA", "200", "50", "0", "150"])
        out.writerow(["0x0020", "MUFU.EX2", "0", "50", "0", "0"])
        out.writerow(["0x0030", "BAR.SYNC", "0", "10", "90", "0"])
        out.writerow(["Kernel Name", "theirs"])
        out.writerow(header)
        out.writerow(["0x0010", "MUFU.EX2", "0", "80", "0", "0"])
    return lines, sass


def test_lines_and_their_instructions_per_kernel(tmp_path: Path) -> None:
    lines, sass = _exports(tmp_path)
    kernels = ncu_lines.parse_lines(lines)
    assert [k["function"] for k in kernels] == ["ours", "theirs"]
    ours = kernels[0]["lines"]
    assert set(ours) == {("/repo/a.py", 12), ("/repo/b.py", 7)}
    # The wrapped source line's metrics come from its second physical line.
    assert (ours["/repo/a.py", 12]["samples"], ours["/repo/a.py", 12]["executed"]) == (300, 64)
    assert ours["/repo/a.py", 12]["source"] == "x = s * scale - lse"
    # A predicated instruction's opcode is read past its predicate.
    assert kernels[0]["addresses"]["0x0020"] == (("/repo/a.py", 12), "MUFU.EX2")
    # The same address in another kernel is that kernel's.
    assert kernels[1]["addresses"]["0x0010"] == (("/kit/fa.py", 40), "MUFU.EX2")

    ncu_lines.add_stalls(kernels, sass)
    # Both instructions of line 12 add up; the "(Not Issued)" column is left out.
    assert ours["/repo/a.py", 12]["stalls"] == {"short_sb": 200, "wait": 100}
    assert ours["/repo/b.py", 7]["stalls"] == {"barrier": 90, "wait": 10}
    assert kernels[1]["lines"]["/kit/fa.py", 40]["stalls"] == {"wait": 80}

    text = ncu_lines.report(kernels, ["ours", "theirs"], top=1)
    assert "## ours: 400 samples, 2 source lines" in text
    assert "| 300 | 75.0 | short_sb 200, wait 100 | 64 | a.py:12 |" in text
    assert "b.py:7 |" not in text  # top=1
    assert "by file: a.py 300, b.py 100" in text


def test_labels_must_name_every_kernel(tmp_path: Path) -> None:
    lines, _ = _exports(tmp_path)
    kernels = ncu_lines.parse_lines(lines)
    with pytest.raises(ValueError, match="--labels"):
        ncu_lines.report(kernels, ["ours"], top=5)
