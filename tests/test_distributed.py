"""The rollout/learner split (rlhf_lab.distributed): weight sync, admission and the staleness queue,
parity with the single-process Trainer (in this process and over two processes), a killed rollout
worker, SIGTERM and resume from the command line, data-parallel and accumulated gradients, and each
bad setting. Processes are started only where the test is about them (a start costs ~3 s)."""

from __future__ import annotations

import io
import json
import os
import signal
import socket
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pandas as pd
import pytest
import torch

from rlhf_lab.distributed import (
    Admission,
    AsyncTrainer,
    RolloutQueue,
    SplitConfig,
    check_divides,
    ddp,
    flatten,
    unflatten_into,
    weight_payload,
)
from rlhf_lab.distributed.config import check_backend
from rlhf_lab.rl import ALGORITHMS, Callback, Trainer, make_config

ROOT = Path(__file__).resolve().parents[1]
EPS = torch.finfo(torch.float32).eps
# small and quick, with a held-out evaluation at the end
SMALL = dict(steps=3, prompts_per_step=4, eval_every=3, eval_examples=16, seed=3)


@pytest.fixture(autouse=True)
def one_thread():
    """The learner computes in this process: one thread, as the rollout processes and the reference run."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def deterministic(history: pd.DataFrame) -> pd.DataFrame:
    """The columns a seeded run determines: all but clocks, throughput, memory and the split's own."""
    clocks = ("time", "tokens_per_s", "mem_")
    split = ("rollout_version", "staleness", "queue_length", "dropped_rollouts", "worker_restarts")
    return history[[c for c in history.columns if not any(k in c for k in clocks) and c not in split]]


def assert_same_history(actual: pd.DataFrame, expected: pd.DataFrame) -> None:
    """Bit for bit (NaN where NaN): the same algorithm on the same numbers."""
    expected = deterministic(expected)
    actual = actual[expected.columns]
    pd.testing.assert_frame_equal(actual.reset_index(drop=True), expected.reset_index(drop=True),
                                  check_exact=True)


@pytest.fixture(scope="module")
def grpo_reference() -> pd.DataFrame:
    return Trainer(make_config("grpo", SMALL)).train()


# --- weight sync, admission and the queue --------------------------------------------------------


def test_a_bucket_round_trips_and_a_payload_is_a_copy():
    tensors = [torch.randn(3, 4), torch.randn(5), torch.randn(2, 2, 2)]
    bucket = flatten(tensors)
    assert bucket.shape == (3 * 4 + 5 + 8,)
    targets = [torch.zeros_like(t) for t in tensors]
    unflatten_into(targets, bucket)
    assert all(torch.equal(a, b) for a, b in zip(targets, tensors))
    for mode in ("bucket", "tensor"):
        payload = weight_payload(tensors, mode)
        before = [p.clone() for p in payload]
        for t in tensors:
            t.add_(1.0)  # the optimiser's next step must not reach what is being sent
        assert all(torch.equal(a, b) for a, b in zip(payload, before))
    with pytest.raises(ValueError, match="different models"):
        unflatten_into(targets, bucket[:-1])
    with pytest.raises(ValueError, match="sync must be one of"):
        weight_payload(tensors, "shards")


def test_admission_keeps_at_most_k_plus_one_rollouts_ahead():
    admission = Admission(max_staleness=1)
    granted = []
    for version in (0, 0, 0, 1, 1, 2):  # the learner's version each time a worker asks
        if admission.may_grant(version):
            admission.grant()
            granted.append(version)
    assert granted == [0, 0, 1, 2]  # two tickets at version 0, then one per new version
    assert not admission.may_grant(2)
    queue = RolloutQueue(max_staleness=1, capacity=4)
    for version in granted:
        queue.put(type("Message", (), {"version": version})())
    assert admission.take(queue, 2).version == 1  # the two version-0 rollouts are 2 behind: dropped
    assert (queue.dropped, admission.dropped) == (2, 2)  # and their tickets given back
    assert admission.may_grant(2)


def test_the_queue_drops_what_is_staler_than_k_and_counts_it():
    class Message:
        def __init__(self, version):
            self.version = version

    queue = RolloutQueue(max_staleness=1, capacity=3)
    for version in (3, 5, 6):
        queue.put(Message(version))
    with pytest.raises(RuntimeError, match="full"):
        queue.put(Message(7))
    assert queue.pop(6).version == 5  # version 3 is 3 behind 6: dropped on the way
    assert (queue.dropped, queue.dropped_staleness, len(queue)) == (1, [3], 1)
    assert queue.pop(8) is None and queue.dropped == 2


