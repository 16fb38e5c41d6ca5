"""tools/parallel_tests.py: pytest selections run at once, each to its own log, with a limit."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from tools import parallel_tests


def test_parse_group_splits_like_a_shell() -> None:
    group = parallel_tests.parse_group("tri=tests/a.py -k 'triton and not slow'")
    assert group == parallel_tests.Group("tri", ("tests/a.py", "-k", "triton and not slow"))
    for bad in ("tests/a.py", "=tests/a.py", "a b=tests/a.py", "name="):
        with pytest.raises(ValueError, match="group"):
            parallel_tests.parse_group(bad)


def test_groups_run_at_once_and_each_ends_its_own_way(tmp_path: Path, capsys) -> None:
    """Three groups: one passes, one fails (named in the summary), one outlives the limit and
    is stopped; they run concurrently (the sleeping one does not delay the others' logs),
    and the exit status says not every group passed."""
    tests = tmp_path / "cases"
    tests.mkdir()
    (tests / "test_ok.py").write_text("def test_a():\n    pass\n\ndef test_b():\n    pass\n")
    (tests / "test_bad.py").write_text("def test_c():\n    assert 1 == 2\n")
    (tests / "test_slow.py").write_text(
        "import time\n\ndef test_d():\n    pass\n\ndef test_e():\n    time.sleep(60)\n"
    )
    out = tmp_path / "logs"
    start = time.monotonic()
    status = parallel_tests.main([
        "--out", str(out), "--timeout", "8",
        f"ok={tests / 'test_ok.py'}", f"bad={tests / 'test_bad.py'}",
        f"slow={tests / 'test_slow.py'}",
    ])  # fmt: skip
    assert time.monotonic() - start < 30
    printed = capsys.readouterr().out
    assert status == 1
    assert "ok: exit 0: 2 passed" in printed
    assert "bad: exit 1: 1 failed" in printed and "FAILED" in printed and "test_c" in printed
    assert "slow: TIMED OUT (1 tests had passed)" in printed
    assert {p.name for p in out.iterdir()} == {"ok.log", "bad.log", "slow.log"}
    with pytest.raises(ValueError, match="differ"):
        parallel_tests.run_groups([parallel_tests.Group("a", ("x",))] * 2, out, 1.0)


def test_every_gpu_test_names_every_module_with_gpu_tests() -> None:
    """A module that marks tests ``gpu`` but is in no group of ``EVERY_GPU_TEST`` would never
    run in the device call that is meant to run them all (as `tests/backends/triton`'s cast
    tests did not in session 73's first call)."""
    root = Path(__file__).resolve().parent.parent
    groups = [parallel_tests.parse_group(text) for text in parallel_tests.EVERY_GPU_TEST]
    named = [root / arg for group in groups for arg in group.args if arg.startswith("tests/")]
    # A line of code (no string, no comment) that ends in the marker.
    marks_gpu = re.compile(r"^[^\"'#\n]*\bpytest\.mark\.gpu,?$", re.MULTILINE)
    with_gpu_tests = [path for path in (root / "tests").rglob("test_*.py")
                      if marks_gpu.search(path.read_text())]  # fmt: skip
    assert len(with_gpu_tests) >= 8
    for path in with_gpu_tests:
        assert any(path == p or p in path.parents for p in named), f"{path} is in no group"
    names = [group.name for group in groups]
    assert len(set(names)) == len(names)


def test_skip_leaves_groups_out_and_refuses_unknown_names(tmp_path: Path, capsys) -> None:
    tests = tmp_path / "test_one.py"
    tests.write_text("def test_a():\n    pass\n")
    out = tmp_path / "logs"
    assert parallel_tests.main(["--out", str(out), f"a={tests}", f"b={tests}", "--skip", "b"]) == 0
    assert "a: exit 0: 1 passed" in capsys.readouterr().out
    assert {p.name for p in out.iterdir()} == {"a.log"}
    for argv in (["--skip", "nope", f"a={tests}"], ["--skip", "a", f"a={tests}"], []):
        with pytest.raises(SystemExit):
            parallel_tests.main(["--out", str(out), *argv])
