"""Tests of the backward plans: the plan cache of dash_attn._plans (hits, least-recently-used eviction, a failed
planning caching nothing, threads, the key holding every field that decides a plan, the SM margin included; a varlen
key's promise and hint lengths_fill_maxima) with a fake maker (the ops' call descriptors in front of it are
test_call_descriptors.py's); BackwardPlan handles of the real library made for a device described by hand, which
needs no GPU (workspace size, the SM count planned for with a margin, the schedule varlen auto picks under the hint,
refusals, a call whose shape is not the plan's, freeing on close, on eviction and at exit); and on a Hopper GPU, the
backward op running one cached plan with the bits of the entry point that plans every call. Without the library or a
GPU, the tests that need them skip and say why.
"""

from __future__ import annotations

import ctypes
import gc
import os
import threading

import pytest

from dash_attn import _plans

SHAPE_FIELDS = (2, 256, 384, 8, 2, 128, 0, 128**-0.5, 1)  # batch, seqlen_q, seqlen_k, heads_q, heads_kv, ...


class Made:
    """A fake plan: which key it was made for."""

    def __init__(self, key) -> None:
        self.key = key


class Maker:
    """A plan maker that counts what it makes, and fails on the keys in `failing`."""

    def __init__(self, failing: tuple = ()) -> None:
        self.made: list = []
        self.failing = set(failing)
        self.lock = threading.Lock()

    def __call__(self, key, *details) -> Made:
        with self.lock:
            self.made.append(key)
        if key in self.failing:
            self.failing.discard(key)
            raise RuntimeError(f"cannot plan {key}")
        return Made(key)


# --- the cache, with a fake maker (no library needed) ------------------------------------------------------


def test_a_hit_is_the_plan_made_for_the_key_and_makes_nothing() -> None:
    maker = Maker()
    cache = _plans.PlanCache(4, maker)
    first = cache.get("a")
    assert first.key == "a"
    assert cache.get("a") is first
    assert maker.made == ["a"]
    assert len(cache) == 1


def test_beyond_capacity_the_least_recently_used_plan_is_dropped() -> None:
    maker = Maker()
    cache = _plans.PlanCache(2, maker)
    a = cache.get("a")
    cache.get("b")
    assert cache.get("a") is a  # now "b" is the least recently used
    cache.get("c")
    assert len(cache) == 2
    assert cache.get("a") is a
    cache.get("b")  # dropped: made again
    assert maker.made == ["a", "b", "c", "b"]


def test_a_failed_planning_caches_nothing() -> None:
    maker = Maker(failing=("a",))
    cache = _plans.PlanCache(2, maker)
    with pytest.raises(RuntimeError, match="cannot plan a"):
        cache.get("a")
    assert len(cache) == 0
    assert cache.get("a").key == "a"
    assert maker.made == ["a", "a"]


def test_capacity_must_be_positive() -> None:
    with pytest.raises(ValueError, match="capacity must be >= 1, got 0"):
        _plans.PlanCache(0, Maker())


def test_clear_drops_every_plan() -> None:
    cache = _plans.PlanCache(2, Maker())
    cache.get("a")
    cache.clear()
    assert len(cache) == 0


def hammer(cache: _plans.PlanCache, keys: int, threads: int = 8, lookups: int = 500) -> dict:
    """Every plan object each key got from `cache` while `threads` threads looked keys up at once; fails the
    test if a lookup got another key's plan or the cache ever held more than its capacity."""
    got: dict = {}
    wrong: list = []
    lock = threading.Lock()

    def work(t: int) -> None:
        for i in range(lookups):
            key = (t * 7 + i * 13) % keys
            plan = cache.get(key)
            if plan.key != key or len(cache) > cache._capacity:
                wrong.append((key, plan.key))
            with lock:
                got.setdefault(key, set()).add(id(plan))

    workers = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert wrong == []
    return got


def test_threads_share_one_plan_per_key_while_it_is_kept() -> None:
    got = hammer(_plans.PlanCache(16, Maker()), keys=12)
    assert all(len(plans) == 1 for plans in got.values()), got


