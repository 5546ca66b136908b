"""`TrainingLoop`: what the SFT, reward-model, DPO and RL trainers share, so each holds only its own step.

    train(steps=None, time_budget=None)
        row 0 = the model before training (held-out accuracy), once
        while steps remain and the time budget lasts:
            train_step()                 atomic: a failed step leaves no trace
            evaluation() every config.eval_every steps, and after the last one (default: evaluate())
            callbacks' on_step_end       a callback may call request_stop(reason)
            early_stop(row)              e.g. stop_at_accuracy
        Stop in Jupyter (KeyboardInterrupt) or a non-finite loss ends the call cleanly; `stop_reason`
        says why, and train() again continues from the same step.

A subclass provides `config` (steps, time_budget, eval_every), `optimizer`, `evaluate()` and
`_step()` (one step, returning its row), and says what a step changes: `state_modules()` (the
trained weights), `state_generators()` (every torch.Generator a step draws from) and `step_state()`
(anything else, e.g. PPO's adaptive KL weight). A failed step restores all of them, and
`save_state(folder)` / `resume(folder)` (rlhf_lab.train.run_state) save them with `extra_state()`.
"""

from __future__ import annotations

import copy
import math
import warnings
from dataclasses import asdict
from pathlib import Path

import pandas as pd
import torch

from ..util.validation import check_number
from .callbacks import NonFiniteLossError, call_hooks
from .schedule import learning_rate_at


