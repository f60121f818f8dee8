"""dash_attn.parallel's real code path on DASH's kernels on ONE Hopper GPU: P = 1, 2 and 4 processes share the
GPU, joined by gloo, with HostStagedTransport moving the ring's shifts and the all-to-all exchanges through host
memory (NCCL refuses two ranks on one device). Everything else is the module's own code: the ring and all-to-all
modes, DashLocalAttention, the LSE merge and the gradient accumulators. Skips, saying why, without a Hopper GPU,
the library, its head-dim-128 bf16 kernels (and varlen kernels) or gloo.

Cases (bf16, head_dim 128, 8 query heads, 1024 tokens): ring and all-to-all, causal and full, GQA and MQA, a
sliding window, packed batches (ragged lengths down to one token per chunk at P = 4, one sequence empty) with and
without a window, sm_margin 8. Checks, for every case and P:
- P = 1 gives the bits of single-GPU DASH (flash_attn_func with the same arguments, backward by autograd) for out,
  LSE and gradients; packed without a window: out and LSE bitwise equal to flash_attn_varlen_func, gradients
  within the bound below (both run one varlen backward, but the ring's call leaves the empty sequence out, and
  schedule "auto" is planned for the batch); whether the rest matches bit for bit is printed, not asserted;
- P > 1 is within a factor of single-GPU DASH's error plus a floor, a fraction of the largest reference value, both
  against a float64 reference of the same bf16 inputs, per field (BOUNDS):
  - out and LSE: DASH's local kernel hands the merge each block's partial out in fp32 (before its rounding to bf16)
    and the merge runs in fp32, so out is rounded to bf16 once, as on one GPU. What remains is the fp32 merge (about
    2^-22 relative) and the other split of the keys, whose bf16 probabilities round differently: the rounding to bf16
    can then land one ulp (2^-8 relative) the other way where single-GPU DASH's half-ulp error sits, at a few
    elements. 1.25 times single-GPU DASH's error plus 2^-10 of the largest value covers that;
  - dq, dk, dv: the backward still rounds each block's partial gradients to bf16 (relative 2^-9) before the fp32
    sums, and a row has at most 2P = 8 such partials here (two per step under a window), whose roundings, of random
    sign, add up to about 2^-9 * sqrt(8) = 2^-7.5 of the partials' scale: twice single-GPU DASH's error plus 2^-7 of
    the largest reference value covers them;
- two runs give bitwise identical out, LSE and gradients;
- negative control: with the nondeterministic local schedule (deterministic=False, dQ summed by atomics), the
  same comparison must report different gradient bits over repeats.

Run: DASH_ATTN_LIBRARY=build/libdash_attn_c.so PYTHONPATH=python python -m pytest -q -rs -s \
python/tests/test_parallel_one_gpu.py
"""

from __future__ import annotations

import dataclasses
import datetime
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="dash_attn needs PyTorch")

import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

from dash_attn import flash_attn_func, flash_attn_varlen_func, parallel  # noqa: E402

PROCESSES = 4
WORLD_SIZES = (1, 2, 4)
BATCH, SEQLEN, HEADS, HEAD_DIM = 2, 1024, 8, 128
DTYPE = torch.bfloat16
# Ragged lengths, each a multiple of 2P for P in WORLD_SIZES (8 tokens: one per zigzag chunk at P = 4), one empty.
PACKED_OFFSETS = (0, 248, 256, 256, 768, 1024)
COLLECTIVE_TIMEOUT = datetime.timedelta(seconds=60)
WORKERS_TIMEOUT_S = 240
FIELDS = ("out", "lse", "dq", "dk", "dv")
# field -> (factor of single-GPU DASH's error, floor as a fraction of the largest reference value); the docstring says
# why each.
FP32_PARTIALS_BOUND = (1.25, 2.0**-10)
BF16_PARTIALS_BOUND = (2.0, 2.0**-7)
BOUNDS = {
    "out": FP32_PARTIALS_BOUND,
    "lse": FP32_PARTIALS_BOUND,
    "dq": BF16_PARTIALS_BOUND,
    "dk": BF16_PARTIALS_BOUND,
    "dv": BF16_PARTIALS_BOUND,
}
# The negative control: enough query rows per rank and repeats that dQ's atomics land in another order.
CONTROL_SEQLEN, CONTROL_REPEATS = 4096, 8