def test_threads_evicting_each_others_plans_keep_the_bound() -> None:
    cache = _plans.PlanCache(8, Maker())
    hammer(cache, keys=12)
    assert len(cache) == 8


def test_the_process_cache_holds_a_few_hundred_plans() -> None:
    assert _plans.backward_plans._capacity == _plans.PLAN_CACHE_CAPACITY == 256


def test_the_key_holds_the_device_every_shape_field_the_schedule_and_the_sm_margin(monkeypatch) -> None:
    from dash_attn import _library

    maker = Maker()
    monkeypatch.setattr(_plans, "backward_plans", _plans.PlanCache(64, maker))
    base = _library.Shape(*SHAPE_FIELDS)
    plan = _plans.backward_plan(0, base, "auto")
    assert _plans.backward_plan(0, _library.Shape(*SHAPE_FIELDS), "auto") is plan
    assert len(maker.made) == 1
    variants = [(1, base, "auto", 0), (0, base, "ascending", 0), (0, base, "auto", 8)]
    replacements = {
        "batch": 3,
        "seqlen_q": 512,
        "seqlen_k": 256,
        "heads_q": 4,
        "heads_kv": 8,
        "head_dim": 64,
        "dtype": 1,
        "softmax_scale": 0.5,
        "causal": 0,
        "windowed": 1,
        "window_left": 64,
        "window_right": 8,
        "softcap": 30.0,
    }
    assert set(replacements) == {name for name, _ in _library.Shape._fields_}
    for name, value in replacements.items():
        shape = _library.Shape(*SHAPE_FIELDS)
        setattr(shape, name, value)
        variants.append((0, shape, "auto", 0))
    for device, shape, schedule, sm_margin in variants:
        assert _plans.backward_plan(device, shape, schedule, sm_margin) is not plan
    assert len(maker.made) == 1 + len(variants)
    # The scale as the library reads it: two Python floats that round to one float32 are one plan.
    nearby = _library.Shape(*SHAPE_FIELDS)
    nearby.softmax_scale = 128**-0.5 + 1e-12
    assert _plans.backward_plan(0, nearby, "auto") is plan


def test_the_varlen_key_holds_the_promise_and_whether_the_rows_fill_the_maxima(monkeypatch) -> None:
    from dash_attn import _library

    maker = Maker()
    monkeypatch.setattr(_plans, "backward_plans", _plans.PlanCache(64, maker))
    shape = _library.Shape(*SHAPE_FIELDS)  # 2 sequences of at most 256 queries and 384 keys
    full_rows = (2 * 256, 2 * 384)

    def plan(promise, rows):
        return _plans.backward_plan(0, shape, "auto", 8, _library.Varlen(0, 0, *rows, int(promise)))

    full = plan(True, full_rows)
    assert maker.made[-1] == _plans.plan_key(0, _plans.shape_fields(shape), "auto", 8, (True, True))
    assert plan(True, (2 * 256 + 37, 2 * 384 + 37)) is full  # padding rows
    short = plan(True, (300, 500))
    assert maker.made[-1][-1] == (True, False)
    for rows in ((2 * 256 - 1, 2 * 384), (2 * 256, 2 * 384 - 1)):
        assert plan(True, rows) is short
    assert maker.made[-1] != plan(False, full_rows).key
    assert maker.made[-1][-1] == (False, True)
    # A dense plan of the same shape is another key.
    assert _plans.backward_plan(0, shape, "auto", 8).key[-1] is None
    assert len(maker.made) == 4


def test_a_varlen_key_makes_the_plan_with_the_calls_varlen(monkeypatch) -> None:
    from dash_attn import _library

    made = []
    monkeypatch.setattr(_library, "BackwardPlan", lambda *args, **kwargs: made.append((args, kwargs)))
    varlen = _library.Varlen(0, 0, 300, 500, 1)
    key = _plans.plan_key(0, SHAPE_FIELDS, "auto", 8, (True, False))
    _plans._make_backward_plan(key, varlen)
    (_shape, schedule), options = made[0]
    assert schedule == "auto"
    assert options == {"sm_margin": 8, "varlen": varlen}
    _plans._make_backward_plan(_plans.plan_key(0, SHAPE_FIELDS, "auto"))
    assert made[1][1] == {"sm_margin": 0, "varlen": None}


