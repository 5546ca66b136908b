"""The rollout side: a copy of the policy, the sampler and the reward, nothing else.

    worker = RolloutWorker(spec)              spec: what the learner's sampler holds (WorkerSpec)
    worker.load(version, received, "bucket")  new weights from the learner
    message = worker.generate(index)          prompts -> G completions each -> rewards, stamped

A `RolloutMessage` carries the rollout (tokens, masks, rewards and the behaviour policy's log-probs,
`sampling_logprobs`), the policy version that sampled it, and where the two random streams stand.
The single-process trainer draws prompts and minibatch orders from ONE data stream: prompts for step
n, then the update's shuffles, then prompts for step n + 1. So that a split draws the same prompts and
orders whatever the staleness, the worker skips the draws the learner's update will make (one
randperm(N) per pass, as `Trainer.update` does) and sends the stream's state after its prompt draws:
the learner shuffles from there. `tests/test_distributed.py` checks that the two stay in step.

`rollout_worker_main` is a rollout process: it joins the process group, receives its spec, then
loops: wait for a grant (a ticket to sample, maybe new weights), sample, send the rollout.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import os
import signal
import threading
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from ..rl.rollout import Rollout, RolloutSampler
from .weights import load_weights, receive_buffers, receive_weights, trainable_tensors
from .wire import Doorbell, recv_object, send_object

# What a grant header says: header = [kind, version, has_weights, streams, seed, index]
GRANT, STOP = 1, 2
STREAMS_KEEP, STREAMS_STATES, STREAMS_SEED = 0, 1, 2
HEADER_SIZE = 6


@dataclass
class WorkerSpec:
    """Everything a rollout copy needs, taken from the learner's trainer (pickled to a rollout process)."""

    policy: torch.nn.Module
    tokenizer: object
    task: object
    reward_fn: object
    accuracy_fn: object
    train_examples: list
    sampling: object  # SamplingConfig
    num_generations: int
    prompts_per_step: int
    shuffles: int  # the learner's minibatch shuffles per rollout: config.num_iterations
    device: str = "cpu"
    dtype: str = "float32"
    cache: str = "static"
    sync: str = "bucket"
    seed: int = 0

    @classmethod
    def from_trainer(cls, trainer, split, sampler=None) -> WorkerSpec:
        """The spec of `trainer`'s sampler (or `sampler`) with `split`'s rollout precision and sync mode."""
        s, c = sampler or trainer.sampler, trainer.config
        return cls(policy=copy.deepcopy(trainer.policy).cpu(), tokenizer=s.tokenizer, task=s.task,
                   reward_fn=s.reward_fn, accuracy_fn=s.accuracy_fn, train_examples=list(s.train_examples),
                   sampling=s.sampling, num_generations=s.num_generations,
                   prompts_per_step=c.prompts_per_step, shuffles=c.num_iterations,
                   device=str(trainer.device), dtype=split.rollout_dtype,
                   cache=split.rollout_cache, sync=split.sync,
                   seed=c.seed)


@dataclass
class RolloutMessage:
    """One rollout on the wire (CPU tensors) and what the learner needs to use it."""

    rollout: Rollout
    version: int  # the policy version that sampled every token of it (weights change only between rollouts)
    index: int  # the ticket: the how-many-th rollout of the run
    worker: int  # the rollout process's rank (0: inline)
    data_state: torch.Tensor  # data stream after this rollout's prompt draws: the learner shuffles from here
    next_data_state: torch.Tensor  # after the learner's shuffles: where the next rollout's prompts start
    next_sample_state: torch.Tensor  # sampling stream after this rollout
    sample_seconds: float = 0.0
    extra: dict = field(default_factory=dict)


# The lab's prompt + completion is ~20 tokens: int8 groups of 8 keys (the KV cache's residual_length),
# not the default 32, so that most of the cache is quantized.
INT8_RESIDUAL_LENGTH = 8


def cache_arguments(cache: str) -> dict | None:
    """`generate`'s cache arguments for a rollout copy's KV cache: None (static) or the int8 cache."""
    return None if cache == "static" else {"cache": "int8", "residual_length": INT8_RESIDUAL_LENGTH}


