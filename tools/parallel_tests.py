"""Run several pytest selections at once, each with its own log and time limit.

On a fresh GPU machine most of a GPU test's time is compiling (Triton and CuTe-DSL kernels, one
CPU core each), so one pytest process runs far below what the machine can do: in session 54 four
selections run one after another all hit their limits, and the same selections in six processes
at once finished in 291 s (benchmarks/NOTES.md item 295). Each group is ``NAME=PYTEST ARGS``;
its output goes to ``OUT/NAME.log``; when every group has ended (or hit ``--timeout``) one line
per group says how it ended, followed by its failures.

    python3 -m tools.parallel_tests --out $OUT/r --timeout 500 \\
        "triton=tests/backends/test_gpu.py -k triton" "varlen=tests/backends/test_gpu_varlen.py"

``--every-gpu-test`` runs ``EVERY_GPU_TEST``, every ``-m gpu`` test in ten groups (about 6
minutes on a fresh H100 in session 73); ``--skip NAME`` leaves a group out.

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

# -rfEs: failures, errors and why each skipped test skipped, in the log.
PYTEST = [sys.executable, "-m", "pytest", "-q", "-rfEs", "-p", "no:cacheprovider"]
# pytest's last line: "3 passed, 1 skipped in 2.5s" (or with "failed", "error", ...).
SUMMARY = re.compile(r"\b\d+ (passed|failed|error|errors|skipped|deselected)\b.* in [\d.]+s")
NAME = re.compile(r"[A-Za-z0-9_.-]+")
# A progress line of pytest -q: one character per test, then the share done.
PROGRESS = re.compile(r"[.sxXFE]+\s*(\[\s*\d+%\])?")


_GPU = "tests/backends/test_gpu.py -m gpu -k"
_HOPPER = "not triton and not test_matches_fp32 and not test_bitwise and"
# Every GPU test, split so that no group takes much longer than the others (compiling is most
# of the time; each process compiles on one core). A CPU test checks that every test module
# with GPU tests is named here.
EVERY_GPU_TEST = (
    f"hopper_ref={_GPU} 'not triton and test_matches_fp32'",
    f"hopper_bits={_GPU} 'not triton and test_bitwise'",
    f"hopper_rest1={_GPU} '{_HOPPER} forward'",
    f"hopper_rest2={_GPU} '{_HOPPER} not forward'",
    "varlen=tests/backends/test_gpu_varlen.py -m gpu",
    "pre_post=tests/backends/hopper -m gpu",
    "api=tests/test_gpu_graphs.py tests/test_gpu_integrations.py tests/test_gpu_errors.py -m gpu",
    f"triton_ref={_GPU} 'triton and test_matches_fp32'",
    f"triton_rest={_GPU} 'triton and not test_matches_fp32'",
    "triton_cast=tests/backends/triton -m gpu",
)

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
    parser.add_argument("groups", nargs="*", help="NAME=PYTEST ARGS")
    parser.add_argument(
        "--every-gpu-test",
        action="store_true",
        help="add EVERY_GPU_TEST's groups (every -m gpu test)",
    )
    parser.add_argument(
        "--skip",
        action="append",
        default=[],
        metavar="NAME",
        help="leave out the group NAME (repeatable)",
    )
    parser.add_argument("--out", type=Path, required=True, help="folder of the NAME.log files")
    parser.add_argument("--timeout", type=float, default=500.0, help="seconds, for every group")
    args = parser.parse_args(argv)
    texts = [*(EVERY_GPU_TEST if args.every_gpu_test else ()), *args.groups]
    try:
        groups = [parse_group(text) for text in texts]
    except ValueError as error:
        parser.error(str(error))
    unknown = set(args.skip) - {group.name for group in groups}
    if unknown:
        parser.error(f"--skip {', '.join(sorted(unknown))}: no such group")
    groups = [group for group in groups if group.name not in args.skip]
    if not groups:
        parser.error("no groups to run (name some, or pass --every-gpu-test)")
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