# --- the split in this process: the same algorithm ------------------------------------------------


@pytest.mark.parametrize("algo", sorted(ALGORITHMS))
def test_inline_split_at_k0_is_the_trainer_bit_for_bit(algo):
    """Every algorithm through the split's path (rollouts from a worker's copy of the weights, streams
    handed over, pi_old recomputed by the learner) gives the Trainer's history exactly."""
    config = make_config(algo, SMALL, steps=2, eval_every=2)
    expected = Trainer(config).train()
    actual = AsyncTrainer(config, SplitConfig(launch="inline")).train()
    assert_same_history(actual, expected)
    assert actual["staleness"].dropna().tolist() == [0, 0]


def test_inline_split_feeds_rollouts_exactly_k_versions_old():
    trainer = AsyncTrainer(make_config("grpo", SMALL, steps=4, eval_every=0), SplitConfig(launch="inline",
                                                                                          max_staleness=2))
    history = trainer.train()
    assert history["rollout_version"].dropna().tolist() == [0, 0, 0, 1]
    assert history["staleness"].dropna().tolist() == [0, 1, 2, 2]
    assert history["dropped_rollouts"].iloc[-1] == 0


class BehaviourRatio(Callback):
    """max |log pi_prox - log mu| over each step's rollout, seen as its update begins."""

    def __init__(self) -> None:
        self.largest: list[float] = []

    def on_update_begin(self, trainer, rollout):
        from rlhf_lab.rl.off_policy import behaviour_log_ratio

        with torch.no_grad():
            prox = trainer.policy_outputs(rollout).logprobs
        mask = rollout.completion_mask.bool()
        self.largest.append(behaviour_log_ratio(prox, rollout.sampling_logprobs)[mask].abs().max().item())


def test_the_behaviour_ratio_is_one_at_k0_and_not_at_k2():
    """What the corrections read, pi_prox / mu: 1 up to the sampler's float rounding without staleness,
    far from 1 two versions behind."""
    largest = {}
    for k in (0, 2):
        monitor = BehaviourRatio()
        AsyncTrainer(make_config("grpo", SMALL, steps=4, eval_every=0, learning_rate=2e-3),
                     SplitConfig(launch="inline", max_staleness=k), callbacks=[monitor]).train()
        largest[k] = monitor.largest
    assert max(largest[0]) < 1e-4  # teacher forcing vs the KV cache's incremental sums
    assert largest[2][0] == pytest.approx(largest[0][0], abs=1e-4)  # the first rollout is not stale yet
    assert min(largest[2][1:]) > 100 * max(largest[0])


# --- the rollout/trainer mismatch ----------------------------------------------------------------


def test_the_mismatch_is_ordered_by_precision_and_the_decode_path_is_the_samplers():
    from rlhf_lab.distributed.mismatch import decode_logprobs, mismatch_metrics, rollout_copy
    from rlhf_lab.rl import next_token_logprobs

    trainer = Trainer(make_config("grpo", SMALL, prompts_per_step=8))
    rollout = trainer.collect_rollout(with_reference=False)
    learner = next_token_logprobs(trainer.policy, rollout)
    fp32 = decode_logprobs(rollout_copy(trainer.policy), rollout)
    mu = fp32.gather(-1, rollout.completion_ids.unsqueeze(-1)).squeeze(-1)
    mask = rollout.completion_mask.bool()
    # the same sums in another order (the sampler shares each prompt's cache over its G rows)
    scale = max(1.0, mu[mask].abs().max().item())
    assert (mu - rollout.sampling_logprobs)[mask].abs().max() <= 64 * EPS * scale
    metrics = {(dtype, cache): mismatch_metrics(decode_logprobs(rollout_copy(trainer.policy, dtype), rollout,
                                                                cache=cache), learner, rollout)
               for dtype, cache in [("float32", "static"), ("bfloat16", "static"), ("float16", "static"),
                                    ("float32", "int8")]}
    mean = {key: value["abs_logp_diff_mean"] for key, value in metrics.items()}
    # bf16 rounds at ~2^-8, fp16 at ~2^-11: ~8x apart; fp32 only reorders sums
    assert mean["bfloat16", "static"] > 3 * mean["float16", "static"] > 30 * mean["float32", "static"]
    assert mean["float32", "int8"] > 30 * mean["float32", "static"]
    kl = {key: value["kl_rollout_train"] for key, value in metrics.items()}
    assert kl["bfloat16", "static"] > kl["float16", "static"] > 0