def rollout_to(rollout: Rollout, device) -> Rollout:
    """The same rollout with every tensor on `device`."""
    values = {name: (value.to(device) if isinstance(value, torch.Tensor) else value)
              for name, value in vars(rollout).items()}
    return Rollout(**values)


class RolloutWorker:
    """A rollout copy of the policy (in `spec.dtype`) and its sampler (`spec.cache`: "int8" is the
    quantized KV cache). The copy never trains: its weights come from the learner."""

    def __init__(self, spec: WorkerSpec, rank: int = 0) -> None:
        self.spec, self.rank = spec, rank
        self.device = torch.device(spec.device)
        policy = copy.deepcopy(spec.policy).to(self.device)
        self.tensors = trainable_tensors(policy)  # the order the learner sends them in, before any cast
        self.policy = policy.to(getattr(torch, spec.dtype)).eval()
        self.sampler = RolloutSampler(
            self.policy, spec.tokenizer, spec.task, spec.reward_fn, spec.train_examples, spec.sampling,
            spec.num_generations, sample_generator=torch.Generator(self.device).manual_seed(spec.seed),
            data_generator=torch.Generator().manual_seed(spec.seed), accuracy_fn=spec.accuracy_fn,
            cache=cache_arguments(spec.cache))
        self.version: int | None = None

    def load(self, version: int, received: list[torch.Tensor], mode: str) -> None:
        load_weights(self.tensors, received, mode)
        self.version = version

    def streams(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(sampling, data) stream states now."""
        return self.sampler.sample_generator.get_state(), self.sampler.data_generator.get_state()

    def set_streams(self, sample_state: torch.Tensor, data_state: torch.Tensor) -> None:
        self.sampler.sample_generator.set_state(sample_state)
        self.sampler.data_generator.set_state(data_state)

    def seed_streams(self, seed: int) -> None:
        """A stream of its own (a second worker must not draw the first one's prompts)."""
        self.sampler.sample_generator.manual_seed(seed)
        self.sampler.data_generator.manual_seed(seed)

    def generate(self, index: int) -> RolloutMessage:
        """One rollout of `prompts_per_step` prompts, sampled with the weights of version `self.version`."""
        if self.version is None:
            raise RuntimeError("the rollout worker has no weights yet: load() the learner's first")
        start = time.perf_counter()
        rollout = self.sampler(self.spec.prompts_per_step)
        data = self.sampler.data_generator
        data_state = data.get_state()
        for _ in range(self.spec.shuffles):  # the draws Trainer.update makes: one randperm(N) per pass
            torch.randperm(len(rollout), generator=data)
        return RolloutMessage(rollout=rollout_to(rollout, "cpu"), version=self.version, index=index,
                              worker=self.rank, data_state=data_state, next_data_state=data.get_state(),
                              next_sample_state=self.sampler.sample_generator.get_state(),
                              sample_seconds=time.perf_counter() - start)


# ----------------------------------------------------------------------------------------------
# the rollout process


def weight_groups(world_size: int, backend: str) -> list:
    """One process group per rollout worker, {learner, worker r}: weights and grants travel there.
    Every rank creates every group, in the same order (torch.distributed requires it)."""
    return [dist.new_group([0, rank], backend=backend) for rank in range(1, world_size)]


def group_device(backend: str, device: torch.device) -> torch.device:
    """Where a group's tensors must live: on the GPU for nccl, anywhere for gloo (we use the CPU)."""
    return device if backend == "nccl" else torch.device("cpu")


def rendezvous(rank: int, world_size: int, master_addr: str, master_port: int, timeout: float,
               master: bool = False):
    """The key-value store the processes meet at (rank 0 hosts it). A worker announces itself with
    the key `worker{rank}` before joining the group, so the learner can tell a worker that never
    started from one that is slow."""
    return dist.TCPStore(master_addr, master_port, world_size, is_master=master, wait_for_workers=False,
                         timeout=datetime.timedelta(seconds=timeout))


def init_process_group(rank: int, world_size: int, store, timeout: float) -> None:
    """The default group over gloo (rollouts and the spec are CPU bytes, whatever the weights' backend)."""
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=timeout))


