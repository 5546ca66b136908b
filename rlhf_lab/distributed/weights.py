"""Weight sync: the learner's trainable tensors travel to the rollout copies by broadcast on a process
group of their own, either as one flat bucket or tensor by tensor.

    payload = weight_payload(tensors, "bucket")     a copy the next optimiser step cannot touch
    send_weights(payload, group)                    learner: broadcast each payload tensor (src = rank 0)
    buffers = receive_buffers(tensors, "bucket")    rollout worker: where the broadcast lands
    receive_weights(buffers, group); load_weights(tensors, buffers, "bucket")

A bucket costs one call whatever the number of tensors: the fixed cost of a collective (a message
round trip, a kernel launch on a GPU) is paid once instead of once per tensor, which is why OpenRLHF,
verl and TRL group many tensors per broadcast. Only trainable tensors are sent: with LoRA that is
the adapters, a few percent of the model. The rollout copy may hold another precision (bf16, fp16):
`load_weights` casts on arrival, the wire carries the learner's precision.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ..util.validation import check_choice
from .config import SYNC_MODES


def trainable_tensors(model: torch.nn.Module) -> list[torch.Tensor]:
    """The tensors a weight sync sends, in the order both sides agree on: the trainable parameters."""
    return [p for p in model.parameters() if p.requires_grad]


def flatten(tensors: list[torch.Tensor]) -> torch.Tensor:
    """One contiguous 1-D copy of `tensors`, (sum of numel,), in their order and the first one's dtype."""
    return torch.cat([t.detach().reshape(-1).to(tensors[0].dtype) for t in tensors])


def unflatten_into(tensors: list[torch.Tensor], flat: torch.Tensor) -> None:
    """Copy consecutive slices of `flat` into `tensors` (casting to each tensor's dtype)."""
    if flat.numel() != sum(t.numel() for t in tensors):
        raise ValueError(f"a bucket of {flat.numel()} values cannot fill tensors of "
                         f"{sum(t.numel() for t in tensors)} values: the two sides hold different models")
    offset = 0
    with torch.no_grad():
        for t in tensors:
            t.copy_(flat[offset: offset + t.numel()].view_as(t))
            offset += t.numel()


def weight_payload(tensors: list[torch.Tensor], mode: str) -> list[torch.Tensor]:
    """What one sync broadcasts, copied now: [flat bucket] or one clone per tensor."""
    check_choice("sync", mode, SYNC_MODES)
    if mode == "bucket":
        return [flatten(tensors)]
    return [t.detach().clone() for t in tensors]


def receive_buffers(tensors: list[torch.Tensor], mode: str, dtype: torch.dtype = torch.float32,
                    device=None) -> list[torch.Tensor]:
    """Empty buffers shaped like the learner's payload (its dtype: `dtype`) for `receive_weights`."""
    check_choice("sync", mode, SYNC_MODES)
    device = device or tensors[0].device
    if mode == "bucket":
        return [torch.empty(sum(t.numel() for t in tensors), dtype=dtype, device=device)]
    return [torch.empty(t.shape, dtype=dtype, device=device) for t in tensors]


def send_weights(payload: list[torch.Tensor], group, src: int = 0) -> None:
    """Learner side: broadcast each payload tensor from `src` on `group` (1 call per bucket or tensor)."""
    for t in payload:
        dist.broadcast(t, src, group=group)


def receive_weights(buffers: list[torch.Tensor], group, src: int = 0) -> None:
    """Rollout side: the same broadcasts, landing in `buffers`."""
    for t in buffers:
        dist.broadcast(t, src, group=group)


def load_weights(tensors: list[torch.Tensor], received: list[torch.Tensor], mode: str) -> None:
    """Put a received payload into the rollout copy's tensors (cast to their dtype)."""
    if mode == "bucket":
        unflatten_into(tensors, received[0])
        return
    if len(received) != len(tensors):
        raise ValueError(f"received {len(received)} tensors for a model with {len(tensors)}: the two sides "
                         "hold different models")
    with torch.no_grad():
        for t, r in zip(tensors, received):
            t.copy_(r)
