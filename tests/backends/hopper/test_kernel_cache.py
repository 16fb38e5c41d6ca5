"""The disk cache of compiled hopper kernels (CPU: compile, export, load; no launch)."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

pytest.importorskip("cutlass")
pytest.importorskip("tvm_ffi")
torch = pytest.importorskip("torch")

from dash_attn.backends.hopper import bwd_launch, fwd_launch, kernel_cache  # noqa: E402

VARIANT = "t128_fq"  # a TVM-FFI launch (the disk cache serves only those)


def _compile_bwd():
    return bwd_launch.compile_bwd(
        torch.bfloat16, 64, causal=True, deterministic=True, block_m=128, block_n=128,
        variant=VARIANT,
    )  # fmt: skip


def _forget_compiled(monkeypatch: pytest.MonkeyPatch) -> None:
    """A fresh process's view: nothing compiled in memory."""
    monkeypatch.setattr(kernel_cache, "_memo", {})
    monkeypatch.setattr(fwd_launch, "_CACHE", {})


def _no_compile(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Make cute.compile record and refuse calls; returns the record."""
    calls: list[str] = []

    def refuse(*args, **kwargs):
        calls.append("compile")
        raise AssertionError("compiled although the disk cache had the kernel")

    monkeypatch.setattr(bwd_launch.cute, "compile", refuse)
    monkeypatch.setattr(fwd_launch.cute, "compile", refuse)
    return calls


def test_on_by_default_off_by_the_variable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Unset: the per-user default folder (XDG_CACHE_HOME, else ~/.cache).
    monkeypatch.delenv(kernel_cache.ENV_VAR, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert kernel_cache.cache_dir() == tmp_path / "xdg" / "dash_attn" / "kernels"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert kernel_cache.cache_dir() == tmp_path / "home" / ".cache" / "dash_attn" / "kernels"
    # Off: 0, off, false, no, empty (any case, spaces ignored).
    for off in ("0", "off", " OFF ", "false", "no", "  "):
        monkeypatch.setenv(kernel_cache.ENV_VAR, off)
        assert kernel_cache.cache_dir() is None, off
    _forget_compiled(monkeypatch)
    monkeypatch.chdir(tmp_path)
    _compile_bwd()
    assert not any(tmp_path.rglob("*.o"))


def test_unwritable_folder_compiles_without_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cache path that cannot be created (a file in the way) or written: a warning and an
    in-process compile, never a failed call."""
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv(kernel_cache.ENV_VAR, str(blocker / "cache"))
    with pytest.warns(RuntimeWarning, match="cannot use"):
        assert kernel_cache.cached_compile(("test", 2), lambda: "compiled") == "compiled"
    # A folder that exists but refuses new files (as a read-only one does for a non-root user).
    monkeypatch.setenv(kernel_cache.ENV_VAR, str(tmp_path / "readonly"))

    def refuse(path, *args, **kwargs):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(kernel_cache.os, "open", refuse)
    with pytest.warns(RuntimeWarning, match="not writable"):
        assert kernel_cache.cached_compile(("test", 3), lambda: "compiled") == "compiled"


def test_second_process_loads_instead_of_compiling(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(kernel_cache.ENV_VAR, str(tmp_path))
    _forget_compiled(monkeypatch)
    first = _compile_bwd()
    objects = list(tmp_path.glob(f"{kernel_cache.fingerprint()}/*.o"))
    assert len(objects) == 1 and objects[0].stat().st_size > 10_000
    assert not list(tmp_path.rglob("*.partial.o"))
    assert hasattr(first, "export_to_c")  # the freshly compiled kernel

    _forget_compiled(monkeypatch)
    calls = _no_compile(monkeypatch)
    loaded = _compile_bwd()
    assert calls == [] and callable(loaded) and not hasattr(loaded, "export_to_c")
    assert _compile_bwd() is loaded  # then the in-memory cache, as before

    # The forward goes through the same cache, under its own key.
    monkeypatch.undo()
    monkeypatch.setenv(kernel_cache.ENV_VAR, str(tmp_path))
    _forget_compiled(monkeypatch)
    fwd_launch.compile_fwd(128, torch.bfloat16, True, tvm_ffi=True)
    assert len(list(tmp_path.glob("*/*.o"))) == 2
    _forget_compiled(monkeypatch)
    calls = _no_compile(monkeypatch)
    assert callable(fwd_launch.compile_fwd(128, torch.bfloat16, True, tvm_ffi=True)) and calls == []


def test_a_broken_object_file_is_rebuilt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(kernel_cache.ENV_VAR, str(tmp_path))
    _forget_compiled(monkeypatch)
    _compile_bwd()
    (obj,) = tmp_path.glob("*/*.o")
    obj.write_bytes(b"not an object file")
    _forget_compiled(monkeypatch)
    with pytest.warns(RuntimeWarning, match="did not load"):
        rebuilt = _compile_bwd()
    assert hasattr(rebuilt, "export_to_c") and obj.stat().st_size > 10_000


def test_inspection_compiles_bypass_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Compiles that keep PTX/SASS (the compile tests) need the in-process object."""
    monkeypatch.setenv(kernel_cache.ENV_VAR, str(tmp_path / "cache"))
    _forget_compiled(monkeypatch)
    compiled = bwd_launch.compile_bwd(
        torch.bfloat16, 64, causal=False, deterministic=False, block_m=128, block_n=128,
        variant=VARIANT,
        extra_options=f"--keep-ptx --dump-dir {tmp_path / 'dump'}",
    )  # fmt: skip
    assert hasattr(compiled, "export_to_c") and compiled.__ptx__  # compiled here, PTX kept
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").rglob("*.o"))


def test_lock_timeout_compiles_without_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lock held elsewhere past the timeout: a warning and an in-process compile, no wait."""
    fcntl = pytest.importorskip("fcntl")
    monkeypatch.setenv(kernel_cache.ENV_VAR, str(tmp_path))
    monkeypatch.setattr(kernel_cache, "LOCK_TIMEOUT_S", 0.2)
    key = ("test", 1)
    folder = tmp_path / kernel_cache.fingerprint()
    folder.mkdir(parents=True)
    with open(folder / f"{kernel_cache.key_digest(key)}.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.warns(RuntimeWarning, match="could not lock"):
            assert kernel_cache.cached_compile(key, lambda: "compiled") == "compiled"


def test_fingerprint_follows_sources_and_versions(tmp_path: Path) -> None:
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text("x = 1\n")
    b.write_text("y = 2\n")
    base = kernel_cache.source_fingerprint([a, b], ("cutlass 4.8.1",))
    assert kernel_cache.source_fingerprint([b, a], ("cutlass 4.8.1",)) == base
    assert kernel_cache.source_fingerprint([a, b], ("cutlass 4.9.0",)) != base
    b.write_text("y = 3\n")
    assert kernel_cache.source_fingerprint([a, b], ("cutlass 4.8.1",)) != base
    # Keys: stable text for what the launchers put in them, different keys different names.
    key = (128, torch.bfloat16, True, False, 64, 128, "sm_90a", "", (("queue_dv", True),))
    assert kernel_cache.key_digest(key) == kernel_cache.key_digest(tuple(key))
    assert kernel_cache.key_digest(key) != kernel_cache.key_digest((*key[:2], False, *key[3:]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(kernel_cache.fingerprint()) == 32
