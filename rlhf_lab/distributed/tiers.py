"""Where the learner's rollouts come from: a rollout tier.

    tier.start(version, payload, streams)   give the workers weights and where the random streams stand
    message = tier.next_message(version)    the oldest rollout at most K versions old (blocks)
    tier.publish(version, payload)          new weights: the next grants carry them
    tier.close()

`InlineTier`: one worker in this process, each rollout sampled with the weights of exactly K
versions ago (of the start version at first): the schedule a split follows when its rollout workers
are never the bottleneck, deterministic, with no overlap. `ProcessTier`: rollout processes over
torch.distributed, started here as `python -m rlhf_lab.distributed` subprocesses (launch="spawn": a fresh
interpreter each, as torchrun starts its ranks, so the caller's script is never re-run) or already
there (torchrun).

The learner's protocol with each process (on the worker's own group, {learner, worker}):

    learner --- grant [version, has_weights, streams, index] (+ weights) (+ stream states) ---> worker
    learner <----------------- rollout message (tokens, mu's log-probs, version) ------------- worker

A grant is a ticket: the worker samples one rollout, sends it, and waits for the next grant. The
learner grants while the admission rule allows (staleness.py), looking for rollouts between its
steps and while it waits; it never blocks on a worker that is sampling. If a rollout process dies
(spawn), the learner logs it, starts the rollout processes again and goes on: the lost rollouts are
sampled again from the stream position after the last rollout that arrived.
"""

from __future__ import annotations

import datetime
import json
import subprocess
import sys
import tempfile
import time
import warnings

import torch
import torch.distributed as dist

from .config import SplitConfig, check_backend, check_port_free, check_split_processes, free_port
from .staleness import Admission, RolloutQueue
from .weights import send_weights, trainable_tensors
from .wire import Doorbell, send_object
from .worker import (
    GRANT,
    HEADER_SIZE,
    STOP,
    STREAMS_KEEP,
    STREAMS_SEED,
    STREAMS_STATES,
    RolloutWorker,
    WorkerSpec,
    group_device,
    init_process_group,
    rendezvous,
    weight_groups,
)

POLL_SECONDS = 0.0005  # how long the learner sleeps between looks for a rollout when it has none


class InlineTier:
    """One rollout worker in this process; rollout n is sampled with version max(start, n - K), capped
    at the learner's version."""

    def __init__(self, spec: WorkerSpec, split: SplitConfig) -> None:
        self.split = split
        self.worker = RolloutWorker(spec)
        self.payloads: dict[int, list[torch.Tensor]] = {}
        self.queue_length = 0
        self.dropped = 0
        self.restarts = 0
        self.sync_seconds = 0.0

    def start(self, version: int, payload: list[torch.Tensor], streams) -> None:
        self.start_version = self.next_index = version
        self.payloads = {version: payload}
        self.worker.set_streams(*streams)

    def publish(self, version: int, payload: list[torch.Tensor]) -> None:
        self.payloads[version] = payload
        for old in [v for v in self.payloads if v < version - self.split.max_staleness]:
            del self.payloads[old]

    def next_message(self, version: int):
        n = self.next_index
        weights = min(version, max(self.start_version, n - self.split.max_staleness))
        if self.worker.version != weights:
            start = time.perf_counter()
            self.worker.load(weights, self.payloads[weights], self.split.sync)
            self.sync_seconds += time.perf_counter() - start
        self.next_index += 1
        return self.worker.generate(n)

    def close(self) -> None:
        self.payloads = {}

    @property
    def pids(self) -> list[int]:
        return []


