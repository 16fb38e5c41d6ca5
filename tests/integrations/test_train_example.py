"""``examples/train_tiny_llama.py`` on the CPU: its comparison, one process, and the distributed
glue (DDP and FSDP2 under torchrun, gloo backend, transformers' eager attention) with two ranks.
The dash-attn runs of the example are GPU runs (``tests/test_gpu_integrations.py``)."""

from __future__ import annotations

import importlib.util
import math
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "train_tiny_llama.py"
TINY = ["--device", "cpu", "--attn", "eager", "--tiny", "--seqlen", "24", "--batch", "2"]


@pytest.fixture(scope="module")
def example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("train_tiny_llama", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    # Dataclasses look their module up in sys.modules while the class is built.
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _result(example: ModuleType, losses: list[float], weight: float) -> object:
    return example.RunResult(torch.tensor(losses), {"w": torch.full((2, 2), weight)})


def test_compare_finds_identical_runs(example: ModuleType) -> None:
    a = _result(example, [3.0, 2.5, 2.0], 1.0)
    b = _result(example, [3.0, 2.5, 2.0], 1.0)
    assert example.compare(a, b) == []


def test_compare_names_the_first_differing_step_and_weight(example: ModuleType) -> None:
    a = _result(example, [3.0, 2.5, 2.0], 1.0)
    b = _result(example, [3.0, 2.5 + 1e-6, 2.0], 1.0 + 2**-20)
    problems = example.compare(a, b)
    assert problems[0] == "losses differ from step 1 on"
    assert problems[1].startswith("w: final weights differ (max |Δ| 9.54e-07)")


def test_compare_sees_minus_zero(example: ModuleType) -> None:
    # Bitwise means bitwise: -0.0 == 0.0 numerically, but the bits differ.
    a = _result(example, [0.0], 0.0)
    b = _result(example, [-0.0], 0.0)
    assert example.compare(a, b) == ["losses differ from step 0 on"]


def test_single_process_runs_are_identical_and_plotted(
    example: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("transformers")
    status = example.main([*TINY, "--steps", "3", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert status == 0, out
    assert "two runs: bitwise identical" in out
    plot = tmp_path / "loss_eager_none_1.png"
    assert plot.read_bytes()[:4] == b"\x89PNG"


def test_wrapping_without_torchrun_is_refused(
    example: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(SystemExit, match="--ddp needs torchrun"):
        example.main([*TINY, "--ddp"])


@pytest.mark.parametrize("wrap", ["--ddp", "--fsdp"])
def test_two_ranks_under_torchrun_are_identical(wrap: str, tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
        str(SCRIPT), *TINY, "--steps", "2", wrap, "--out", str(tmp_path),
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    name = wrap.removeprefix("--")
    assert f"attn=eager, {name} x2, 2 steps" in done.stdout
    assert "two runs: bitwise identical" in done.stdout
    assert (tmp_path / f"loss_eager_{name}_2.png").exists()


@pytest.mark.interpreter
@pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1", reason="needs TRITON_INTERPRET=1 before import"
)
@pytest.mark.filterwarnings("ignore:Conversion of an array with ndim > 0:DeprecationWarning")
def test_dash_runs_identical_in_the_interpreter(
    example: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The example's dash path with the real kernels (float16, the interpreter's dtype).
    pytest.importorskip("transformers")
    argv = ["--device", "cpu", "--attn", "dash", "--tiny", "--dtype", "fp16", "--seqlen", "40",
            "--batch", "2", "--steps", "2", "--out", str(tmp_path)]  # fmt: skip
    status = example.main(argv)
    out = capsys.readouterr().out
    assert status == 0, out
    assert "attn=dash, single x1, 2 steps" in out
    assert "two runs: bitwise identical" in out
    # fp16 weights stay finite through AdamW's steps (its eps is one fp16 can hold).
    assert math.isfinite(_final_loss(out)), out


@pytest.mark.interpreter
@pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1", reason="needs TRITON_INTERPRET=1 before import"
)
def test_dash_ddp_two_ranks_identical_in_the_interpreter(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
        str(SCRIPT), "--device", "cpu", "--attn", "dash", "--tiny", "--dtype", "fp16",
        "--seqlen", "40", "--batch", "2", "--steps", "2", "--ddp", "--out", str(tmp_path),
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "attn=dash, ddp x2, 2 steps" in done.stdout
    assert "two runs: bitwise identical" in done.stdout
    assert math.isfinite(_final_loss(done.stdout)), done.stdout


def _final_loss(out: str) -> float:
    """The loss of the last step, as the example prints it."""
    found = re.search(r"final loss (\S+)", out)
    assert found is not None, out
    return float(found.group(1))
