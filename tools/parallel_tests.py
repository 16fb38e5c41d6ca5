"""Run several pytest selections at once, each with its own log and time limit.

On a fresh GPU machine most of a GPU test's time is compiling (Triton and CuTe-DSL kernels, one
CPU core each), so one pytest process runs far below what the machine can do: in session 54 four
selections run one after another all hit their limits, and the same selections in six processes
at once finished in 291 s (benchmarks/NOTES.md item 295). Each group is ``NAME=PYTEST ARGS``;
its output goes to ``OUT/NAME.log``; when every group has ended (or hit ``--timeout``) one line
per group says how it ended, followed by its failures.

    python3 -m tools.parallel_tests --out $OUT/r --timeout 500 \\
        "triton=tests/backends/test_gpu.py -k triton" "varlen=tests/backends/test_gpu_varlen.py"

The exit status is 0 only if every group's pytest passed (exit status 0) within its time.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

PYTEST = [sys.executable, "-m", "pytest", "-q", "-rfE", "-p", "no:cacheprovider"]
# pytest's last line: "3 passed, 1 skipped in 2.5s" (or with "failed", "error", ...).
SUMMARY = re.compile(r"\b\d+ (passed|failed|error|errors|skipped|deselected)\b.* in [\d.]+s")
NAME = re.compile(r"[A-Za-z0-9_.-]+")
# A progress line of pytest -q: one character per test, then the share done.
PROGRESS = re.compile(r"[.sxXFE]+\s*(\[\s*\d+%\])?")


# A group's log text and pytest's exit status (None: stopped at the time limit).
Ended = tuple[str, int | None]


@dataclass(frozen=True)
class Group:
    """One pytest selection: ``name`` (its log is ``name.log``) and pytest's arguments."""

    name: str
    args: tuple[str, ...]


def parse_group(text: str) -> Group:
    """``NAME=ARGS`` -> Group; ARGS split as a shell would (quotes keep ``-k`` expressions)."""
    name, sep, args = text.partition("=")
    if not sep or not NAME.fullmatch(name):
        raise ValueError(f"group {text!r}: expected NAME=PYTEST ARGS, NAME of letters, digits, _.-")
    parts = tuple(shlex.split(args))
    if not parts:
        raise ValueError(f"group {name!r}: no pytest arguments")
    return Group(name, parts)


def outcome(log: str, returncode: int | None) -> str:
    """One line: how a group ended (``returncode`` None: stopped at its time limit)."""
    summary = next((line.strip("= ") for line in reversed(log.splitlines())
                    if SUMMARY.search(line)), None)  # fmt: skip
    if returncode is None:
        # pytest -q prints a dot per passed test; the count tells how far it got.
        dots = sum(line.count(".") for line in log.splitlines() if PROGRESS.fullmatch(line))
        return f"TIMED OUT ({dots} tests had passed)"
    if summary is None:
        return f"exit {returncode}, no pytest summary"
    return f"exit {returncode}: {summary}"


def run_groups(groups: list[Group], out: Path, timeout_s: float) -> dict[str, Ended]:
    """Start every group at once, wait for all (each stopped with its process group at
    ``timeout_s``); -> {name: (log text, exit status or None if stopped)}."""
    if len({g.name for g in groups}) != len(groups):
        raise ValueError("group names must differ (each writes NAME.log)")
    out.mkdir(parents=True, exist_ok=True)
    running = {}
    for group in groups:
        log = open(out / f"{group.name}.log", "w")  # noqa: SIM115 (closed below)
        # Unbuffered: a group stopped at its limit keeps the progress it had printed.
        proc = subprocess.Popen(
            [*PYTEST, *group.args], stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )  # fmt: skip
        running[group.name] = (proc, log)
    deadline = time.monotonic() + timeout_s
    codes: dict[str, int | None] = {}
    for name, (proc, log) in running.items():
        try:
            codes[name] = proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            codes[name] = None
        log.close()
    return {name: ((out / f"{name}.log").read_text(errors="replace"), codes[name])
            for name in running}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("groups", nargs="+", help="NAME=PYTEST ARGS")
    parser.add_argument("--out", type=Path, required=True, help="folder of the NAME.log files")
    parser.add_argument("--timeout", type=float, default=500.0, help="seconds, for every group")
    args = parser.parse_args(argv)
    try:
        groups = [parse_group(text) for text in args.groups]
    except ValueError as error:
        parser.error(str(error))
    start = time.monotonic()
    results = run_groups(groups, args.out, args.timeout)
    ok = True
    for name, (log, code) in results.items():
        print(f"{name}: {outcome(log, code)}")
        for line in log.splitlines():
            if line.startswith(("FAILED", "ERROR")):
                print(f"  {line[:200]}")
        ok &= code == 0
    print(f"{len(groups)} groups in {time.monotonic() - start:.0f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
