"""tools/parallel_tests.py: pytest selections run at once, each to its own log, with a limit."""

from __future__ import annotations

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
