"""dash_attn.parallel on the CPU: the ring and all-to-all (ulysses) logic over gloo, with the pure-torch
TorchLocalAttention injected as the local kernel, at world sizes 1 to 4: dense batches and packed ones (ragged
sequence lengths, one sequence empty), with and without sliding windows.

One start of 4 processes serves every world size (subgroups of ranks [0, P)), and they fork from a forkserver
that imported torch once: four processes each importing torch take over 15 s on a 2-core machine. The forkserver
is a fresh, single-threaded interpreter, so forking from it is safe even where this test process has started
CUDA or OpenMP threads. Each rank saves its shards of out, LSE and gradients; the test
process gathers them and checks:
- against single-process attention: a float64 autograd formulation of the whole sequence (of each sequence,
  packed), within fp32 tolerance (the runs are fp32);
- under a sliding window, the ring makes exactly one local call per (query segment, key segment) pair the
  window reaches, counted on every rank and checked against a brute-force count over global positions, so the
  blocks and steps the window cannot see are skipped;
- bitwise identity across repeats, and with random delays injected on the ranks (arrival order must not
  matter); at world size 1, bitwise identity with the local kernel itself;
- negative controls through the same comparison: the ring forward with its LSE merge order perturbed (the
  merge taken in another order, as a merge by arrival would) and a local kernel whose GQA sums change order from
  call to call (as a nondeterministic schedule would) must both be reported as different bits.
Plus the layout helpers and the argument checks that need no process group.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import random
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="dash_attn needs PyTorch")

import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

from dash_attn import parallel  # noqa: E402
from dash_attn.parallel import _layout, _ring, _ulysses  # noqa: E402
from dash_attn.parallel._merge import LseMerge  # noqa: E402

if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

PROCESSES = 4
BATCH, SEQLEN, HEADS, HEAD_DIM = 2, 96, 12, 16  # 96 splits into 2P equal chunks for P = 1..4
DTYPE = torch.float32
REPEATS = 3
# A hung collective fails the test instead of the CI job: gloo's own timeout, and the test's wait for the workers.
COLLECTIVE_TIMEOUT = datetime.timedelta(seconds=60)
WORKERS_TIMEOUT_S = 120
# fp32 runs against a float64 reference of the same inputs.
FP32_TOLERANCE = {"rtol": 1e-5, "atol": 1e-5}
FIELDS = ("out", "lse", "dq", "dk", "dv")
NO_WINDOW = (-1, -1)
# A packed batch: ragged lengths, each a multiple of 2P for P = 1..4, one sequence empty.
PACKED_LENGTHS = (24, 0, 72, 48)
PACKED_OFFSETS = (0, 24, 24, 96, 144)


@dataclasses.dataclass(frozen=True)
class Case:
    mode: str
    causal: bool
    heads_kv: int
    layout: str
    world_size: int
    window: tuple[int, int] = NO_WINDOW
    packed: bool = False

    @property
    def name(self) -> str:
        mask = "causal" if self.causal else "full"
        window = "" if self.window == NO_WINDOW else f"-window{self.window[0]}_{self.window[1]}"
        packed = "-packed" if self.packed else ""
        return f"{self.mode}-{mask}-kv{self.heads_kv}-{self.layout}{window}{packed}-P{self.world_size}"


def _cases() -> list[Case]:
    cases = []
    for p in range(1, PROCESSES + 1):
        cases.append(Case("ring", True, 4, "zigzag", p))  # GQA, groups of 3
        cases.append(Case("ring", False, HEADS, "contiguous", p))
        cases.append(Case("ulysses", True, p, "zigzag", p))  # key/value heads split, one per rank
        if p > 1:
            cases.append(Case("ulysses", True, 1, "contiguous", p))  # MQA: the key/value head repeated P times
        # Windows narrower than a chunk (96 / 2P >= 12 tokens): most blocks, and whole steps, are skipped.
        cases.append(Case("ring", True, 4, "zigzag", p, window=(10, -1)))
        cases.append(Case("ring", False, HEADS, "contiguous", p, window=(5, 7)))
        cases.append(Case("ring", True, 4, "zigzag", p, packed=True))
        cases.append(Case("ring", False, 4, "zigzag", p, window=(5, 7), packed=True))
        cases.append(Case("ulysses", True, p, "zigzag", p, window=(10, -1), packed=True))
    return cases


CASES = _cases()
# The negative controls and the delay run use world size 4: every rank then merges up to 4 blocks per row.
RING_CAUSAL_P4 = Case("ring", True, 4, "zigzag", 4)
STAGED_CASES = [
    Case("ring", True, 4, "zigzag", 4, packed=True),
    Case("ulysses", True, 4, "zigzag", 4, window=(10, -1), packed=True),
]


def _inputs(case: Case) -> dict[str, torch.Tensor]:
    """The full-sequence q, k, v and upstream gradient of a case, the same on every process."""
    generator = torch.Generator().manual_seed(1000 * case.heads_kv + case.causal)
    tokens = (PACKED_OFFSETS[-1],) if case.packed else (BATCH, SEQLEN)
    shapes = {
        "q": (*tokens, HEADS, HEAD_DIM),
        "k": (*tokens, case.heads_kv, HEAD_DIM),
        "v": (*tokens, case.heads_kv, HEAD_DIM),
        "dout": (*tokens, HEADS, HEAD_DIM),
    }
    return {name: torch.randn(shape, generator=generator, dtype=DTYPE) for name, shape in shapes.items()}


class DelayedLocalAttention(parallel.TorchLocalAttention):
    """The reference kernel after a random pause of up to a few milliseconds, different on every rank and call:
    transfers then complete in other orders than without it."""

    def __init__(self, rank: int) -> None:
        self.random = random.Random(rank)

    def _pause(self) -> None:
        time.sleep(self.random.uniform(0.0, 0.004))

    def forward(self, *args):
        self._pause()
        return super().forward(*args)

    def backward(self, *args):
        self._pause()
        return super().backward(*args)


class CountingLocalAttention(parallel.TorchLocalAttention):
    """The reference kernel, counting its forward and backward calls (dense and packed)."""

    def __init__(self) -> None:
        self.forward_calls = 0
        self.backward_calls = 0

    def forward(self, *args):
        self.forward_calls += 1
        return super().forward(*args)

    def forward_varlen(self, *args):
        self.forward_calls += 1
        return super().forward_varlen(*args)

    def backward(self, *args):
        self.backward_calls += 1
        return super().backward(*args)

    def backward_varlen(self, *args):
        self.backward_calls += 1
        return super().backward_varlen(*args)


class RotatingGroupSumLocalAttention(parallel.TorchLocalAttention):
    """Negative control: a kernel whose backward sums each GQA group's dK/dV in an order that rotates with every
    call, as a kernel accumulating with atomics sums in an order that changes from run to run."""

    deterministic = False

    def __init__(self) -> None:
        self.calls = 0

    def _sum_groups(self, per_query_head: torch.Tensor, heads_kv: int) -> torch.Tensor:
        batch, seqlen, heads_q, head_dim = per_query_head.shape
        group = heads_q // heads_kv
        order = torch.arange(group).roll(self.calls)
        self.calls += 1
        grouped = per_query_head.view(batch, seqlen, heads_kv, group, head_dim)
        return grouped.index_select(3, order).sum(dim=3)


class ReorderedLseMerge(LseMerge):
    """Negative control: LseMerge taking the blocks after the first in reverse order, as a merge in arrival
    order would on a run where they arrived so."""

    def __init__(self, like: torch.Tensor, dtype: torch.dtype) -> None:
        super().__init__(like, dtype)
        self.blocks: list[tuple] = []

    def add(self, out: torch.Tensor, lse: torch.Tensor, rows) -> None:
        self.blocks.append((out, lse, rows))

    def result(self) -> tuple[torch.Tensor, torch.Tensor]:
        first, *later = self.blocks
        for block in (first, *reversed(later)):
            LseMerge.add(self, *block)
        return super().result()


def _run(case: Case, group, rank: int, local, repeats: int, transport=None) -> list[dict[str, torch.Tensor]]:
    """This rank's shards of out, LSE and gradients, forward and backward `repeats` times."""
    if case.packed:
        shards = {
            name: parallel.shard_packed(t, PACKED_OFFSETS, rank, case.world_size, case.layout)
            for name, t in _inputs(case).items()
        }
    else:
        shards = {
            name: parallel.shard_sequence(t, rank, case.world_size, case.layout).contiguous()
            for name, t in _inputs(case).items()
        }
    results = []
    for _ in range(repeats):
        q, k, v = (shards[name].clone().requires_grad_() for name in ("q", "k", "v"))
        out, lse = parallel.context_parallel_attn_func(
            q,
            k,
            v,
            group=group,
            mode=case.mode,
            causal=case.causal,
            layout=case.layout,
            window_size=case.window,
            cu_seqlens=PACKED_OFFSETS if case.packed else None,
            local_attention=local,
            transport=transport,
            return_lse=True,
        )
        out.backward(shards["dout"])
        results.append({"out": out.detach(), "lse": lse, "dq": q.grad, "dk": k.grad, "dv": v.grad})
    return results