def test_a_bf16_rollout_copy_with_an_int8_cache_trains_with_tis():
    split = SplitConfig(launch="inline", rollout_dtype="bfloat16", rollout_cache="int8")
    history = AsyncTrainer(make_config("grpo", SMALL, steps=2, eval_every=0, off_policy="tis"), split).train()
    assert history["policy_loss"].dropna().map(lambda v: v == v).all() and len(history) == 3


# --- bad settings fail fast, naming the field ----------------------------------------------------


@pytest.mark.parametrize(("settings", "message"), [
    ({"max_staleness": -1}, "max_staleness must satisfy 0 <= max_staleness"),
    ({"rollout_workers": 0}, "rollout_workers must satisfy 1 <= rollout_workers"),
    ({"sync": "shards"}, "sync must be one of"),
    ({"launch": "mpi"}, "launch must be one of"),
    ({"master_port": 70000}, "master_port must satisfy"),
    ({"launch": "inline", "rollout_workers": 2}, "rollout_workers must be 1 with launch='inline'"),
])
def test_bad_split_settings_name_the_field(settings, message):
    with pytest.raises(ValueError, match=message):
        SplitConfig(**settings)


def test_a_split_needs_two_processes_and_torchrun_its_environment(monkeypatch):
    from rlhf_lab.distributed.config import check_split_processes

    with pytest.raises(ValueError, match="at least two processes.*WORLD_SIZE must be >= 2, got 1"):
        check_split_processes(1)
    monkeypatch.delenv("RANK", raising=False)
    trainer = AsyncTrainer(make_config("grpo", SMALL), SplitConfig(launch="torchrun"))
    with pytest.raises(ValueError, match="launch='torchrun' needs the RANK and WORLD_SIZE"):
        trainer.train()
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    with pytest.raises(ValueError, match="WORLD_SIZE must be >= 2, got 1"):
        trainer.train()


def test_a_port_in_use_is_refused_before_any_process_starts():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        trainer = AsyncTrainer(make_config("grpo", SMALL), SplitConfig(master_port=port))
        with pytest.raises(ValueError, match=f"master_port {port} on 127.0.0.1 is in use"):
            trainer.train()
    assert trainer.worker_pids == []


def test_a_world_size_must_divide_the_batch():
    check_divides(32, 4)
    message = r"world_size \(3\) must divide prompts_per_step \* num_generations \(32\)"
    with pytest.raises(ValueError, match=message):
        check_divides(32, 3)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has GPUs: nccl may work")
def test_nccl_without_gpus_is_refused():
    with pytest.raises(ValueError, match="backend 'nccl' needs CUDA GPUs"):
        check_backend("nccl", 2)
    trainer = AsyncTrainer(make_config("grpo", SMALL), SplitConfig(backend="nccl"))
    with pytest.raises(ValueError, match="backend 'nccl' needs CUDA GPUs"):
        trainer.train()


# --- data parallel and gradient accumulation -----------------------------------------------------


def gradient_tolerance(*gradients: torch.Tensor) -> float:
    """Sums in another order round differently: a few float32 epsilons of the largest entry."""
    return 16 * EPS * max(g.abs().max().item() for g in gradients)


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo"])
def test_gradient_accumulation_gives_the_unsplit_gradient(loss_type):
    trainer = Trainer(make_config("grpo", SMALL, loss_type=loss_type))
    rollout = trainer.collect_rollout()
    trainer.compute_advantages(rollout)
    full = trainer.loss_and_gradient(rollout).gradient
    accumulated = ddp.accumulated_gradient(trainer, rollout, micro_batches=4)
    torch.testing.assert_close(accumulated, full, rtol=0, atol=gradient_tolerance(full))
    # the mistake it guards against: each micro-batch's own mean, averaged (wrong when shards' token
    # counts differ, as they do for a token mean)
    if loss_type == "bnpo":
        trainer.optimizer.zero_grad(set_to_none=True)
        for k in range(4):
            piece = rollout.select(ddp.shard_rows(len(rollout), k, 4))
            (trainer.algorithm.loss(piece, trainer.policy_outputs(piece))[0] / 4).backward()
        naive = ddp.flat_gradient(trainer.trainable_parameters())
        assert (naive - full).abs().max() > 100 * gradient_tolerance(full)


