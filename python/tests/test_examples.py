"""The examples in examples/ run, so they cannot rot. On any machine each one's --help must work (its imports
resolve: torch, transformers, dash_attn). On a Hopper GPU each runs as a user runs it, in a subprocess with the
library under test: the GPT example must report bitwise-identical deterministic runs (it exits 1 otherwise), and
the Hugging Face example must fit its data and repeat its bits (--twice), and the context-parallel example must
lower its loss and repeat its bits with P processes sharing the GPU. The context-parallel example also runs on
the CPU, in CI (gloo, the pure-torch kernel): two processes repeat their bits, and its negative control (three
processes, gradients summed in another order) must be reported as different. The GPU tests skip, saying why,
without a Hopper GPU or without the head-dim-64 bf16 kernels the examples use.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="the examples need PyTorch")
import torch  # noqa: E402

import dash_attn  # noqa: E402

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
# The examples' model: head dim 64 in bf16 (autocast).
HEAD_DIM = 64
# A deterministic run per example on the H200 takes seconds; the bound only keeps a hang from blocking the suite.
TIMEOUT_S = 900


def run_example(name: str, *args: str) -> subprocess.CompletedProcess:
    """The example as a user runs it: `python examples/NAME ARGS`, seeing this session's package and library."""
    package_parent = str(Path(dash_attn.__file__).resolve().parents[1])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (package_parent, os.environ.get("PYTHONPATH"))))
    return subprocess.run(
        [sys.executable, str(EXAMPLES / name), *args],
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=TIMEOUT_S,
    )


@pytest.mark.parametrize("name", ["gpt_determinism.py", "hf_finetune.py", "context_parallel.py"])
def test_example_imports_resolve(name: str) -> None:
    if name == "hf_finetune.py":
        pytest.importorskip("transformers", reason="the Hugging Face example needs transformers")
    result = run_example(name, "--help")
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith("usage:")


def test_gpt_trains_bitwise_reproducibly(device, require_kernel) -> None:
    require_kernel(HEAD_DIM, torch.bfloat16)
    result = run_example("gpt_determinism.py", "--steps", "200")
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "deterministic=True,  two runs: all 200 losses and all" in output
    assert "weight tensors bitwise identical" in output
    assert "deterministic=False, two runs: " in output


def test_hugging_face_example_fits_and_repeats(device, require_kernel, tmp_path: Path) -> None:
    pytest.importorskip("transformers", reason="the Hugging Face example needs transformers")
    require_kernel(HEAD_DIM, torch.bfloat16)
    result = run_example("hf_finetune.py", "--twice", "--output", str(tmp_path / "model"))
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "attn_implementation='dash_attn'" in output
    assert "losses and weights bitwise identical" in output
    assert (tmp_path / "model" / "config.json").is_file()


def _context_parallel_output(*args: str) -> str:
    result = run_example("context_parallel.py", *args)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "loss fell from" in output and ": yes" in output
    return output


def test_context_parallel_trains_bitwise_reproducibly_on_the_cpu() -> None:
    output = _context_parallel_output("--device", "cpu", "--world-size", "2", "--steps", "12")
    assert "2 processes on cpu" in output
    assert "two runs: all 12 losses and all" in output and "weight tensors bitwise identical" in output


def test_context_parallel_negative_control_is_caught_on_the_cpu() -> None:
    output = _context_parallel_output("--device", "cpu", "--world-size", "3", "--steps", "6", "--control")
    assert "weight tensors DIFFERENT" in output


def test_context_parallel_trains_bitwise_reproducibly_on_the_gpu(device, require_kernel) -> None:
    require_kernel(HEAD_DIM, torch.bfloat16)
    output = _context_parallel_output("--device", "cuda", "--world-size", "2", "--steps", "30")
    assert "DASH's kernels, bf16" in output
    assert "two runs: all 30 losses and all" in output and "weight tensors bitwise identical" in output