# --- handles of the real library, for a device described by hand (no GPU needed) ---------------------------


@pytest.fixture
def h200(library):
    """An H200 as dash_describe_current_device would describe it."""
    return library.Device(index=0, compute_major=9, compute_minor=0, multiprocessor_count=132, name=b"NVIDIA H200")


def fake_tensors(library, shape) -> list:
    """q, k, v, out, dout, dq, dk, dv as packed tensors at addresses the library never reads before it refuses."""
    query = (shape.seqlen_q * shape.heads_q * shape.head_dim, shape.heads_q * shape.head_dim, shape.head_dim, 1)
    key = (shape.seqlen_k * shape.heads_kv * shape.head_dim, shape.heads_kv * shape.head_dim, shape.head_dim, 1)
    base, region = 1 << 44, 1 << 36
    return [
        library.Tensor(base + i * region, (ctypes.c_int64 * 4)(*(key if i in (1, 2, 6, 7) else query)))
        for i in range(8)
    ]


def run_plan(library, plan, shape, varlen=None) -> None:
    q, k, v, out, dout, dq, dk, dv = fake_tensors(library, shape)
    plan.backward(shape, q, k, v, out, dout, (1 << 44) + 8 * (1 << 36), dq, dk, dv, 0, 0, None, varlen)


def varlen_of(library, shape, fill, promise=True, offsets=0):
    """The dash_varlen of a varlen plan of maximum problem `shape` (no offsets unless given: a plan reads none), its
    totals filling the maxima or a query row short."""
    total_q = shape.batch * shape.seqlen_q - (0 if fill else 1)
    return library.Varlen(offsets, offsets, total_q, shape.batch * shape.seqlen_k, int(promise))


def test_a_plan_for_a_described_device_knows_its_workspace(library, h200) -> None:
    small = library.BackwardPlan(library.Shape(*SHAPE_FIELDS), "auto", h200)
    longer = library.Shape(*SHAPE_FIELDS)
    longer.seqlen_q *= 4
    large = library.BackwardPlan(longer, "auto", h200)
    assert 0 < small.workspace_bytes < large.workspace_bytes
    assert not small.closed


def test_a_plan_records_the_sm_count_it_was_planned_for(library, h200) -> None:
    shape = library.Shape(*SHAPE_FIELDS)
    for margin in (0, 1, 32, 131):
        plan = library.BackwardPlan(shape, "auto", h200, sm_margin=margin)
        assert (plan.sm_margin, plan.sm_count) == (margin, 132 - margin)
    # The workspace is the shape's, whatever the margin.
    assert (
        library.BackwardPlan(shape, "ascending", h200, sm_margin=100).workspace_bytes
        == library.BackwardPlan(shape, "ascending", h200).workspace_bytes
    )


def test_a_margin_outside_zero_to_the_sm_count_is_refused_naming_the_rule(library, h200) -> None:
    shape = library.Shape(*SHAPE_FIELDS)
    for margin in (132, 500):
        with pytest.raises(library.LibraryError) as caught:
            library.BackwardPlan(shape, "auto", h200, sm_margin=margin)
        assert caught.value.status == "invalid-argument"
        assert caught.value.message == (
            "sm_margin must satisfy 0 <= sm_margin < the device's SM count (132 on device 0; at least one SM must run "
            f"the kernel), got {margin}"
        )
    # Negative: refused before the device, so also for the current device on a machine without a GPU.
    for device in (h200, None):
        with pytest.raises(library.LibraryError, match="sm_margin must satisfy 0 <= sm_margin .* got -1$"):
            library.BackwardPlan(shape, "auto", device, sm_margin=-1)