def test_two_data_parallel_learners_give_the_full_batch_gradient():
    config = make_config("grpo", SMALL, loss_type="bnpo")
    trainer = Trainer(config)
    rollout = trainer.collect_rollout()
    trainer.compute_advantages(rollout)
    full = trainer.loss_and_gradient(rollout).gradient
    parallel = ddp.run_data_parallel(2, ddp.gradient_worker, config)  # rank 0 here, rank 1 in a process
    torch.testing.assert_close(parallel, full, rtol=0, atol=gradient_tolerance(full))


# --- two processes ---------------------------------------------------------------------------------


def test_two_processes_at_k0_reproduce_the_trainer_bit_for_bit(grpo_reference):
    split = SplitConfig(max_staleness=0, sync="bucket", timeout=60)
    trainer = AsyncTrainer(make_config("grpo", SMALL), split)
    history = trainer.train()
    assert_same_history(history, grpo_reference)
    assert history["staleness"].dropna().tolist() == [0, 0, 0]
    assert trainer.worker_pids == []  # stopped at the end of train()


class KillWorker(Callback):
    """SIGKILL the rollout process after step `at`, while it samples the next rollout."""

    def __init__(self, at: int) -> None:
        self.at, self.killed = at, None

    def on_step_end(self, trainer, metrics, distributions=None):
        if trainer.step == self.at:
            self.killed = trainer.worker_pids[0]
            os.kill(self.killed, signal.SIGKILL)


def test_a_killed_rollout_worker_is_restarted_and_the_run_goes_on(grpo_reference):
    """At K = 0 the lost rollout is sampled again from the same stream position with the same weights:
    the run is still the Trainer's, bit for bit."""
    killer = KillWorker(at=1)
    split = SplitConfig(sync="tensor", timeout=60)
    trainer = AsyncTrainer(make_config("grpo", SMALL), split, callbacks=[killer])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        history = trainer.train()
    messages = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert any(f"pid {killer.killed}) exited with code -9; restarting" in m for m in messages), messages
    assert history["worker_restarts"].dropna().tolist() == [0, 1, 1]
    assert_same_history(history, grpo_reference)


# --- the command line: SIGTERM and --resume ------------------------------------------------------


def read_state_step(folder: Path) -> int:
    try:
        return json.loads((folder / "resume" / "trainer_state.json").read_text())["step"]
    except (FileNotFoundError, json.JSONDecodeError, KeyError):
        return -1


def test_sigterm_then_resume_continues_the_split_run_exactly(tmp_path):
    """`python -m rlhf_lab train --rollout-workers 1`: SIGTERM after a saved step stops it cleanly
    (exit 130, its state saved with the policy version and the streams' positions); --resume finishes
    it. At K = 0 the history is the uninterrupted Trainer's, bit for bit (written to CSV and read back)."""
    out = tmp_path / "run"
    settings = dict(SMALL, steps=10, eval_every=5)
    command = [sys.executable, "-m", "rlhf_lab", "train", "--algo", "grpo", "--out", str(out),
               "--rollout-workers", "1", "--max-staleness", "0", "--save-every", "1", "--no-progress",
               "--no-plots", "--threads", "1",
               "--steps", str(settings["steps"]), "--eval-every", str(settings["eval_every"]),
               "--seed", str(settings["seed"]), "--set", f"prompts_per_step={settings['prompts_per_step']}",
               "--set", f"eval_examples={settings['eval_examples']}"]
    environment = {**os.environ, "OMP_NUM_THREADS": "1"}
    run = subprocess.Popen(command, cwd=ROOT, env=environment, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT)
    deadline = time.time() + 120
    while read_state_step(out) < 2 and run.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    run.send_signal(signal.SIGTERM)
    output = run.communicate(timeout=120)[0].decode()
    stopped_at = read_state_step(out)
    assert run.returncode == 130, output
    assert 2 <= stopped_at < settings["steps"], output
    saved = json.loads((out / "run.json").read_text())
    assert saved["split"]["rollout_workers"] == 1 and saved["split"]["max_staleness"] == 0
    resume = [sys.executable, "-m", "rlhf_lab", "train", "--resume", str(out), "--no-progress", "--no-plots",
              "--threads", "1"]
    resumed = subprocess.run(resume, cwd=ROOT, env=environment, capture_output=True, text=True, timeout=180)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    history = pd.read_csv(out / "history.csv")
    assert history["step"].tolist() == list(range(settings["steps"] + 1))
    reference = Trainer(make_config("grpo", settings)).train()
    reference = pd.read_csv(io.StringIO(reference.to_csv(index=False)))  # the same float round trip
    assert_same_history(history, reference)
