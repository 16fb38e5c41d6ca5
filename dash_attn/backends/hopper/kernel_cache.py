"""An on-disk cache of the compiled hopper kernels, shared by processes (on by default).

Compiling one kernel configuration takes 2-4 s, once per process: every rank of a distributed
job and every restart would pay it again. A kernel launched through TVM-FFI is exported as an
object file on its first compile and later processes load it (tens of ms) instead of compiling.

Where: ``DASH_ATTN_KERNEL_CACHE=/some/dir`` if set; ``0``, ``off``, ``false``, ``no`` or an
empty value turn the cache off; unset, ``$XDG_CACHE_HOME/dash_attn/kernels`` (by default
``~/.cache/dash_attn/kernels``). A folder that cannot be created or written means a warning
and an in-process compile, never a failed call.

Layout: ``<dir>/<fingerprint>/<key digest>.o``. The fingerprint covers what the object code
depends on besides the key: Python, nvidia-cutlass-dsl and apache-tvm-ffi versions and the
source of this package's kernels and launchers; a change to any of them starts a new folder
(old folders can be deleted at any time). The key is the launcher's own in-memory cache key
(head dim, dtype, mask, det/non-det, tiles, kernel options). One file lock per key serialises
the compile of a key across processes; a lock not obtained within ``LOCK_TIMEOUT_S`` means a
compile in-process without the cache (a warning, never a hang), and an object file that does
not load is deleted and rebuilt.

Loaded kernels were compared with fresh compiles on an H200: outputs bitwise equal
(``tools/hopper/check_kernel_cache.py``; benchmarks/NOTES.md, session 9, item 35).
"""

from __future__ import annotations

import functools
import hashlib
import os
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ENV_VAR = "DASH_ATTN_KERNEL_CACHE"
FUNCTION_NAME = "dash_attn_kernel"
LOCK_TIMEOUT_S = 120.0
_SOURCES = Path(__file__).resolve().parent


_OFF = ("", "0", "off", "false", "no")


def default_dir() -> Path:
    """``$XDG_CACHE_HOME/dash_attn/kernels``, ``~/.cache/dash_attn/kernels`` without it."""
    base = os.environ.get("XDG_CACHE_HOME", "").strip()
    return (Path(base).expanduser() if base else Path.home() / ".cache") / "dash_attn" / "kernels"


def cache_dir() -> Path | None:
    """The cache directory: ``DASH_ATTN_KERNEL_CACHE``, ``default_dir()`` when it is unset, None
    (no disk cache) when it says off."""
    value = os.environ.get(ENV_VAR)
    if value is None:
        return default_dir()
    value = value.strip()
    return None if value.lower() in _OFF else Path(value).expanduser()


def source_fingerprint(paths: list[Path], versions: tuple[str, ...]) -> str:
    """SHA-256 over ``versions`` and the names and bytes of ``paths`` (sorted by name)."""
    digest = hashlib.sha256()
    for version in versions:
        digest.update(version.encode() + b"\0")
    for path in sorted(paths, key=lambda p: p.name):
        data = path.read_bytes()
        digest.update(path.name.encode() + b"\0" + len(data).to_bytes(8, "little") + data)
    return digest.hexdigest()[:32]


@functools.cache
def fingerprint() -> str:
    """This installation's fingerprint (computed once per process)."""
    import cutlass
    import tvm_ffi

    versions = (
        f"python {sys.version_info.major}.{sys.version_info.minor}",
        f"cutlass {cutlass.__version__}",
        f"tvm_ffi {tvm_ffi.__version__}",
    )
    return source_fingerprint(sorted(_SOURCES.glob("*.py")), versions)


def key_digest(key: tuple) -> str:
    """A file name for ``key``: its ``repr`` is stable for the ints, strings, bools, tuples and
    torch dtypes the launchers' keys hold."""
    return hashlib.sha256(repr(key).encode()).hexdigest()[:40]


@contextmanager
def _exclusive(lock_path: Path, timeout_s: float) -> Iterator[bool]:
    """Hold an exclusive advisory lock on ``lock_path``; yields False if it was not obtained
    within ``timeout_s`` (or locks are unavailable) instead of waiting longer."""
    try:
        import fcntl
    except ImportError:  # not a POSIX system: no cross-process lock
        yield False
        return
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:  # a folder that is not writable
        yield False
        return
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError:
                if time.monotonic() > deadline:
                    yield False
                    return
                time.sleep(0.05)
        try:
            yield True
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _load(path: Path) -> Any:
    import cutlass.cute as cute

    return cute.runtime.load_module(str(path), enable_tvm_ffi=True)[FUNCTION_NAME]


def cached_compile(key: tuple, compile_fn: Callable[[], Any]) -> Any:
    """``compile_fn()`` (a TVM-FFI compiled kernel), through the disk cache when it is on.

    Returns the loaded function when ``key``'s object file exists, else compiles, exports the
    object file (written under a temporary name, then renamed, so a reader never sees half a
    file) and returns the freshly compiled kernel."""
    directory = cache_dir()
    if directory is None:
        return compile_fn()
    folder = directory / fingerprint()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # a read-only home, a file in the way: compile as without the cache
        warnings.warn(
            f"{ENV_VAR}: cannot use {folder} ({type(exc).__name__}: {exc}); compiling without "
            f"the disk cache (set {ENV_VAR} to a writable folder, or to 0 to silence this)",
            RuntimeWarning,
            stacklevel=2,
        )
        return compile_fn()
    name = key_digest(key)
    obj = folder / f"{name}.o"
    with _exclusive(folder / f"{name}.lock", LOCK_TIMEOUT_S) as locked:
        if not locked:
            warnings.warn(
                f"{ENV_VAR}: could not lock {folder / name}.lock within {LOCK_TIMEOUT_S:g} s "
                "(held by another process, or the folder is not writable); compiling without "
                "the disk cache",
                RuntimeWarning,
                stacklevel=3,
            )
            return compile_fn()
        if obj.exists():
            try:
                return _load(obj)
            except Exception as exc:  # a truncated or foreign file: rebuild it
                warnings.warn(
                    f"{ENV_VAR}: {obj} did not load ({type(exc).__name__}: {exc}); recompiling",
                    RuntimeWarning,
                    stacklevel=3,
                )
                obj.unlink(missing_ok=True)
        compiled = compile_fn()
        partial = folder / f"{name}.{os.getpid()}.partial.o"
        try:
            compiled.export_to_c(str(partial), function_name=FUNCTION_NAME)
            os.replace(partial, obj)
        except Exception as exc:  # a full disk must not fail the call that compiled fine
            partial.unlink(missing_ok=True)
            warnings.warn(
                f"{ENV_VAR}: could not write {obj} ({type(exc).__name__}: {exc})",
                RuntimeWarning,
                stacklevel=3,
            )
        return compiled


# Compiled kernels of this process by key (what ``compile_once`` returns again).
_memo: dict[tuple, Any] = {}
_memo_lock = threading.Lock()


def compile_once(key: tuple, compile_fn: Callable[[], Any], *, disk: bool = True) -> Any:
    """``compile_fn()`` once per process and ``key``: from memory, else through the disk cache
    (``cached_compile``; ``disk=False`` for compiles that keep PTX/SASS for inspection). Two
    threads that miss together both compile; both get the first result stored."""
    with _memo_lock:
        compiled = _memo.get(key)
    if compiled is None:
        compiled = cached_compile(key, compile_fn) if disk else compile_fn()
        with _memo_lock:
            compiled = _memo.setdefault(key, compiled)
    return compiled