class TrainingLoop:
    stop_reason: str | None = None
    stop_request: str | None = None  # set by request_stop (a callback), read after the step's hooks
    history_columns: tuple = ()  # the columns `history` puts first, in this order (the rest follow)
    # the last words of the interrupt message: how to continue (the CLI names `--resume OUT`)
    resume_hint: str = "Call train() again to continue."

    def init_loop(self, callbacks=()) -> None:
        """The bookkeeping every trainer starts with: no rows, step 0, no training time yet."""
        self.callbacks = list(callbacks)
        self.rows: list[dict] = []
        self.step = 0
        self.train_time = 0.0  # seconds spent in training steps (evaluation excluded)
        self.stop_reason = None

    @property
    def history(self) -> pd.DataFrame:
        """One row per step (row 0 = the model before training), `history_columns` first; the config
        in `attrs["config"]`."""
        frame = pd.DataFrame(self.rows)
        ordered = [c for c in self.history_columns if c in frame.columns]
        frame = frame[ordered + [c for c in frame.columns if c not in ordered]]
        frame.attrs["config"] = asdict(self.config)
        return frame

    def train(self, steps: int | None = None, time_budget: float | None = None):
        """Run `steps` more steps (default config.steps) or until `time_budget` more seconds of
        training (default config.time_budget; evaluation excluded), whichever comes first.

        Returns the history. Stops early, cleanly, on KeyboardInterrupt or a non-finite loss
        (`self.stop_reason` says which); the model is then as it was after the last good step.
        Warns when held-out accuracy collapsed to 0 (`collapse_message`).
        """
        c = self.config
        steps = c.steps if steps is None else steps
        time_budget = c.time_budget if time_budget is None else time_budget
        check_number("steps", steps, low=0, integer=True)
        if time_budget is not None:
            check_number("time_budget", time_budget, low=0, low_open=True)
        budget_end = None if time_budget is None else self.train_time + time_budget
        first_step, last_step = self.step, self.step + steps
        self.stop_reason = None
        self.stop_request = None
        self.before_train()
        try:
            # Inside the try: a Stop while a callback starts (a dashboard drawing its first frame)
            # ends the call as cleanly as a Stop during a step.
            call_hooks(self.callbacks, "on_train_begin", self)
            if not self.rows:  # step 0: where we start from
                self.rows.append(self.start_row())
            elif self.evaluation_interrupted():  # a stop came during the last step's evaluation: finish it
                self.rows[-1].update(self.evaluation())
                self.stop_reason = self.early_stop(self.rows[-1])
            while not self.stop_reason and self.step < last_step and (budget_end is None or self.train_time < budget_end):
                metrics = self.train_step()
                out_of_time = budget_end is not None and self.train_time >= budget_end
                if c.eval_every and (self.step % c.eval_every == 0 or self.step == last_step or out_of_time):
                    metrics.update(self.evaluation())
                call_hooks(self.callbacks, "on_step_end", self, metrics, self.latest_distributions())
                self.stop_reason = self.early_stop(metrics) or self.stop_request
                if self.stop_reason:
                    break
            self.stop_reason = self.stop_reason or ("time_budget" if self.step < last_step else "steps")
        except KeyboardInterrupt:
            self.stop_reason = "interrupted"
            print(f"Training interrupted after step {self.step}; model and history are intact "
                  f"({len(self.rows)} rows). {self.resume_hint}")
        except NonFiniteLossError as exc:
            self.stop_reason = "non_finite"
            warnings.warn(str(exc), RuntimeWarning, stacklevel=2)
        finally:
            self.after_train()
            call_hooks(self.callbacks, "on_train_end", self)
        collapse = self.collapse_message() if self.step > first_step else None
        if collapse:
            warnings.warn(collapse, RuntimeWarning, stacklevel=2)
        return self.history

    def collapse_message(self) -> str | None:
        """A warning when held-out accuracy fell from above 0 to exactly 0 (no held-out problem solved
        any more): said at the end of train(), since every step may look fine on its own."""
        values = [row.get("eval_accuracy") for row in self.rows]
        accuracies = [v for v in values if isinstance(v, (int, float)) and math.isfinite(v)]
        if len(accuracies) < 2 or accuracies[0] <= 0 or accuracies[-1] != 0:
            return None
        return (f"held-out accuracy collapsed from {accuracies[0]:.1%} to 0 by step {self.step}: the model "
                f"no longer solves any held-out problem. A learning rate too high is the usual cause "
                f"(learning_rate={self.config.learning_rate}); lower it")

    def train_step(self) -> dict:
        """One step, atomically: if anything fails (a non-finite loss, a KeyboardInterrupt) the model,
        optimiser and RNG states are as before the step. Returns its row, appended to `history`."""
        snapshot, counters = self._snapshot(), (self.step, self.train_time)
        try:
            result = self._step()
            self.check_finite_weights()
        except BaseException:
            self._restore(snapshot)  # a half-done step never leaks into the model
            self.step, self.train_time = counters
            raise
        return self._commit(result)

    def evaluation_interrupted(self) -> bool:
        """Whether the last row is a step that was due a periodic evaluation but has none (a stop
        landed during it): train() then evaluates it first, so a resumed history has every row."""
        eval_every, row = self.config.eval_every, self.rows[-1] if self.rows else {}
        accuracy = row.get("eval_accuracy", 0.0)
        return bool(eval_every) and self.step > 0 and self.step % eval_every == 0 and accuracy != accuracy  # NaN

    def check_finite_weights(self) -> None:
        """Raise NonFiniteLossError if a trained weight is NaN or infinite (a finite loss and gradient
        can still step into overflow, e.g. with a huge learning rate); train_step then restores the
        weights from before the step.

        One look at all the weights first: the sum of their norms is finite exactly when every weight
        is, unless the sum itself overflows (weights of ~1e19 and more, all finite). Only when it is
        not finite are the parameters looked at one by one, to name the culprit (or to find none)."""
        modules = self.state_modules()
        with torch.no_grad():
            norms = [torch.linalg.vector_norm(p) for module in modules.values() for p in module.parameters()]
            if not norms or bool(torch.isfinite(torch.stack(norms).sum())):
                return
        for name, module in modules.items():
            for param_name, param in module.named_parameters():
                if not bool(torch.isfinite(param).all()):
                    raise NonFiniteLossError(f"non-finite weights in {name}.{param_name} after step {self.step}; "
                                             f"training stopped and the weights were kept from the step before")

    def _commit(self, result) -> dict:
        """Keep what a successful step produced (its row; the RL trainer also its distributions)."""
        self.rows.append(result)
        return result

    def _snapshot(self):
        """What a step may change, copied before it runs: weights, optimiser, generators, step state."""
        return ({name: clone_state(module.state_dict()) for name, module in self.state_modules().items()},
                optimizer_snapshot(self.optimizer),
                {name: generator.get_state() for name, generator in self.state_generators().items()},
                copy.deepcopy(self.step_state()))

    def _restore(self, snapshot) -> None:
        weights, optimizer_state, generator_states, step_state = snapshot
        for name, module in self.state_modules().items():
            module.load_state_dict(weights[name])
        restore_optimizer(self.optimizer, optimizer_state)
        for name, generator in self.state_generators().items():
            generator.set_state(generator_states[name])
        self.load_step_state(step_state)

    def request_stop(self, reason: str) -> None:
        """Stop train() after the current step, with `stop_reason` = reason (a callback's early
        stopping, e.g. on a held-out signal the trainer does not know about)."""
        self.stop_request = reason

    def add_callback(self, callback) -> None:
        self.callbacks.append(callback)

    # resumable state: what `rlhf_lab.train.run_state` saves and loads

    def state_modules(self) -> dict[str, torch.nn.Module]:
        """The trained modules by name, e.g. {"policy": ..., "critic": ...}: their weights are saved
        and checked for NaN after every step. A subclass that returns none cannot be saved."""
        return {}

    def state_generators(self) -> dict[str, torch.Generator]:
        """Every torch.Generator a step draws from, by name (their states are saved)."""
        return {}

    def step_state(self) -> dict:
        """What a step changes besides weights, optimiser and generators (e.g. an adaptive KL weight)."""
        return {}

    def load_step_state(self, state: dict) -> None:
        """Restore what `step_state` returned."""

    def extra_state(self) -> dict:
        """Anything else a resumed run needs (tensors, numbers, strings, lists and dicts of them)."""
        return self.step_state()

    def load_extra_state(self, state: dict) -> None:
        """Restore what `extra_state` returned."""
        self.load_step_state(state)

    def identity(self) -> dict[str, str]:
        """What the run is built on but does not save, by name -> a sha256 (`run_state.weights_sha256`),
        e.g. {"reference": ...}: a resume refuses a trainer whose identity differs (the frozen
        reference or reward model was changed on disk in between)."""
        return {}

    def save_state(self, folder) -> Path:
        """Write this trainer's whole state to `folder` (atomically); `resume(folder)` continues from it."""
        from .run_state import save_state

        return save_state(self, folder)

    def resume(self, folder):
        """Load the state saved in `folder` into this trainer (built with the same config; `steps`,
        `time_budget`, `eval_every` and `keep_distributions` may differ) and return it. On the
        CPU, `train()` then continues exactly as the saved run would have, row for row."""
        from .run_state import load_state

        load_state(self, folder)
        return self

    # hooks, no-ops by default

    def before_train(self) -> None:
        """Called when train() starts (SFT switches the model to training mode)."""

    def after_train(self) -> None:
        """Called when train() ends, however it ends, before the callbacks' on_train_end."""

    def evaluation(self) -> dict:
        """The evaluation columns of a row: {"eval_accuracy": evaluate()}. A trainer that measures more
        at each evaluation (the reward model: train, validation and gold accuracies) returns more."""
        return {"eval_accuracy": self.evaluate()}

    def start_row(self) -> dict:
        """Row 0 of the history: the model before training."""
        return {"step": 0, "wall_time": 0.0, **self.evaluation()}

    def latest_distributions(self):
        """What the live histograms show for the step just done (RL), or None."""
        return None

    def early_stop(self, metrics: dict) -> str | None:
        """A stop reason after this step's row, or None to go on."""
        return None


