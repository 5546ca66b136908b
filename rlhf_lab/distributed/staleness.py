"""Bounding staleness twice: at the source (admission) and at the sink (the queue drops).

    staleness = learner's version when it consumes a rollout - the version that sampled it

Admission (AReaL's rule, arXiv 2505.24298, section 5): a rollout may start only while

    rollouts granted - rollouts dropped  <=  learner version + K

i.e. at most K + 1 rollouts are granted and not yet trained on. Consumed in the order they were
granted, none is then staler than K, and no generation is wasted. With several workers a slow
one's rollout can arrive after later ones and exceed K: the queue drops it and counts it (TRL's
async GRPO and prime-rl drop too; AReaL interrupts the generation instead).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from ..util.validation import check_number


@dataclass
class Admission:
    """The ticket counter. `granted` and `dropped` count over the whole run; at a (re)start, tickets
    in flight are forgotten (their work is sampled again)."""

    max_staleness: int
    granted: int = 0
    dropped: int = 0

    def __post_init__(self) -> None:
        check_number("max_staleness", self.max_staleness, low=0, integer=True)

    def may_grant(self, version: int) -> bool:
        return self.granted - self.dropped <= version + self.max_staleness

    def grant(self) -> None:
        """A worker starts a rollout with the current weights."""
        self.granted += 1

    def take(self, queue: RolloutQueue, version: int):
        """The queue's oldest message at most K versions old, or None. Each message the queue drops on
        the way frees its ticket here, so a worker may start a fresh rollout in its place."""
        dropped = queue.dropped
        message = queue.pop(version)
        self.dropped += queue.dropped - dropped
        return message

    def restart(self, version: int, queued: int) -> None:
        """Tickets in flight were lost: count only what was trained on (version) and what is queued."""
        self.granted, self.dropped = version + queued, 0


class RolloutQueue:
    """A bounded FIFO of rollout messages (anything with a `.version`). `pop(version)` returns the
    oldest message at most `max_staleness` versions old, dropping (and counting) staler ones."""

    def __init__(self, max_staleness: int, capacity: int) -> None:
        check_number("max_staleness", max_staleness, low=0, integer=True)
        check_number("capacity", capacity, low=1, integer=True)
        self.max_staleness, self.capacity = max_staleness, capacity
        self.items: deque = deque()
        self.dropped = 0
        self.dropped_staleness: list[int] = []  # how stale each dropped message was

    def __len__(self) -> int:
        return len(self.items)

    def put(self, message) -> None:
        if len(self.items) >= self.capacity:
            raise RuntimeError(f"the rollout queue is full ({self.capacity} rollouts): admission should have "
                               "held the workers back")
        self.items.append(message)

    def pop(self, version: int):
        """The oldest fresh-enough message, or None; staler ones are dropped on the way."""
        while self.items:
            message = self.items.popleft()
            staleness = version - message.version
            if staleness <= self.max_staleness:
                return message
            self.dropped += 1
            self.dropped_staleness.append(staleness)
        return None
