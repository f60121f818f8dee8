"""How context parallelism moves data between the ranks of a group: the ring's shift (send to the next rank,
receive from the previous one) and the all-to-all exchange, behind one small interface (Transport), so that the
ring and all-to-all code is the same whatever carries the bytes.

- ProcessGroupTransport (the default): torch.distributed on the tensors where they are. NCCL for CUDA tensors on
  one GPU per rank, gloo for CPU tensors.
- HostStagedTransport: copies each outgoing tensor to host memory, exchanges it over a gloo group, and copies
  what arrives back to the tensor's device. It lets several processes share one GPU (NCCL refuses two ranks on one
  device, gloo has no point-to-point on CUDA tensors), for tests and examples of the real code path on DASH's
  kernels. Each staging copy synchronizes the sending stream, so transfers do not overlap compute.

Invariants: a transport only moves data, never reduces it, and returns exactly the bytes that were sent, so the
results do not depend on which transport carried them. A shift's send and receive are started together (one
batch), so a ring of shifts cannot deadlock on the order of blocking sends.
"""

from __future__ import annotations

import dataclasses
from typing import Protocol

import torch
import torch.distributed as dist
from torch import Tensor


class Pending(Protocol):
    """A shift in flight."""

    def wait(self) -> Tensor:
        """The received tensor, on the sent tensor's device, once both the send and the receive are done (the
        sent tensor may then be reused)."""
        ...


class Transport(Protocol):
    """What moves tensors between the ranks of a group (see the module docstring)."""

    def start_shift(self, send: Tensor, group: dist.ProcessGroup, next_peer: int, previous_peer: int) -> Pending:
        """Starts sending `send` to global rank `next_peer` and receiving a tensor of its shape, dtype and device
        from global rank `previous_peer`."""
        ...

    def all_to_all(self, received: Tensor, send: Tensor, group: dist.ProcessGroup) -> None:
        """all_to_all_single over `group`: dimension 0 of `send` is split into equal parts, part p goes to rank p,
        and `received` gets the parts of every rank in rank order."""
        ...


def _shift_ops(send: Tensor, received: Tensor, group, next_peer: int, previous_peer: int) -> list[dist.Work]:
    return dist.batch_isend_irecv(
        [
            dist.P2POp(dist.isend, send, next_peer, group),
            dist.P2POp(dist.irecv, received, previous_peer, group),
        ]
    )


@dataclasses.dataclass(frozen=True)
class _Transfer:
    """A shift in flight on the tensors themselves: the tensor being received, the works of the send and the
    receive."""

    received: Tensor
    works: list[dist.Work]

    def wait(self) -> Tensor:
        # On NCCL, waiting makes the current stream wait for the transfer.
        for work in self.works:
            work.wait()
        return self.received


class ProcessGroupTransport:
    """torch.distributed on the tensors where they are (NCCL for CUDA tensors, gloo for CPU tensors)."""

    def start_shift(self, send: Tensor, group: dist.ProcessGroup, next_peer: int, previous_peer: int) -> _Transfer:
        received = torch.empty_like(send)
        return _Transfer(received, _shift_ops(send, received, group, next_peer, previous_peer))

    def all_to_all(self, received: Tensor, send: Tensor, group: dist.ProcessGroup) -> None:
        dist.all_to_all_single(received, send, group=group)


@dataclasses.dataclass(frozen=True)
class _StagedTransfer:
    """A shift in flight through host memory: the host buffers (the sent one is held until the send is done), the
    works, and the device the received tensor goes back to."""

    sent: Tensor
    received: Tensor
    works: list[dist.Work]
    device: torch.device

    def wait(self) -> Tensor:
        for work in self.works:
            work.wait()
        return self.received.to(self.device)


class HostStagedTransport:
    """Exchanges through host memory over a gloo group (module docstring): for ranks that share one GPU."""

    def start_shift(
        self, send: Tensor, group: dist.ProcessGroup, next_peer: int, previous_peer: int
    ) -> _StagedTransfer:
        # A blocking copy: the host buffer holds the data before gloo reads it.
        host = send.to("cpu")
        received = torch.empty_like(host)
        return _StagedTransfer(host, received, _shift_ops(host, received, group, next_peer, previous_peer), send.device)

    def all_to_all(self, received: Tensor, send: Tensor, group: dist.ProcessGroup) -> None:
        host = send.to("cpu")
        host_received = torch.empty_like(host)
        dist.all_to_all_single(host_received, host, group=group)
        received.copy_(host_received)