def test_a_varlen_plans_auto_reads_the_hint_under_the_full_mask(library, h200) -> None:
    full = library.Shape(*SHAPE_FIELDS)
    full.causal = 0
    full.seqlen_k = full.seqlen_q

    def schedule(shape, name, fill):
        return library.BackwardPlan(shape, name, h200, varlen=varlen_of(library, shape, fill)).schedule

    assert schedule(full, "auto", True) == "shift"
    assert schedule(full, "auto", True) == "shift"
    assert schedule(full, "auto", False) == "shortest-first"
    assert schedule(full, "shift", False) == "shift"
    causal = library.Shape(*SHAPE_FIELDS)
    causal.seqlen_k = causal.seqlen_q
    assert schedule(causal, "auto", False) == schedule(causal, "auto", True)
    assert library.BackwardPlan(full, "ascending", h200).schedule == "ascending"


def test_planning_refusals_carry_the_librarys_message(library, h200) -> None:
    shape = library.Shape(*SHAPE_FIELDS)
    with pytest.raises(library.LibraryError, match="unknown schedule 'fastest' \\(valid: auto, ascending") as caught:
        library.BackwardPlan(shape, "fastest", h200)
    assert caught.value.status == "invalid-argument"
    bad = library.Shape(*SHAPE_FIELDS)
    bad.heads_kv = 0
    with pytest.raises(library.LibraryError, match="shape.heads_kv must be > 0, got 0"):
        library.BackwardPlan(bad, "auto", h200)
    no_sms = library.Device(index=0, multiprocessor_count=0)
    with pytest.raises(library.LibraryError, match="device.multiprocessor_count must be > 0, got 0"):
        library.BackwardPlan(shape, "auto", no_sms)
    full = library.Shape(*SHAPE_FIELDS)
    full.causal = 0
    with pytest.raises(library.LibraryError, match="symmetric-shift needs the causal mask") as caught:
        library.BackwardPlan(full, "symmetric-shift", h200)
    assert caught.value.status == "schedule-rejected"


@pytest.mark.parametrize("head_dim, tiles", [(192, "64x96"), (256, "64x80")])
def test_head_dims_192_and_256_refuse_symmetric_shift_naming_the_rule_and_auto_picks_what_their_tiles_admit(
    library, h200, head_dim, tiles
) -> None:
    # The backward's tiles are 64x96 at d = 192 and 64x80 at 256: block_kv is not a multiple of block_q, which
    # symmetric shift needs.
    scale = head_dim**-0.5
    causal = library.Shape(1, 1000, 1000, 2, 2, head_dim, 0, scale, 1)
    for varlen in (None, varlen_of(library, causal, True)):
        with pytest.raises(library.LibraryError) as caught:
            library.BackwardPlan(causal, "symmetric-shift", h200, varlen=varlen)
        assert caught.value.status == "schedule-rejected"
        assert (
            "symmetric-shift needs block_kv to be a multiple of block_q, and the backward's tiles at this head dim "
            f"are {tiles} (block_q x block_kv)" in caught.value.message
        )
    assert library.BackwardPlan(causal, "auto", h200).schedule == "shortest-first"
    gqa = library.Shape(2, 1000, 1000, 128, 32, head_dim, 0, scale, 1)  # enough jobs to keep query-head groups whole
    assert library.BackwardPlan(gqa, "auto", h200).schedule == "descending"
    full = library.Shape(1, 1000, 1000, 2, 2, head_dim, 0, scale, 0)
    assert library.BackwardPlan(full, "auto", h200).schedule == "shift"
    window = library.Shape(1, 1000, 1000, 2, 2, head_dim, 0, scale, 1, 1, 300, 0)
    assert library.BackwardPlan(window, "auto", h200).schedule == "shortest-first"

    def varlen_auto(shape, fill):
        return library.BackwardPlan(shape, "auto", h200, varlen=varlen_of(library, shape, fill)).schedule

    assert varlen_auto(causal, True) == "shortest-first"
    assert varlen_auto(full, True) == "shift"
    assert varlen_auto(full, False) == "shortest-first"
    assert varlen_auto(window, True) == "shortest-first"


def test_a_plan_refuses_a_call_whose_shape_is_not_its_own(library, h200) -> None:
    plan = library.BackwardPlan(library.Shape(*SHAPE_FIELDS), "auto", h200)
    other = library.Shape(*SHAPE_FIELDS)
    other.seqlen_q = 512
    with pytest.raises(library.LibraryError) as caught:
        run_plan(library, plan, other)
    assert caught.value.status == "invalid-argument"
    assert caught.value.message == "shape.seqlen_q is 512, but the plan was made for 256 (make a plan for this call)"