def exit_with_parent(parent: int) -> None:
    """Exit when the learner that started this process is gone (killed before it could stop us)."""
    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(0)

    threading.Thread(target=watch, daemon=True, name="exit-with-parent").start()


def rollout_worker_main(rank: int, world_size: int, master_addr: str, master_port: int, split: dict,
                        joined: bool = False) -> None:
    """A rollout process. `split` is SplitConfig.to_dict(). joined=True: the default process group
    exists already (torchrun, set up by the command line)."""
    from .config import SplitConfig

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the learner stops us (a Ctrl-C reaches the whole group)
    split = SplitConfig(**split)
    torch.set_num_threads(split.threads)
    store = None
    if not joined:
        store = rendezvous(rank, world_size, master_addr, master_port, split.timeout)
        store.set(f"worker{rank}", "up")
        init_process_group(rank, world_size, store, split.timeout)
    groups = weight_groups(world_size, split.backend)
    group = groups[rank - 1]
    (spec, bell_address), _ = recv_object(0)
    if bell_address is not None:  # torchrun: the learner hosts a store of its own for the doorbell
        store = rendezvous(rank, world_size, *bell_address, split.timeout)
    bell = Doorbell(store)
    if spec.device.startswith("cuda"):  # one GPU per process
        spec.device = f"cuda:{rank % torch.cuda.device_count()}"
        torch.cuda.set_device(spec.device)  # nccl's communicator uses the current device
    worker = RolloutWorker(spec, rank)
    on = group_device(split.backend, worker.device)
    buffers = receive_buffers(worker.tensors, spec.sync, device=on)
    sample_like, data_like = worker.streams()
    header = torch.zeros(HEADER_SIZE, dtype=torch.int64, device=on)
    try:
        while True:
            dist.broadcast(header, 0, group=group)  # wait for a grant
            kind, version, has_weights, streams, seed, index = header.tolist()
            if kind == STOP:
                break
            if has_weights:
                receive_weights(buffers, group)
                worker.load(version, buffers, spec.sync)
            if streams == STREAMS_STATES:
                states = [torch.empty_like(sample_like).to(on), torch.empty_like(data_like).to(on)]
                for state in states:
                    dist.broadcast(state, 0, group=group)
                worker.set_streams(states[0].cpu(), states[1].cpu())
            elif streams == STREAMS_SEED:
                worker.seed_streams(seed)
            message = worker.generate(index)
            bell.ring(rank)
            send_object(message, 0)
    finally:
        dist.destroy_process_group()


def torchrun_rollout_worker(split) -> int:
    """A torchrun rank > 0 of `python -m rlhf_lab train`: join torchrun's group and sample for rank 0."""
    from .config import torchrun_environment

    environment = torchrun_environment()
    torch.set_num_threads(split.threads)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=split.timeout))  # env:// from torchrun
    rollout_worker_main(environment["rank"], environment["world_size"], environment["master_addr"],
                        environment["master_port"], split.to_dict(), joined=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    """`python -m rlhf_lab.distributed --rank R --world-size W --master-port P --split JSON`: what
    the learner starts for each rollout worker (a fresh interpreter, as torchrun starts its ranks:
    unlike multiprocessing's spawn, it never re-runs the script that started the learner)."""
    parser = argparse.ArgumentParser(prog="python -m rlhf_lab.distributed")
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world-size", type=int, required=True)
    parser.add_argument("--master-addr", default="127.0.0.1")
    parser.add_argument("--master-port", type=int, required=True)
    parser.add_argument("--split", required=True, help="SplitConfig as JSON")
    args = parser.parse_args(argv)
    exit_with_parent(os.getppid())
    split = json.loads(args.split)
    rollout_worker_main(args.rank, args.world_size, args.master_addr, args.master_port, split)
    return 0
