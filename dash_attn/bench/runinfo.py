"""The run's record: machine and software header, git commit, deadline, log file, progress lines.

Works without torch or triton (``machine_info`` then says so), so the no-GPU path of
``dash-attn bench`` and ``python -m dash_attn.bench.e2e`` can print the header anywhere.
"""

from __future__ import annotations

import datetime as dt
import importlib.metadata
import io
import math
import platform
import re
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any, TextIO

# Seconds an optional stage needs at least (rough, from H200 runs of this harness); with
# --deadline-s a stage that does not fit is skipped rather than cut off by an outer time limit.
STAGE_RESERVE_S = {"report": 15.0, "determinism": 30.0, "e2e": 90.0, "model": 25.0}


def _git_commit() -> str:
    root = Path(__file__).resolve().parents[2]
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"],
            cwd=root, capture_output=True, text=True, timeout=10, check=True,
        ).stdout.strip()  # fmt: skip
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root, capture_output=True, text=True, timeout=10, check=True,
        ).stdout.strip()  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{sha}-dirty" if dirty and sha else (sha or "unknown")


def _driver_version() -> str | None:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=20, check=True,
        ).stdout  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    lines = [line.strip() for line in out.splitlines() if line.strip()]
    return lines[0] if lines else None


def _dist_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def machine_info(commit: str | None = None) -> dict[str, Any]:
    """GPU, SM count, driver, CUDA, torch, triton, cuDNN, FA4, commit, date; ``cuda_available``.

    Works without torch or triton (their fields then say so), so the no-GPU path can print it.
    """
    info: dict[str, Any] = {
        "gpu": "none",
        "sm_count": None,
        "driver": None,
        "cuda": None,
        "torch": "not installed",
        "triton": "not installed",
        "cudnn": None,
        "flash_attn_4": _dist_version("flash-attn-4"),
        "python": platform.python_version(),
        "commit": commit or _git_commit(),
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "cuda_available": False,
    }
    try:
        import torch
    except ImportError:
        return info
    info["torch"] = torch.__version__
    info["cuda"] = torch.version.cuda
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        pass
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        info.update(
            gpu=props.name,
            sm_count=props.multi_processor_count,
            driver=_driver_version(),
            cuda_available=True,
        )
        if torch.backends.cudnn.is_available():
            info["cudnn"] = torch.backends.cudnn.version()
    return info


def gpu_slug(name: str) -> str:
    """``"NVIDIA H200"`` -> ``"h200"``: the default results folder of a GPU."""
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower().replace("nvidia", "")).strip("-")
    return slug or "gpu"


# ------------------------------------------------------------------------------------------------
# Run-time helpers


class Deadline:
    """Seconds left of ``--deadline-s`` (infinite without one)."""

    def __init__(self, seconds: float | None) -> None:
        self.start = time.monotonic()
        self.end = None if seconds is None else self.start + seconds

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def remaining(self) -> float:
        return math.inf if self.end is None else self.end - time.monotonic()

    def allows(self, stage: str) -> bool:
        return self.remaining() >= STAGE_RESERVE_S.get(stage, 0.0)


class _Tee(io.TextIOBase):
    """Writes to a stream and to the log file."""

    def __init__(self, stream: TextIO, log: TextIO) -> None:
        self.stream, self.log = stream, log

    def write(self, text: str) -> int:
        self.stream.write(text)
        self.log.write(text)
        return len(text)

    def flush(self) -> None:
        self.stream.flush()
        self.log.flush()

    def isatty(self) -> bool:
        return self.stream.isatty()

    def fileno(self) -> int:
        # Code that writes to the file descriptor (subprocesses) bypasses the log, not the screen.
        return self.stream.fileno()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self.stream, "encoding", None) or "utf-8"


class LogTo:
    """Copy stdout and stderr into ``path`` for the duration of a ``with`` block (after what the
    file holds with ``append=True``: a run that adds to an earlier one's results)."""

    def __init__(self, path: Path, append: bool = False) -> None:
        self.path = path
        self.append = append

    def __enter__(self) -> LogTo:
        self.file = self.path.open("a" if self.append else "w", buffering=1)
        self.saved = sys.stdout, sys.stderr
        sys.stdout = _Tee(sys.stdout, self.file)
        sys.stderr = _Tee(sys.stderr, self.file)
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is not None:
            # The interpreter prints the traceback after we are gone: keep a copy in the log.
            traceback.print_exception(exc_type, exc, tb, file=self.file)
        sys.stdout, sys.stderr = self.saved
        self.file.close()


class Progress:
    """A tqdm bar on an interactive terminal; plain numbered lines otherwise.

    tqdm redraws with carriage returns, which turns a captured log into one unreadable line, so it
    is only used when stderr is a terminal (and when tqdm is installed).
    """

    def __init__(self, total: int, desc: str) -> None:
        self.total, self.desc, self.count = total, desc, 0
        self.bar: Any = None
        stream = sys.__stderr__
        if stream is not None and stream.isatty():
            try:
                from tqdm import tqdm
            except ImportError:
                tqdm = None
            if tqdm is not None:
                self.bar = tqdm(total=total, desc=desc, file=stream, leave=False)

    def done(self, message: str) -> None:
        self.count += 1
        line = f"[{self.count:>{len(str(self.total))}}/{self.total}] {message}"
        if self.bar is not None:
            self.bar.update(1)
            self.bar.write(line, file=sys.stdout)
        else:
            print(line, flush=True)

    def note(self, message: str) -> None:
        if self.bar is not None:
            self.bar.write(message, file=sys.stdout)
        else:
            print(message, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
