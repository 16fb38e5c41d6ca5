"""The kernels refuse an unsupported Triton at import, naming the version and the range."""

from __future__ import annotations

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


def test_range_matches_pyproject() -> None:
    # One range, three places: the check, pyproject's dependency and the README.
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    assert f'"{_versions.TRITON_RANGE}"' in (root / "pyproject.toml").read_text()
    assert _versions.TRITON_RANGE in (root / "README.md").read_text()