@dataclasses.dataclass(frozen=True)
class Case:
    mode: str
    causal: bool
    heads_kv: int
    layout: str = "zigzag"
    window: tuple[int, int] = (-1, -1)
    packed: bool = False
    sm_margin: int = 0

    @property
    def name(self) -> str:
        mask = "causal" if self.causal else "full"
        window = "" if self.window == (-1, -1) else f"-window{self.window[0]}_{self.window[1]}"
        packed = "-packed" if self.packed else ""
        return f"{self.mode}-{mask}-kv{self.heads_kv}-{self.layout}{window}{packed}-margin{self.sm_margin}"


CASES = [
    Case("ring", True, 2),
    Case("ring", False, 1),
    Case("ring", True, HEADS, sm_margin=8),
    Case("ring", True, 2, window=(100, -1)),
    Case("ring", False, 2, window=(60, 30)),
    Case("ulysses", True, 2),
    Case("ulysses", False, 1, layout="contiguous"),
    Case("ring", True, 2, packed=True),
    Case("ring", True, 2, window=(64, -1), packed=True),
    Case("ulysses", True, 2, packed=True),
]
CONTROL = Case("ring", True, 2)


def _inputs(case: Case, device: torch.device, seqlen: int = SEQLEN) -> dict[str, torch.Tensor]:
    generator = torch.Generator(device=device).manual_seed(1000 * case.heads_kv + case.causal)
    tokens = (PACKED_OFFSETS[-1],) if case.packed else (BATCH, seqlen)
    shapes = {
        "q": (*tokens, HEADS, HEAD_DIM),
        "k": (*tokens, case.heads_kv, HEAD_DIM),
        "v": (*tokens, case.heads_kv, HEAD_DIM),
        "dout": (*tokens, HEADS, HEAD_DIM),
    }
    return {n: torch.randn(s, generator=generator, device=device, dtype=DTYPE) for n, s in shapes.items()}


