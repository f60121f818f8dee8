"""The process's backward plans: one bounded, least-recently-used cache of BackwardPlan handles.

A plan is keyed by everything that decides it: the CUDA device ordinal (a plan is made for that device's SM
count), every field of the C shape (sizes, head dim, dtype, softmax scale as the library sees it, mask), the
schedule name, the SM margin (SMs left to other work) and, for a packed varlen batch, its promise
keys_within_queries and auto's hint from its packed rows (lengths_fill_maxima), so a hit is exactly the plan the
library would make again. At most `capacity` plans are
kept; adding one beyond that drops the least recently used, whose handle is freed as soon as no call still
uses it (BackwardPlan frees its handle when collected) and at the latest at interpreter exit. Plans are made
outside the lock, so a long first proof does not hold up other threads' lookups; when two threads make the
same plan at once, the first one stored wins and the other is dropped. A failed planning caches nothing.
Nothing here imports torch.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

from . import _library

# Plans kept per process: a training run uses a handful of shapes, a shape sweep many; each plan holds a few
# hundred bytes on the host and nothing on the GPU.
PLAN_CACHE_CAPACITY = 256

Plan = TypeVar("Plan")


class PlanCache(Generic[Plan]):
    """`make(key, *details)` at most once per key while the key stays among the `capacity` most recently used; the
    details of a get() are what the maker needs besides the key, and must make the plan the key names."""

    def __init__(self, capacity: int, make: Callable[..., Plan]) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self._capacity = capacity
        self._make = make
        self._lock = threading.Lock()
        self._plans: OrderedDict[Hashable, Plan] = OrderedDict()  # least recently used first

    def get(self, key: Hashable, *details: object) -> Plan:
        with self._lock:
            plan = self._plans.get(key)
            if plan is not None:
                self._plans.move_to_end(key)
                return plan
        made = self._make(key, *details)
        with self._lock:
            plan = self._plans.setdefault(key, made)
            self._plans.move_to_end(key)
            while len(self._plans) > self._capacity:
                self._plans.popitem(last=False)
            return plan

    def __len__(self) -> int:
        with self._lock:
            return len(self._plans)

    def clear(self) -> None:
        with self._lock:
            self._plans.clear()


def shape_fields(shape: _library.Shape) -> tuple:
    """Every field of `shape`, in struct order, as the library reads them (the scale already rounded to float32)."""
    return tuple(getattr(shape, name) for name, _ in _library.Shape._fields_)


def _make_backward_plan(key: tuple, varlen: _library.Varlen | None = None) -> _library.BackwardPlan:
    """The plan of `key`; a varlen plan's `varlen` is the call's, whose promise and totals the key's batch holds."""
    _device, shape_fields, schedule, sm_margin, _batch = key
    return _library.BackwardPlan(_library.Shape(*shape_fields), schedule, sm_margin=sm_margin, varlen=varlen)


# Dense and varlen plans, keyed by plan_key.
backward_plans: PlanCache[_library.BackwardPlan] = PlanCache(PLAN_CACHE_CAPACITY, _make_backward_plan)


def lengths_fill_maxima(shape: _library.Shape, total_q: int, total_k: int) -> bool:
    """auto's hint for a varlen plan of maximum problem `shape` (batch = sequences, seqlen_q and seqlen_k = the
    maxima) from the packed rows alone, as the library computes it from a dash_varlen's totals
    (dash::varlen_lengths_fill_maxima): whether every sequence can be as long as the maxima. Fewer rows than batch *
    maximum prove some sequence shorter; more are padding and prove nothing."""
    return total_q >= shape.batch * shape.seqlen_q and total_k >= shape.batch * shape.seqlen_k


def varlen_batch(shape: _library.Shape, varlen: _library.Varlen) -> tuple[bool, bool]:
    """What decides a varlen plan of maximum problem `shape` besides plan_key's other fields: the promise
    keys_within_queries and the hint lengths_fill_maxima of `varlen`'s totals (not its lengths, which stay on the
    device)."""
    return bool(varlen.keys_within_queries), lengths_fill_maxima(shape, varlen.total_q, varlen.total_k)


def backward_plan(
    device: int, shape: _library.Shape, schedule: str, sm_margin: int = 0, varlen: _library.Varlen | None = None
) -> _library.BackwardPlan:
    """The backward plan of `shape` and `schedule` on CUDA device `device`, which must be the current device
    (a plan is made for the current device; the library refuses to run it on another), for its SMs less
    `sm_margin`; with `varlen`, the varlen plan of batches like it (its promise and hint)."""
    batch = None if varlen is None else varlen_batch(shape, varlen)
    return backward_plans.get(plan_key(device, shape_fields(shape), schedule, sm_margin, batch), varlen)


def plan_key(
    device: int, fields: tuple, schedule: str, sm_margin: int = 0, batch: tuple[bool, bool] | None = None
) -> tuple:
    """The key of backward_plans for a shape given by shape_fields(shape), which a caller that keeps its calls'
    keys (the ops' call descriptors) computes once; `batch` is None for a dense plan, varlen_batch's for a varlen
    one."""
    return (device, fields, schedule, sm_margin, batch)
