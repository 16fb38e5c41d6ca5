"""The README's signature block of ``dash_attn_func`` / ``dash_attn_varlen_func`` is the
functions' own: every parameter, its default, in order, and the keyword-only marker."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import dash_attn  # noqa: E402

README = Path(__file__).resolve().parents[1] / "README.md"


def _spelled(func) -> list[str]:
    """The parameters as the README writes them: ``name`` or ``name=default`` (strings in
    double quotes), ``*`` before the first keyword-only one."""
    out: list[str] = []
    for param in inspect.signature(func).parameters.values():
        if param.kind is param.KEYWORD_ONLY and "*" not in out:
            out.append("*")
        if param.default is param.empty:
            out.append(param.name)
        else:
            out.append(f"{param.name}={param.default!r}".replace("'", '"'))
    return out


def _split(text: str) -> list[str]:
    """Comma-separated parameters, commas inside parentheses kept (``window_size=(-1, -1)``)."""
    return [p.strip() for p in re.split(r",\s*(?![^()]*\))", " ".join(text.split())) if p.strip()]


def test_readme_signatures_are_the_functions() -> None:
    if not README.is_file():
        pytest.skip("not a source checkout")
    block = re.search(r"```text\n(dash_attn_func\(.*?)```", README.read_text(), re.DOTALL)
    assert block is not None, "the README's signature block is gone"
    func_text, varlen_text = block.group(1).split("dash_attn_varlen_func(")
    func_params = _split(func_text.removeprefix("dash_attn_func(").rstrip().removesuffix(")"))
    assert func_params == _spelled(dash_attn.dash_attn_func)
    # The varlen line spells its own positional parameters, then "..., same as above".
    varlen_params = _split(varlen_text.rstrip().removesuffix(")"))
    assert varlen_params[-2:] == ["...", "same as above"]
    shown = varlen_params[:-2]
    full = _spelled(dash_attn.dash_attn_varlen_func)
    assert full[: len(shown)] == shown
    # "same as above": the rest is dash_attn_func's after q, k, v and what the line showed.
    rest = full[len(shown) :]
    assert rest == func_params[func_params.index(shown[-1]) + 1 :]