def test_a_plan_runs_only_batches_of_its_kind_naming_varlen(library, h200) -> None:
    shape = library.Shape(*SHAPE_FIELDS)
    dense = library.BackwardPlan(shape, "auto", h200)
    packed = library.BackwardPlan(shape, "auto", h200, varlen=varlen_of(library, shape, True))
    assert (dense.varlen, packed.varlen) == (False, True)
    offsets = (1 << 44) + 9 * (1 << 36)
    with pytest.raises(library.ArgumentRefusedError, match="^.*: varlen must be NULL: the plan is a dense plan"):
        run_plan(library, dense, shape, varlen_of(library, shape, True, offsets=offsets))
    with pytest.raises(library.ArgumentRefusedError, match="^.*: varlen must not be NULL: the plan is a varlen plan"):
        run_plan(library, packed, shape)
    with pytest.raises(TypeError, match="^varlen must be a Varlen .* or None .*, got bool$"):
        library.BackwardPlan(shape, "auto", h200, varlen=True)
    # Negative control: each kind with its own batch gets past the plan checks (to the device or the pointers).
    for plan, varlen in ((dense, None), (packed, varlen_of(library, shape, True, offsets=offsets))):
        with pytest.raises(library.LibraryError) as caught:
            run_plan(library, plan, shape, varlen)
        assert "varlen must" not in caught.value.message


def test_close_frees_the_handle_once_and_a_closed_plan_refuses_to_run(library, h200) -> None:
    shape = library.Shape(*SHAPE_FIELDS)
    plan = library.BackwardPlan(shape, "auto", h200)
    plan.close()
    assert plan.closed
    plan.close()
    with pytest.raises(ValueError, match="this BackwardPlan is closed; make a new one"):
        run_plan(library, plan, shape)


@pytest.fixture
def freed(library, monkeypatch) -> list:
    """The handles dash_backward_plan_destroy frees from now on (plans made after this fixture)."""
    lib = library.load()
    real_destroy = lib.dash_backward_plan_destroy
    handles: list = []

    def destroy(handle) -> None:
        handles.append(handle)
        real_destroy(handle)

    monkeypatch.setattr(lib, "dash_backward_plan_destroy", destroy)
    return handles


def test_dropping_the_last_reference_frees_the_handle(library, h200, freed) -> None:
    plan = library.BackwardPlan(library.Shape(*SHAPE_FIELDS), "auto", h200)
    handle = plan._handle
    del plan
    gc.collect()
    assert freed == [handle]


def test_eviction_frees_the_dropped_plans_handle(library, h200, freed) -> None:
    cache = _plans.PlanCache(1, lambda schedule: library.BackwardPlan(library.Shape(*SHAPE_FIELDS), schedule, h200))
    first = cache.get("ascending")._handle
    cache.get("descending")
    gc.collect()
    assert freed == [first]
    cache.clear()
    gc.collect()
    assert len(freed) == 2


def test_handles_still_held_are_freed_at_exit(library, fresh_interpreter) -> None:
    program = (
        "import dash_attn._library as library\n"
        "lib = library.load()\n"
        "real_destroy = lib.dash_backward_plan_destroy\n"
        "def destroy(handle):\n"
        "    print('freed', handle == plan_handle, flush=True)\n"
        "    real_destroy(handle)\n"
        "lib.dash_backward_plan_destroy = destroy\n"
        f"shape = library.Shape{SHAPE_FIELDS!r}\n"
        "device = library.Device(index=0, multiprocessor_count=132)\n"
        "plan = library.BackwardPlan(shape, 'auto', device)\n"
        "plan_handle = plan._handle\n"
        "print('exiting', flush=True)\n"
    )
    result = fresh_interpreter(program, env={**os.environ, library.LIBRARY_ENV: str(library.library_path())})
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[:2] == ["exiting", "freed True"]


# --- on a Hopper GPU: the backward op runs one cached plan ------------------------------------------------