def backward_and_step(loss: torch.Tensor, optimizer: torch.optim.Optimizer, parameters, max_grad_norm: float,
                      step: int, name: str) -> float:
    """loss -> backward -> clip the gradient norm to max_grad_norm -> optimizer step; returns the norm
    before clipping. A NaN/inf loss or gradient raises NonFiniteLossError before the step that would use
    it (`train_step` then restores the weights). `name` ("SFT", "DPO") starts the error message."""
    if not torch.isfinite(loss):
        raise NonFiniteLossError(f"{name} loss became {loss.item()} at step {step}; training stopped and the "
                                 f"weights were kept from step {step - 1}; lower learning_rate")
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    grad_norm = float(torch.nn.utils.clip_grad_norm_(parameters, max_grad_norm))
    if not math.isfinite(grad_norm):
        raise NonFiniteLossError(f"{name} gradient norm became {grad_norm} at step {step}; training stopped and "
                                 f"the weights were kept from step {step - 1}; lower learning_rate")
    optimizer.step()
    return grad_norm


def clone_state(state: dict) -> dict:
    """A copy of a state_dict that later in-place updates cannot touch (tensors cloned)."""
    return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in state.items()}


def optimizer_snapshot(optimizer: torch.optim.Optimizer):
    """The optimiser's per-parameter state (AdamW: step and moments) and learning rates, cloned
    tensor by tensor (cheaper than deep-copying optimizer.state_dict())."""
    return ({param: clone_state(state) for param, state in optimizer.state.items()},
            [group["lr"] for group in optimizer.param_groups])