class ProcessTier:
    """Rollout processes; this process is the learner (rank 0)."""

    def __init__(self, spec: WorkerSpec, split: SplitConfig, environment: dict | None = None) -> None:
        self.spec, self.split = spec, split
        self.environment = environment  # torchrun's {rank, world_size, ...}; None: spawn our own
        self.processes: list = []
        self.restarts = 0
        self.sync_seconds = 0.0
        capacity = split.max_staleness + split.rollout_workers + 1
        self.queue = RolloutQueue(split.max_staleness, capacity=capacity)
        self.admission = Admission(split.max_staleness)
        self.running = False

    # -------------------------------------------------------------------------------- start / stop

    def start(self, version: int, payload: list[torch.Tensor], streams) -> None:
        """Start (or join) the rollout processes, send each its spec, and grant the first rollouts."""
        split = self.split
        device = torch.device(self.spec.device)
        if self.environment is not None:
            world = self.environment["world_size"]
            check_split_processes(world)
            if world != split.world_size:
                raise ValueError(f"rollout_workers ({split.rollout_workers}) must be WORLD_SIZE - 1 = "
                                 f"{world - 1} under torchrun (one learner, the other ranks sample)")
        else:
            check_split_processes(split.world_size, "1 + rollout_workers")
        check_backend(split.backend, split.world_size)
        if self.environment is None:
            port = split.master_port or free_port(split.master_addr)
            check_port_free(split.master_addr, port)
            store = rendezvous(0, split.world_size, split.master_addr, port, split.timeout, master=True)
            self.spawn(port)
            self.wait_for_workers(store)
            init_process_group(0, split.world_size, store, split.timeout)
            bell_address = None  # the workers hold the rendezvous store already
        else:
            if not dist.is_initialized():
                # torchrun's env:// (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE)
                dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=split.timeout))
            bell_address = (self.environment["master_addr"], free_port())
            store = rendezvous(0, split.world_size, *bell_address, split.timeout, master=True)
        self.groups = weight_groups(split.world_size, split.backend)
        self.device = group_device(split.backend, device)
        for rank in range(1, split.world_size):
            send_object((self.spec, bell_address), rank)
        self.inbox = Doorbell(store)
        self.version, self.payload = version, [t.to(self.device) for t in payload]
        self.streams = streams  # where worker 1's streams start: after the last rollout that arrived
        self.worker_version = {rank: None for rank in range(1, split.world_size)}
        self.fresh = set(self.worker_version)  # workers whose streams must be set by their first grant
        self.waiting = list(self.worker_version)  # every worker waits for its first grant
        self.admission.restart(version, len(self.queue))
        self.running = True
        self.grant(version)

    def spawn(self, port: int) -> None:
        """Start one `python -m rlhf_lab.distributed` per rollout worker (its own session: a Ctrl-C meant
        for the learner does not reach it; the learner stops it). Its output goes to a file, shown if it
        fails."""
        split = self.split
        self.processes, self.logs = [], []
        for rank in range(1, split.world_size):
            log = tempfile.TemporaryFile()
            command = [sys.executable, "-m", "rlhf_lab.distributed", "--rank", str(rank), "--world-size",
                       str(split.world_size), "--master-addr", split.master_addr, "--master-port", str(port),
                       "--split", json.dumps(split.to_dict())]
            self.processes.append(subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                                   start_new_session=True))
            self.logs.append(log)

    def worker_log(self, rank: int) -> str:
        """The last lines rollout process `rank` wrote."""
        log = self.logs[rank - 1]
        log.seek(0)
        return log.read().decode(errors="replace")[-2000:]

    def wait_for_workers(self, store) -> None:
        """Wait until every rollout process has announced itself, failing fast if one exits first."""
        deadline = time.perf_counter() + self.split.timeout
        keys = [f"worker{rank}" for rank in range(1, self.split.world_size)]
        while not store.check(keys):
            for rank, process in enumerate(self.processes, start=1):
                if process.poll() is not None:
                    self.end_processes()
                    raise RuntimeError(f"rollout worker {rank} exited with code {process.returncode} while "
                                       f"starting:\n{self.worker_log(rank)}")
            if time.perf_counter() > deadline:
                self.end_processes()
                raise RuntimeError(f"the rollout workers did not start within {self.split.timeout:.0f} s "
                                   "(timeout)")
            time.sleep(0.01)

    def close(self) -> None:
        """Stop every worker: a STOP grant to each as it comes back for a grant (rollouts still
        arriving are discarded); workers that do not stop in time are terminated (spawn only)."""
        if not self.running:
            return
        self.running = False
        told, deadline = set(), time.perf_counter() + (2.0 if self.processes else self.split.timeout)
        try:
            while len(told) < len(self.worker_version) and time.perf_counter() < deadline:
                while (received := self.inbox.poll()) is not None:
                    self.waiting.append(received[1])
                for rank in self.waiting:
                    if rank not in told:
                        self.send_header(rank, [STOP, 0, 0, 0, 0, 0])
                        told.add(rank)
                self.waiting = []
                if self.processes and any(p.poll() is not None for p in self.processes):
                    break
                time.sleep(POLL_SECONDS)
        except (RuntimeError, KeyboardInterrupt):  # a broken connection: the processes are ended below
            pass
        finally:
            self.end_processes()
            dist.destroy_process_group()

    def end_processes(self) -> None:
        for process in self.processes:
            try:
                process.wait(timeout=2.0)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self.processes = []

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.processes]

    @property
    def queue_length(self) -> int:
        return len(self.queue)

    @property
    def dropped(self) -> int:
        return self.queue.dropped

    # ------------------------------------------------------------------------------------ grants

    def send_header(self, rank: int, values: list[int]) -> None:
        header = torch.tensor(values, dtype=torch.int64, device=self.device)
        dist.broadcast(header, 0, group=self.groups[rank - 1])

    def grant(self, version: int) -> None:
        """Give tickets to waiting workers while admission allows, each with the newest weights it lacks."""
        while self.waiting and self.admission.may_grant(version):
            rank = self.waiting.pop(0)
            has_weights = self.worker_version[rank] != self.version
            streams, seed = STREAMS_KEEP, 0
            if rank in self.fresh:  # worker 1 continues the single stream; others draw their own
                streams = STREAMS_STATES if rank == 1 else STREAMS_SEED
                seed = self.spec.seed + 1_000_003 * rank + self.version
            header = [GRANT, self.version, int(has_weights), streams, seed, self.admission.granted]
            assert len(header) == HEADER_SIZE
            start = time.perf_counter()
            self.send_header(rank, header)
            if has_weights:
                send_weights(self.payload, self.groups[rank - 1])
                self.worker_version[rank] = self.version
            if rank not in self.fresh:  # a first grant waits for the worker to build its copy: not sync time
                self.sync_seconds += time.perf_counter() - start
            if streams == STREAMS_STATES:
                for state in self.streams:
                    dist.broadcast(state.to(self.device), 0, group=self.groups[rank - 1])
            self.fresh.discard(rank)
            self.admission.grant()

    def publish(self, version: int, payload: list[torch.Tensor]) -> None:
        self.version, self.payload = version, [t.to(self.device) for t in payload]
        self.exchange(version)

    def exchange(self, version: int) -> None:
        """Queue what has arrived, then grant what admission allows. A connection that breaks because
        a rollout process died meanwhile (killed while it sent a rollout, or while it was granted one)
        restarts the rollout processes; any other error is raised."""
        try:
            self.collect()
            self.grant(version)
        except RuntimeError as error:
            deadline = time.perf_counter() + 5.0  # the dead process's exit may take a moment to show
            while not any(p.poll() is not None for p in self.processes):
                if time.perf_counter() > deadline:
                    raise error
                time.sleep(0.01)
            self.check_workers()

    # ---------------------------------------------------------------------------------- rollouts

    def collect(self) -> None:
        """Queue every rollout that has arrived; its sender now waits for a grant."""
        while (received := self.inbox.poll()) is not None:
            message, rank = received
            self.queue.put(message)
            self.waiting.append(rank)
            if rank == 1:
                self.streams = (message.next_sample_state, message.next_data_state)

    def next_message(self, version: int):
        """The oldest rollout at most K versions old; waits (watching the workers) until there is one."""
        waited_since = time.perf_counter()
        while True:
            self.exchange(version)
            message = self.admission.take(self.queue, version)
            if message is not None:
                self.exchange(version)  # a drop above may have freed a ticket
                return message
            self.check_workers()
            if time.perf_counter() - waited_since > self.split.timeout:
                raise RuntimeError(f"no rollout arrived for {self.split.timeout:.0f} s (timeout); a rollout "
                                   "worker may have died")
            time.sleep(POLL_SECONDS)

    def check_workers(self) -> None:
        """A rollout process that exited while the learner waits: log it and start the tier again."""
        dead = [(rank, p) for rank, p in enumerate(self.processes, start=1) if p.poll() is not None]
        if not dead:
            return
        rank, process = dead[0]
        if self.restarts >= self.split.max_restarts:
            raise RuntimeError(f"rollout worker {rank} exited (code {process.returncode}) and the rollout "
                               f"processes were already restarted {self.restarts} times (max_restarts)")
        in_flight = self.admission.granted - self.admission.dropped - self.version - len(self.queue)
        warnings.warn(f"rollout worker {rank} (pid {process.pid}) exited with code {process.returncode}; "
                      f"restarting the rollout processes; {max(in_flight, 0)} rollout(s) in flight will be "
                      "sampled again",
                      RuntimeWarning, stacklevel=2)
        self.restarts += 1
        self.running = False
        self.end_processes()
        dist.destroy_process_group()  # a receive posted to the dead worker goes with the group
        self.start(self.version, self.payload, self.streams)


def make_tier(trainer, split: SplitConfig, sampler) -> InlineTier | ProcessTier:
    """The tier for `split.launch`, holding a copy of what `sampler` holds."""
    from .config import torchrun_environment

    spec = WorkerSpec.from_trainer(trainer, split, sampler)
    if split.launch == "inline":
        return InlineTier(spec, split)
    environment = None
    if split.launch == "torchrun":
        environment = torchrun_environment()
        if environment is None:
            raise ValueError("launch='torchrun' needs the RANK and WORLD_SIZE that torchrun sets; start with "
                             "`torchrun --nproc-per-node N ...` or use launch='spawn'")
    return ProcessTier(spec, split, environment)


__all__ = ["InlineTier", "ProcessTier", "make_tier", "trainable_tensors"]