def test_the_backward_op_runs_one_cached_plan_with_the_bits_of_the_planning_entry_point(
    device, require_kernel, library
) -> None:
    import torch

    from dash_attn import _ops

    dtype, head_dim, causal = torch.bfloat16, 128, True
    require_kernel(head_dim, dtype)
    generator = torch.Generator(device).manual_seed(11)

    def draw(seqlen: int, heads: int) -> torch.Tensor:
        return torch.randn(2, seqlen, heads, head_dim, generator=generator, device=device).to(dtype)

    q, k, v, dout = draw(300, 4), draw(300, 2), draw(300, 2), draw(300, 4)
    scale = head_dim**-0.5
    out, lse = torch.ops.dash_attn.forward(q, k, v, scale, causal, "auto")
    _plans.backward_plans.clear()
    first = torch.ops.dash_attn.backward(dout, q, k, v, out, lse, scale, causal, "auto")
    shape = _ops._c_shape(q, k, scale, causal)
    plan = _plans.backward_plan(device.index, shape, "auto")
    second = torch.ops.dash_attn.backward(dout, q, k, v, out, lse, scale, causal, "auto")
    assert len(_plans.backward_plans) == 1
    assert _plans.backward_plan(device.index, shape, "auto") is plan

    planned_every_call = [torch.full_like(t, float("nan")) for t in (q, k, v)]
    workspace = torch.empty(library.backward_workspace_size(shape, "auto"), dtype=torch.uint8, device=device)
    with torch.cuda.device(device):
        library.backward(
            shape,
            *(_ops._c_tensor(t) for t in (q, k, v, out, dout)),
            lse.data_ptr(),
            *(_ops._c_tensor(t) for t in planned_every_call),
            "auto",
            workspace.data_ptr(),
            workspace.numel(),
            torch.cuda.current_stream(device).cuda_stream,
        )
    torch.cuda.synchronize(device)
    for name, a, b, c in zip(("dq", "dk", "dv"), first, second, planned_every_call):
        assert torch.equal(a.view(torch.int16), b.view(torch.int16)), name
        assert torch.equal(a.view(torch.int16), c.view(torch.int16)), name


def test_gpu_an_sm_margin_has_plans_of_its_own_and_keeps_the_dynamic_schedules_bits(
    device, require_kernel, library
) -> None:
    import torch

    from dash_attn import _ops

    dtype, head_dim, causal = torch.bfloat16, 128, True
    require_kernel(head_dim, dtype)
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    margin = 16
    generator = torch.Generator(device).manual_seed(12)

    def draw(heads: int) -> torch.Tensor:
        return torch.randn(2, 1000, heads, head_dim, generator=generator, device=device).to(dtype)

    q, k, v, dout = draw(8), draw(2), draw(2), draw(8)
    scale = head_dim**-0.5
    shape = _ops._c_shape(q, k, scale, causal)
    out, lse = torch.ops.dash_attn.forward(q, k, v, scale, causal, "auto")
    out_margin, lse_margin = torch.ops.dash_attn.forward(q, k, v, scale, causal, "auto", margin)
    assert torch.equal(out.view(torch.int16), out_margin.view(torch.int16))
    assert torch.equal(lse, lse_margin)
    for schedule in ("ascending", "descending", "shortest-first"):
        every_sm = torch.ops.dash_attn.backward(dout, q, k, v, out, lse, scale, causal, schedule)
        fewer = torch.ops.dash_attn.backward(dout, q, k, v, out, lse, scale, causal, schedule, margin)
        for name, a, b in zip(("dq", "dk", "dv"), every_sm, fewer):
            assert torch.equal(a.view(torch.int16), b.view(torch.int16)), f"{schedule} {name}"
        assert _plans.backward_plan(device.index, shape, schedule, margin).sm_count == sms - margin
        assert _plans.backward_plan(device.index, shape, schedule).sm_count == sms
    with pytest.raises(library.LibraryError, match=f"sm_margin must satisfy .*\\({sms} on device .* got {sms}$"):
        torch.ops.dash_attn.forward(q, k, v, scale, causal, "auto", sms)