def restore_optimizer(optimizer: torch.optim.Optimizer, snapshot) -> None:
    moments, rates = snapshot
    optimizer.state.clear()  # parameters without state at the snapshot (the first step) get none
    optimizer.state.update(moments)
    for group, rate in zip(optimizer.param_groups, rates):
        group["lr"] = rate


class SupervisedLoop(TrainingLoop):
    """A `TrainingLoop` over `model`, `optimizer` and a `batch_generator` (SFT, the reward model, DPO):
    the optimiser and bookkeeping they share (`start`), what a step changes (weights, optimiser state,
    the state of every generator in `state_generators()`), the learning-rate schedule of
    `config.learning_rate` (warm-up, then `lr_schedule` over `config.steps`), and a pandas `history`
    whose first columns are `history_columns`.

    A subclass may set `adam_betas` and `lr_schedule` (DPO keeps the RL trainer's (0.9, 0.99) and a
    constant rate), and add generators to `state_generators()` (DPO's online sampling)."""

    adam_betas: tuple[float, float] = (0.9, 0.98)
    lr_schedule: str = "cosine"  # rlhf_lab.train.schedule.SCHEDULES

    def start(self, callbacks=()) -> None:
        """AdamW over `self.model` (config.learning_rate, config.weight_decay, `adam_betas`), the
        batch-order RNG (config.seed) and empty bookkeeping. Call at the end of __init__, once `model` is set."""
        c = self.config
        # No weight decay on gains (RMSNorm weights, 1-D): shrinking them towards 0 is not regularisation.
        decay = [p for p in self.model.parameters() if p.dim() >= 2]
        no_decay = [p for p in self.model.parameters() if p.dim() < 2]
        self.optimizer = torch.optim.AdamW(
            [{"params": decay, "weight_decay": c.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
            lr=c.learning_rate, betas=self.adam_betas)
        self.batch_generator = torch.Generator().manual_seed(c.seed)  # batch order
        self.init_loop(callbacks)

    def state_modules(self) -> dict[str, torch.nn.Module]:
        return {"model": self.model}

    def state_generators(self) -> dict[str, torch.Generator]:
        return {"batch": self.batch_generator}

    def set_learning_rate(self, step: int) -> float:
        """Set (and return) the learning rate of 1-based optimiser step `step`."""
        c = self.config
        total_steps = c.steps if self.lr_schedule == "cosine" else None  # a constant rate needs no end
        lr = learning_rate_at(step, c.learning_rate, c.warmup_steps, total_steps, schedule=self.lr_schedule)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        return lr