def _shard(case: Case, t: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    if case.packed:
        return parallel.shard_packed(t, PACKED_OFFSETS, rank, world_size, case.layout)
    return parallel.shard_sequence(t, rank, world_size, case.layout).contiguous()


def _gather(case: Case, shards: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    result = {}
    for f in FIELDS:
        parts = [s[f] for s in shards]
        if case.packed:
            result[f] = parallel.gather_packed(parts, PACKED_OFFSETS, case.layout, dim=int(f == "lse"))
        else:
            result[f] = parallel.gather_sequence(parts, case.layout, dim=2 if f == "lse" else 1)
    return result


def _context_parallel(case, shards, group, deterministic=True) -> dict[str, torch.Tensor]:
    q, k, v = (shards[n].clone().requires_grad_() for n in ("q", "k", "v"))
    out, lse = parallel.context_parallel_attn_func(
        q,
        k,
        v,
        group=group,
        mode=case.mode,
        causal=case.causal,
        window_size=case.window,
        cu_seqlens=PACKED_OFFSETS if case.packed else None,
        layout=case.layout,
        deterministic=deterministic,
        sm_margin=case.sm_margin,
        transport=parallel.HostStagedTransport(),
        return_lse=True,
    )
    out.backward(shards["dout"])
    return {"out": out.detach(), "lse": lse, "dq": q.grad, "dk": k.grad, "dv": v.grad}


def _bits(t: torch.Tensor) -> torch.Tensor:
    """`t` as integers of its width: equal exactly when the bits are (-0.0 differs from 0.0, a NaN equals itself)."""
    return t.view(torch.int16 if t.element_size() == 2 else torch.int32)


def _same_bits(a: dict, b: dict, fields=FIELDS) -> bool:
    return all(torch.equal(_bits(a[f]), _bits(b[f])) for f in fields)


def _worker(rank: int, directory: str) -> None:
    torch.cuda.set_device(0)
    device = torch.device("cuda", 0)
    dist.init_process_group(
        "gloo", init_method=f"file://{directory}/store", rank=rank, world_size=PROCESSES, timeout=COLLECTIVE_TIMEOUT
    )
    # Every process creates every subgroup, in one order, as new_group requires.
    groups = {p: dist.new_group(list(range(p))) for p in WORLD_SIZES}
    saved: dict[str, object] = {}
    for case in CASES:
        inputs = _inputs(case, device)
        for p in WORLD_SIZES:
            if rank >= p:
                continue
            shards = {n: _shard(case, t, rank, p) for n, t in inputs.items()}
            first = _context_parallel(case, shards, groups[p])
            second = _context_parallel(case, shards, groups[p])
            saved[f"{case.name}/P{p}"] = {
                "result": {f: t.cpu() for f, t in first.items()},
                "repeat_identical": _same_bits(first, second),
            }
    if rank < 2:
        inputs = _inputs(CONTROL, device, CONTROL_SEQLEN)
        shards = {n: _shard(CONTROL, t, rank, 2) for n, t in inputs.items()}
        first = _context_parallel(CONTROL, shards, groups[2], deterministic=False)
        saved["control"] = all(
            _same_bits(first, _context_parallel(CONTROL, shards, groups[2], deterministic=False), ("dq", "dk", "dv"))
            for _ in range(CONTROL_REPEATS - 1)
        )
    torch.cuda.synchronize()
    torch.save(saved, Path(directory) / f"rank{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def runs(device, library, tmp_path_factory) -> list[dict]:
    if not library.kernel_available(HEAD_DIM, library.DTYPE_BF16):
        pytest.skip(f"this build has no kernel for head_dim {HEAD_DIM} / bf16 (see DASH_HEAD_DIMS, DASH_DTYPES)")
    if not library.kernel_available(HEAD_DIM, library.DTYPE_BF16, varlen=True):
        pytest.skip(f"this build has no varlen kernels for head_dim {HEAD_DIM} / bf16 (DASH_VARLEN_KERNELS)")
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    directory = tmp_path_factory.mktemp("context_parallel_one_gpu")
    # spawn: this process has started CUDA, which a forked child cannot use.
    context = mp.start_processes(_worker, args=(str(directory),), nprocs=PROCESSES, join=False, start_method="spawn")
    deadline = time.monotonic() + WORKERS_TIMEOUT_S
    while not context.join(timeout=1):
        if time.monotonic() > deadline:
            for process in context.processes:
                process.kill()
            pytest.fail(f"the context-parallel workers did not finish within {WORKERS_TIMEOUT_S} s")
    return [torch.load(directory / f"rank{rank}.pt") for rank in range(PROCESSES)]


def _ranks(runs: list[dict], case: Case, world_size: int) -> list[dict]:
    return [runs[rank][f"{case.name}/P{world_size}"] for rank in range(world_size)]


def _single_gpu(case: Case, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Single-GPU DASH on the whole batch, backward by autograd."""
    q, k, v = (inputs[n].clone().requires_grad_() for n in ("q", "k", "v"))
    options = dict(causal=case.causal, window_size=case.window, sm_margin=case.sm_margin, return_lse=True)
    if case.packed:
        cu_seqlens = torch.tensor(PACKED_OFFSETS, dtype=torch.int32, device=q.device)
        longest = max(b - a for a, b in zip(PACKED_OFFSETS, PACKED_OFFSETS[1:]))
        out, lse = flash_attn_varlen_func(q, k, v, cu_seqlens, cu_seqlens, longest, longest, **options)
    else:
        out, lse = flash_attn_func(q, k, v, **options)
    out.backward(inputs["dout"])
    return {"out": out.detach(), "lse": lse, "dq": q.grad, "dk": k.grad, "dv": v.grad}


def _float64_reference(case: Case, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The pure-torch kernel (checked against float64 autograd by test_parallel.py) in float64."""
    local = parallel.TorchLocalAttention()
    q, k, v, dout = (inputs[n].double() for n in ("q", "k", "v", "dout"))
    scale = HEAD_DIM**-0.5
    if case.packed:
        o = PACKED_OFFSETS
        out, lse = local.forward_varlen(q, k, v, o, o, case.causal, scale, case.window)
        dq, dk, dv = local.backward_varlen(dout, q, k, v, out, lse, o, o, case.causal, scale, case.window)
    else:
        out, lse = local.forward(q, k, v, case.causal, scale, case.window)
        dq, dk, dv = local.backward(dout, q, k, v, out, lse, case.causal, scale, case.window)
    return {"out": out, "lse": lse, "dq": dq, "dk": dk, "dv": dv}


@pytest.fixture(scope="module")
def references(runs, device) -> dict[str, tuple[dict, dict]]:
    """case name -> (single-GPU DASH, float64 reference), on the host."""
    result = {}
    for case in CASES:
        inputs = _inputs(case, device)
        single = {f: t.cpu() for f, t in _single_gpu(case, inputs).items()}
        truth = {f: t.cpu() for f, t in _float64_reference(case, inputs).items()}
        result[case.name] = (single, truth)
        torch.cuda.empty_cache()
    return result


def _max_error(x: torch.Tensor, reference: torch.Tensor) -> float:
    return float((x.double() - reference).abs().max())


PARAMETERS = [(case, p) for case in CASES for p in WORLD_SIZES]


def _id(parameter) -> str:
    case, p = parameter
    return f"{case.name}-P{p}"


@pytest.mark.parametrize("parameter", PARAMETERS, ids=_id)
def test_two_runs_are_bitwise_identical(runs, parameter):
    case, p = parameter
    assert all(rank["repeat_identical"] for rank in _ranks(runs, case, p))


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_one_process_gives_single_gpu_bits(runs, references, case):
    result = _ranks(runs, case, 1)[0]["result"]
    single, _ = references[case.name]
    if not case.packed:
        fields = FIELDS
    elif case.window == (-1, -1):
        fields = ("out", "lse")
    else:
        # The plan moves a window that cannot bind inside a short sequence to -1, so that sequence goes into
        # another varlen call than the long ones: the same mask, but not the call flash_attn_varlen_func makes.
        fields = ()
    for f in fields:
        assert torch.equal(_bits(result[f]), _bits(single[f])), f"{f} differs from single-GPU DASH"
    print(case.name, "P=1 bitwise equal to single-GPU DASH in every field:", _same_bits(result, single))


@pytest.mark.parametrize("parameter", PARAMETERS, ids=_id)
def test_within_the_error_bound(runs, references, parameter):
    case, p = parameter
    full = _gather(case, [rank["result"] for rank in _ranks(runs, case, p)])
    single, truth = references[case.name]
    for f in FIELDS:
        error, single_error = _max_error(full[f], truth[f]), _max_error(single[f], truth[f])
        factor, floor = BOUNDS[f]
        limit = factor * single_error + floor * float(truth[f].abs().max())
        print(f"{case.name} P={p} {f}: error {error:.3g}, single GPU {single_error:.3g}, limit {limit:.3g}")
        assert error <= limit, f"{f}: error {error:.3g} > limit {limit:.3g}"


def test_negative_control_nondeterministic_schedule_is_caught(runs):
    assert not all(runs[rank]["control"] for rank in range(2)), "deterministic=False repeated its bits"
