"""The kernels refuse an unsupported Triton at import, naming the version and the range."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

triton = pytest.importorskip("triton")

from dash_attn.backends.triton import _versions  # noqa: E402


@pytest.mark.parametrize("version", ["3.6.0", "3.6.0+git1234", "3.9.0", "3.9.9rc1"])
def test_supported_versions(version: str) -> None:
    assert _versions.triton_problem(version) is None


@pytest.mark.parametrize(
    "version, why",
    [("3.5.1", "older"), ("2.3.1", "older"), ("3.10.0", "newer"), ("4.0.0", "newer")],
)
def test_unsupported_versions(version: str, why: str) -> None:
    assert why in _versions.triton_problem(version)


def test_import_names_installed_version_and_range(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(triton, "__version__", "3.5.1")
    with pytest.raises(ImportError, match=r"triton>=3\.6,<3\.10: Triton 3\.5\.1 is older"):
        _versions.require_supported_triton()


def test_installed_triton_is_supported() -> None:
    # The environment the tests run in is one the package claims (CI pins both ends).
    assert _versions.triton_problem(triton.__version__) is None, triton.__version__


ROOT = Path(__file__).resolve().parents[3]


def test_range_matches_pyproject() -> None:
    # One range, three places: the check, pyproject's dependency and the README.
    assert f'"{_versions.TRITON_RANGE}"' in (ROOT / "pyproject.toml").read_text()
    assert _versions.TRITON_RANGE in (ROOT / "README.md").read_text()


def test_ci_runs_both_ends_of_the_range() -> None:
    ci = ROOT / ".ci" / "run"
    if not ci.is_file():
        pytest.skip("not a source checkout")
    pins = dict(re.findall(r"^triton_(oldest|newest)=(\S+)$", ci.read_text(), re.MULTILINE))
    oldest, newest = (tuple(map(int, pins[end].split(".")[:2])) for end in ("oldest", "newest"))
    assert oldest == _versions.TRITON_OLDEST
    assert _versions.TRITON_OLDEST <= newest < _versions.TRITON_FIRST_UNSUPPORTED
    # The minor release just below the bound, so the top of the range is what CI checks (a bound
    # like 4.0 has no such minor: then only the range check above applies).
    major, minor = _versions.TRITON_FIRST_UNSUPPORTED
    if minor > 0:
        assert newest == (major, minor - 1)