def _worker(rank: int, directory: str) -> None:
    # One thread per process: 4 processes share 2 cores, and a fixed thread count keeps the CPU kernels' bits.
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"file://{directory}/store", rank=rank, world_size=PROCESSES, timeout=COLLECTIVE_TIMEOUT
    )
    # Every process creates every subgroup, in one order, as new_group requires.
    groups = {p: dist.new_group(list(range(p))) for p in range(1, PROCESSES + 1)}
    saved: dict[str, list] = {}
    for case in CASES:
        if rank < case.world_size:
            group = groups[case.world_size]
            counting = CountingLocalAttention()
            saved[f"plain/{case.name}"] = _run(case, group, rank, counting, REPEATS)
            saved[f"calls/{case.name}"] = (counting.forward_calls // REPEATS, counting.backward_calls // REPEATS)
            if case.world_size > 1:
                saved[f"delayed/{case.name}"] = _run(case, group, rank, DelayedLocalAttention(rank), 1)
    for case in STAGED_CASES:
        staged = parallel.HostStagedTransport()
        saved[f"staged/{case.name}"] = _run(case, groups[4], rank, parallel.TorchLocalAttention(), 1, staged)
    saved["rotating-sums"] = _run(RING_CAUSAL_P4, groups[4], rank, RotatingGroupSumLocalAttention(), 2)
    _ring.LseMerge = ReorderedLseMerge
    saved["reordered-merge"] = _run(RING_CAUSAL_P4, groups[4], rank, parallel.TorchLocalAttention(), 1)
    _ring.LseMerge = LseMerge
    torch.save(saved, Path(directory) / f"rank{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()


def _gather(shards: list[dict[str, torch.Tensor]], case: Case) -> dict[str, torch.Tensor]:
    """Full-sequence tensors from the ranks' shards (the LSE's tokens are its last dimension)."""
    if case.packed:
        return {
            field: parallel.gather_packed(
                [s[field] for s in shards], PACKED_OFFSETS, case.layout, dim=int(field == "lse")
            )
            for field in FIELDS
        }
    return {
        field: parallel.gather_sequence([s[field] for s in shards], case.layout, dim=2 if field == "lse" else 1)
        for field in FIELDS
    }


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, list[dict[str, torch.Tensor]]]:
    """run name -> repeats -> field -> full-sequence tensor, from one spawn of the workers."""
    directory = tmp_path_factory.mktemp("context_parallel")
    # Preloading is skipped where the forkserver already runs (the workers then import what they need); a module
    # that cannot be imported there is skipped too.
    mp.get_context("forkserver").set_forkserver_preload(["torch", "torch.distributed", "dash_attn.parallel", __name__])
    context = mp.start_processes(
        _worker, args=(str(directory),), nprocs=PROCESSES, join=False, start_method="forkserver"
    )
    deadline = time.monotonic() + WORKERS_TIMEOUT_S
    while not context.join(timeout=1):
        if time.monotonic() > deadline:
            for process in context.processes:
                process.kill()
            pytest.fail(f"the context-parallel workers did not finish within {WORKERS_TIMEOUT_S} s")
    per_rank = [torch.load(directory / f"rank{rank}.pt") for rank in range(PROCESSES)]
    cases = {f"{kind}/{case.name}": case for case in CASES for kind in ("plain", "delayed")}
    cases.update({"rotating-sums": RING_CAUSAL_P4, "reordered-merge": RING_CAUSAL_P4})
    cases.update({f"staged/{case.name}": case for case in STAGED_CASES})
    gathered = {}
    for name, case in cases.items():
        ranks = [saved[name] for saved in per_rank if name in saved]
        if ranks:
            gathered[name] = [_gather([r[i] for r in ranks], case) for i in range(len(ranks[0]))]
    for case in CASES:
        gathered[f"calls/{case.name}"] = [saved[f"calls/{case.name}"] for saved in per_rank[: case.world_size]]
    return gathered


@contextlib.contextmanager
def _one_thread():
    """This process's torch ops on one thread while the body runs: on a small shared machine, several threads
    make the tiny reference computations many times slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _first_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> str | None:
    """The first field whose bits differ between two runs, with how many elements differ; None if all match.
    Bits are compared as integers, so -0.0 differs from 0.0 and a NaN equals itself."""
    for field in FIELDS:
        x, y = a[field], b[field]
        assert x.dtype == y.dtype == torch.float32 and x.shape == y.shape
        differing = int((x.view(torch.int32) != y.view(torch.int32)).sum())
        if differing:
            return f"{field}: {differing} of {x.numel()} elements"
    return None


def _attention64(inputs: dict[str, torch.Tensor], case: Case) -> dict[str, torch.Tensor]:
    """Attention of one whole sequence (batch, seqlen, heads, head_dim) in float64 through autograd: no LSE
    identities, no blocks; the mask from its definition over positions."""
    inputs = {name: t.double() for name, t in inputs.items()}
    q, k, v = (inputs[name].requires_grad_() for name in ("q", "k", "v"))
    group = HEADS // case.heads_kv
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k.repeat_interleave(group, dim=2)) * HEAD_DIM**-0.5
    seqlen = q.shape[1]
    i, j = torch.arange(seqlen)[:, None], torch.arange(seqlen)[None, :]
    left, right = case.window
    hidden = torch.zeros(seqlen, seqlen, dtype=torch.bool)
    if case.causal:
        hidden |= j > i
    if left >= 0:
        hidden |= j < i - left
    if right >= 0:
        hidden |= j > i + right
    scores = scores.masked_fill(hidden, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    out = torch.einsum("bhqk,bkhd->bqhd", torch.softmax(scores, dim=-1), v.repeat_interleave(group, dim=2))
    out.backward(inputs["dout"])
    return {"out": out.detach(), "lse": lse.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad}


def _reference(case: Case) -> dict[str, torch.Tensor]:
    """Single-process float64 attention of the whole batch; packed: of each sequence alone, concatenated."""
    inputs = _inputs(case)
    if not case.packed:
        return _attention64(inputs, case)
    parts = [
        _attention64({name: t[None, start:end] for name, t in inputs.items()}, case)
        for start, end in zip(PACKED_OFFSETS, PACKED_OFFSETS[1:])
        if end > start
    ]
    return {field: torch.cat([p[field][0] for p in parts], dim=int(field == "lse")) for field in FIELDS}


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_matches_single_process_attention(runs, case):
    with _one_thread():
        expected = _reference(case)
    for field in FIELDS:
        torch.testing.assert_close(runs[f"plain/{case.name}"][0][field].double(), expected[field], **FP32_TOLERANCE)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_bitwise_identical_across_repeats(runs, case):
    first, *others = runs[f"plain/{case.name}"]
    for i, other in enumerate(others, start=1):
        assert _first_difference(first, other) is None, f"repeat {i} differs from repeat 0"


@pytest.mark.parametrize("case", [c for c in CASES if c.world_size > 1], ids=lambda c: c.name)
def test_bitwise_identical_under_random_delays(runs, case):
    assert _first_difference(runs[f"plain/{case.name}"][0], runs[f"delayed/{case.name}"][0]) is None


def _segments(layout: str, rank: int, world_size: int) -> list[range]:
    """The global positions a rank holds, as maximal runs, from the layout's definition."""
    shard = SEQLEN // world_size
    if layout == "contiguous":
        return [range(rank * shard, (rank + 1) * shard)]
    chunk = shard // 2
    first, second = rank, 2 * world_size - 1 - rank
    if second == first + 1:
        return [range(first * chunk, (second + 1) * chunk)]
    return [range(first * chunk, (first + 1) * chunk), range(second * chunk, (second + 1) * chunk)]


def _reachable(queries: range, keys: range, case: Case) -> bool:
    """Whether the window lets some query of `queries` see some key of `keys`, by brute force."""
    left, right = case.window
    right = 0 if case.causal else right
    return any((left < 0 or j >= i - left) and (right < 0 or j <= i + right) for i in queries for j in keys)


WINDOW_CASES = [c for c in CASES if c.window != NO_WINDOW and c.mode == "ring" and not c.packed]


@pytest.mark.parametrize("case", WINDOW_CASES, ids=lambda c: c.name)
def test_window_computes_only_the_blocks_it_reaches(runs, case):
    """One local call per (query segment, key segment) pair the window reaches, forward and backward; every other
    pair, and every step with none, makes no call. The window is narrower than a chunk, so from 3 ranks on some
    pairs are out of its reach."""
    all_pairs = 0
    for rank, (forward_calls, backward_calls) in enumerate(runs[f"calls/{case.name}"]):
        expected = 0
        for step in range(case.world_size):
            source = (rank - step) % case.world_size
            pairs = [
                (q, k)
                for q in _segments(case.layout, rank, case.world_size)
                for k in _segments(case.layout, source, case.world_size)
            ]
            all_pairs += len(pairs)
            expected += sum(_reachable(q, k, case) for q, k in pairs)
        assert (forward_calls, backward_calls) == (expected, expected), f"rank {rank}"
    if case.world_size > 2:
        total = sum(f for f, _ in runs[f"calls/{case.name}"])
        assert total < all_pairs, f"{total} calls for {all_pairs} segment pairs: the window skipped none"


@pytest.mark.parametrize("case", [c for c in CASES if c.world_size == 1 and not c.packed], ids=lambda c: c.name)
def test_world_size_one_gives_the_local_kernel_bits(runs, case):
    """One rank: no merge and no exchanged partials, so exactly the local kernel's results on the whole sequence."""
    inputs = _inputs(case)
    local = parallel.TorchLocalAttention()
    scale = HEAD_DIM**-0.5
    # One thread, as in the workers: the CPU kernels' bits can depend on the thread count.
    with _one_thread():
        out, lse = local.forward(inputs["q"], inputs["k"], inputs["v"], case.causal, scale, case.window)
        dq, dk, dv = local.backward(
            inputs["dout"], inputs["q"], inputs["k"], inputs["v"], out, lse, case.causal, scale, case.window
        )
    expected = {"out": out, "lse": lse, "dq": dq, "dk": dk, "dv": dv}
    assert _first_difference(runs[f"plain/{case.name}"][0], expected) is None


@pytest.mark.parametrize("case", STAGED_CASES, ids=lambda c: c.name)
def test_host_staged_transport_gives_the_same_bits(runs, case):
    """The transport only moves data: staging through host memory changes no bit (on the CPU it runs the same
    gloo exchanges on the tensors themselves, which is the code path it takes after its copies on a GPU)."""
    assert _first_difference(runs[f"plain/{case.name}"][0], runs[f"staged/{case.name}"][0]) is None


def test_negative_control_reordered_merge_is_caught(runs):
    """The ring forward with only the LSE merge order changed: the comparison the tests above use must see it.
    If it did not, bitwise identity across repeats would prove nothing about the merge order."""
    plain = runs[f"plain/{RING_CAUSAL_P4.name}"][0]
    reordered = runs["reordered-merge"][0]
    assert _first_difference(plain, reordered) is not None
    # Still the same attention: only the rounding moved.
    for field in FIELDS:
        torch.testing.assert_close(reordered[field], plain[field], **FP32_TOLERANCE)


def test_negative_control_nondeterministic_local_kernel_is_caught(runs):
    first, second = runs["rotating-sums"]
    difference = _first_difference(first, second)
    assert difference is not None and difference.startswith("dk"), difference


def test_layout_round_trip_and_natural_order():
    x = torch.arange(2 * 48).view(2, 48)
    for world_size in range(1, 5):
        for layout in parallel.LAYOUTS:
            shards = [parallel.shard_sequence(x, r, world_size, layout) for r in range(world_size)]
            assert torch.equal(parallel.gather_sequence(shards, layout), x)
            concatenated = torch.cat(shards, dim=1)
            order = _layout.natural_order(48, world_size, layout, x.device)
            assert torch.equal(concatenated if order is None else concatenated[:, order], x)
    zigzag = [parallel.shard_sequence(torch.arange(8), r, 2, "zigzag", dim=0).tolist() for r in range(2)]
    assert zigzag == [[0, 1, 6, 7], [2, 3, 4, 5]]


def test_ulysses_head_rules():
    assert _ulysses.kv_replicas(12, 4, 4) == 1
    assert _ulysses.kv_replicas(12, 2, 4) == 2
    assert _ulysses.kv_replicas(12, 1, 4) == 4
    with pytest.raises(ValueError, match="multiple of the group size"):
        _ulysses.check_heads(12, 4, 8)
    with pytest.raises(ValueError, match="key/value heads"):
        _ulysses.check_heads(12, 3, 4)


def test_refusals_before_any_communication():
    """These fail before the process group is touched (none exists in this process)."""
    q = torch.zeros(1, 8, 4, 16)
    kv = torch.zeros(1, 8, 2, 16)
    call = parallel.context_parallel_attn_func
    with pytest.raises(ValueError, match="mode"):
        call(q, kv, kv, mode="tree")
    with pytest.raises(ValueError, match="layout"):
        call(q, kv, kv, layout="striped")
    with pytest.raises(ValueError, match='layout="zigzag"'):
        call(q, kv, kv, causal=True, layout="contiguous")
    with pytest.raises(TypeError, match="causal"):
        call(q, kv, kv, causal=1)
    with pytest.raises(ValueError, match="same tokens"):
        call(q, kv[:, :4], kv[:, :4])
    with pytest.raises(ValueError, match="local_attention given"):
        call(q, kv, kv, sm_margin=8, local_attention=parallel.TorchLocalAttention())
    with pytest.raises(ValueError, match="contradicts"):
        parallel.DashLocalAttention(schedule="nondeterministic")
    with pytest.raises(ValueError, match="sm_margin"):
        parallel.DashLocalAttention(sm_margin=-1)
