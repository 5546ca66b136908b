"""Python objects over torch.distributed point-to-point: a header with the byte count, then the bytes.

A rollout crosses the wire as one pickled object (its tensors, examples, policy version and the
random streams' positions): ~100 KB for the lab's 256 completions, a millisecond or two over gloo.
`recv_object(src=None)` takes the next message from any sender and says who sent it; the payload is
then read from that sender only, so two workers' messages never interleave. `Doorbell` says which
sender has a message waiting without blocking.
Both ends are the lab's own processes: pickle is safe here, never for data from elsewhere.
"""

from __future__ import annotations

import pickle

import torch
import torch.distributed as dist


def object_bytes(obj) -> torch.Tensor:
    """obj pickled into a (n,) uint8 tensor."""
    return torch.frombuffer(bytearray(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)), dtype=torch.uint8)


def bytes_object(payload: torch.Tensor):
    return pickle.loads(payload.numpy().tobytes())


def send_object(obj, dst: int, group=None) -> None:
    """Send `obj` to global rank `dst`: its size (1 int64), then its bytes."""
    payload = object_bytes(obj)
    dist.send(torch.tensor([payload.numel()], dtype=torch.int64), dst, group=group)
    dist.send(payload, dst, group=group)


def recv_payload(size: torch.Tensor, src: int, group=None):
    """The bytes that follow a size header `size` from `src`, unpickled."""
    payload = torch.empty(int(size.item()), dtype=torch.uint8)
    dist.recv(payload, src, group=group)
    return bytes_object(payload)


def recv_object(src: int | None = None, group=None) -> tuple[object, int]:
    """(object, sender's global rank); src=None takes the first sender."""
    size = torch.zeros(1, dtype=torch.int64)
    sender = dist.recv(size, src, group=group)
    return recv_payload(size, sender, group), sender


class Doorbell:
    """Which sender has a message waiting, without blocking: a queue in the processes' key-value store
    (the one they met at). gloo cannot test a posted receive for completion, so a sender first rings
    (pushes its rank), then sends; the receiver looks at the queue's length (~30 us), and receives
    from a sender only once it has rung, when the bytes are already on their way.

        sender:   bell.ring(rank); send_object(obj, 0)
        receiver: got = bell.poll()   ->  (obj, rank) or None
    """

    def __init__(self, store, key: str = "rollouts") -> None:
        self.store, self.key = store, key

    def ring(self, rank: int) -> None:
        self.store.queue_push(self.key, str(rank))

    def poll(self, group=None):
        if self.store.queue_len(self.key) == 0:
            return None
        rank = int(self.store.queue_pop(self.key, False))
        obj, _ = recv_object(rank, group)
        return obj, rank
