"""`SplitConfig`: how the rollout/learner split runs, validated at construction, and the checks that
need the machine (a port in use, nccl without GPUs, a world size that does not fit).

Every message names the field and what is allowed, as the rest of the lab's settings do.
"""

from __future__ import annotations

import dataclasses
import os
import socket
from dataclasses import dataclass

import torch

from ..util.validation import Validated, check_choice, check_number, setting

LAUNCHES = ("spawn", "torchrun", "inline")
SYNC_MODES = ("bucket", "tensor")
BACKENDS = ("gloo", "nccl")
ROLLOUT_DTYPES = ("float32", "bfloat16", "float16")
ROLLOUT_CACHES = ("static", "int8")


@dataclass
class SplitConfig(Validated):
    """One learner process and `rollout_workers` rollout processes.

    launch: "spawn" starts the rollout processes from this one (`python -m rlhf_lab.distributed`), "torchrun"
        reads RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT from the environment (rank 0 learns),
        "inline" keeps one rollout worker in this process and feeds the learner rollouts exactly
        `max_staleness` versions old: the same algorithm without processes (deterministic, no overlap).
    max_staleness: K. A rollout may be at most K policy versions older than the learner that consumes
        it; admission keeps at most K + 1 rollouts granted and not yet trained on, and a rollout that
        still arrives staler (several workers, out of order) is dropped and counted.
    sync: how weights travel, "bucket" (one flat broadcast) or "tensor" (one broadcast per tensor).
    backend: the weight groups' backend, "gloo" (CPU) or "nccl" (GPUs). Rollouts always go over gloo.
    master_port: None picks a free port at run time.
    rollout_dtype, rollout_cache: the rollout copy's precision and KV cache ("int8": quantized, groups
        of 8), while the learner stays in its own precision: the rollout/trainer mismatch.
    timeout: seconds a collective may wait before it fails (a dead peer under torchrun).
    max_restarts: how often the rollout processes may be restarted after one dies (spawn only).
    """

    rollout_workers: int = setting(1, ge=1, help="rollout processes beside the learner")
    max_staleness: int = setting(0, ge=0, help="K: how many policy versions a rollout may lag")
    launch: str = setting("spawn", choices=LAUNCHES, help="spawn | torchrun | inline")
    sync: str = setting("bucket", choices=SYNC_MODES, help="one flat bucket, or tensor by tensor")
    backend: str = setting("gloo", choices=BACKENDS, help="the weight groups' backend")
    master_addr: str = setting("127.0.0.1", help="where the processes meet")
    master_port: int | None = setting(None, ge=1, le=65535, help="None: a free port picked at run time")
    rollout_dtype: str = setting("float32", choices=ROLLOUT_DTYPES, help="the rollout copy's precision")
    rollout_cache: str = setting("static", choices=ROLLOUT_CACHES, help="the rollout copy's KV cache")
    threads: int = setting(1, ge=1, help="torch threads per process: the processes share the cores")
    timeout: float = setting(120.0, gt=0, help="seconds a collective may wait before it fails")
    max_restarts: int = setting(3, ge=0, help="restarts of the rollout processes after one dies")

    def check(self) -> None:
        if self.launch == "inline" and self.rollout_workers != 1:
            raise ValueError(f"rollout_workers must be 1 with launch='inline' (one worker in this process), "
                             f"got {self.rollout_workers}")

    @property
    def world_size(self) -> int:
        """Processes in the split: the learner and the rollout workers."""
        return 1 + self.rollout_workers

    @property
    def dtype(self) -> torch.dtype:
        return getattr(torch, self.rollout_dtype)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def check_split_processes(world_size: int, field: str = "WORLD_SIZE") -> None:
    """A split needs a learner and at least one rollout process."""
    if world_size < 2:
        raise ValueError(f"a rollout/learner split needs at least two processes (one learner, one rollout "
                         f"worker): {field} must be >= 2, got {world_size}")


def check_backend(backend: str, processes: int) -> None:
    """nccl moves GPU tensors: it needs CUDA, an nccl build of torch, and a GPU per process."""
    check_choice("backend", backend, BACKENDS)
    if backend == "nccl":
        if not torch.cuda.is_available() or not torch.distributed.is_nccl_available():
            raise ValueError("backend 'nccl' needs CUDA GPUs and a torch built with NCCL "
                             f"(cuda available: {torch.cuda.is_available()}); use backend='gloo' on the CPU")
        if torch.cuda.device_count() < processes:
            raise ValueError(f"backend 'nccl' needs one GPU per process: {processes} processes, "
                             f"{torch.cuda.device_count()} GPUs; use fewer rollout_workers or backend='gloo'")


def check_port_free(address: str, port: int, field: str = "master_port") -> None:
    """Raise ValueError naming `field` when something already listens on (address, port)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((address, port))
        except OSError as error:
            raise ValueError(f"{field} {port} on {address} is in use ({error.strerror}); choose another port "
                             f"or None to pick a free one") from None


def free_port(address: str = "127.0.0.1") -> int:
    """A port nothing listens on now (the kernel picks it); the caller binds it soon after."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((address, 0))
        return probe.getsockname()[1]


def check_divides(batch: int, world_size: int, what: str = "prompts_per_step * num_generations") -> None:
    """Data parallelism splits the batch into equal shards: world_size must divide it."""
    check_number("world_size", world_size, low=1, integer=True)
    if batch % world_size:
        raise ValueError(f"world_size ({world_size}) must divide {what} ({batch}): each process takes "
                         "an equal share of the batch")


def torchrun_environment() -> dict | None:
    """{rank, world_size, local_rank, master_addr, master_port} when started by torchrun, else None."""
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return None
    return {"rank": int(os.environ["RANK"]), "world_size": int(os.environ["WORLD_SIZE"]),
            "local_rank": int(os.environ.get("LOCAL_RANK", 0)),
            "master_addr": os.environ.get("MASTER_ADDR", "127.0.0.1"),
            "master_port": int(os.environ.get("MASTER_PORT", 29500))}


def command_line_split(rollout_workers: int | None, max_staleness: int | None, saved: dict | None = None,
                       device: str = "cpu") -> SplitConfig | None:
    """The split `python -m rlhf_lab train` asks for: --rollout-workers / --max-staleness, the saved
    run's settings (--resume), or torchrun's environment (then rollout_workers is WORLD_SIZE - 1).
    Weights travel over nccl when the learner is on a CUDA device, else gloo. None: no split."""
    environment = torchrun_environment()
    if saved is None and rollout_workers is None and max_staleness is None and environment is None:
        return None
    settings = dict(saved or {})
    if rollout_workers is not None:
        settings["rollout_workers"] = rollout_workers
    if max_staleness is not None:
        settings["max_staleness"] = max_staleness
    settings["launch"], settings["master_port"] = "spawn", None  # a port of a saved run may be taken now
    settings["backend"] = "nccl" if str(device).startswith("cuda") and torch.cuda.is_available() else "gloo"
    if environment is not None:
        world = environment["world_size"]
        check_split_processes(world)
        settings.setdefault("rollout_workers", world - 1)
        if settings["rollout_workers"] != world - 1:
            raise ValueError(f"rollout_workers ({settings['rollout_workers']}) must be WORLD_SIZE - 1 = "
                             f"{world - 1} under torchrun (one learner, the other ranks sample)")
        settings["launch"] = "torchrun"
    return SplitConfig(**settings)
