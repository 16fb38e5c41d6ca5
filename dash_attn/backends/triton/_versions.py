"""The Triton versions the kernels are known to work with, checked when the kernels are imported.

Imported for its side effect by ``launch``, ``fwd`` and ``bwd``: an unsupported Triton fails at
import with the installed version and the supported range, not later with a compiler error deep
in a kernel (or, worse, a kernel that compiles to something else). Kept free of torch so the
message also reaches users whose Triton import itself is what fails.

The range is what CI checks (the compile tests for sm_90a against both ends, the interpreter tests
at the oldest end); keep it in step with ``pyproject.toml`` and the README.
"""

from __future__ import annotations

import re

# [oldest, first unsupported) as (major, minor).
TRITON_OLDEST = (3, 6)
TRITON_FIRST_UNSUPPORTED = (3, 10)


def _dotted(version: tuple[int, int]) -> str:
    return ".".join(map(str, version))


TRITON_RANGE = f"triton>={_dotted(TRITON_OLDEST)},<{_dotted(TRITON_FIRST_UNSUPPORTED)}"


def triton_problem(version: str) -> str | None:
    """Why Triton ``version`` (``triton.__version__``) cannot run the kernels; None if it can."""
    match = re.match(r"(\d+)\.(\d+)", version)
    if match is None:
        return f"cannot read the Triton version {version!r}"
    installed = (int(match.group(1)), int(match.group(2)))
    if installed < TRITON_OLDEST:
        return f"Triton {version} is older than the oldest supported version"
    if installed >= TRITON_FIRST_UNSUPPORTED:
        return f"Triton {version} is newer than the newest supported version"
    return None


def require_supported_triton() -> None:
    """Raise ImportError naming the installed Triton and the supported range if they disagree."""
    try:
        import triton
    except ImportError as exc:
        raise ImportError(
            f"dash-attn's kernels need {TRITON_RANGE}, and triton cannot be imported ({exc}). "
            f'Install a supported one: python -m pip install "{TRITON_RANGE}"'
        ) from exc
    problem = triton_problem(triton.__version__)
    if problem is not None:
        raise ImportError(
            f"dash-attn's kernels support {TRITON_RANGE}: {problem}. "
            f'Install a supported one: python -m pip install "{TRITON_RANGE}"'
        )


require_supported_triton()
