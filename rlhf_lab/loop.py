"""`TrainingLoop`: what the SFT trainer and the RL trainer share, so each holds only its own step.

    train(steps=None, time_budget=None)
        row 0 = the model before training (held-out accuracy), once
        while steps remain and the time budget lasts:
            train_step()                 atomic: a failed step leaves no trace (the subclass's job)
            evaluate() every config.eval_every steps, and after the last one
            callbacks' on_step_end
            early_stop(row)              e.g. SFT's stop_at_accuracy
        Stop in Jupyter (KeyboardInterrupt) or a non-finite loss ends the call cleanly; `stop_reason`
        says why, and train() again continues from the same step.

A subclass provides `config` (steps, time_budget, eval_every), `rows`, `step`, `train_time`,
`callbacks`, `history`, `evaluate()`, and for `train_step()`: `_step()` (one step, returning its
row), `_snapshot()` and `_restore(snapshot)` (what a failed step must not change). For
`save_state(folder)` / `resume(folder)` (rlhf_lab.run_state) and the check that no weight became
NaN: `state_modules()`, `state_generators()`, `extra_state()` / `load_extra_state()`.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch

from .callbacks import NonFiniteLossError, call_hooks
from .validation import check_number


class TrainingLoop:
    stop_reason: str | None = None
    # the last words of the interrupt message: how to continue (the CLI names `--resume OUT`)
    resume_hint: str = "Call train() again to continue."

    def train(self, steps: int | None = None, time_budget: float | None = None):
        """Run `steps` more steps (default config.steps) or until `time_budget` more seconds of
        training (default config.time_budget; evaluation excluded), whichever comes first.

        Returns the history. Stops early, cleanly, on KeyboardInterrupt or a non-finite loss
        (`self.stop_reason` says which); the model is then as it was after the last good step.
        """
        c = self.config
        steps = c.steps if steps is None else steps
        time_budget = c.time_budget if time_budget is None else time_budget
        check_number("steps", steps, low=0, integer=True)
        if time_budget is not None:
            check_number("time_budget", time_budget, low=0, low_open=True)
        budget_end = None if time_budget is None else self.train_time + time_budget
        last_step = self.step + steps
        self.stop_reason = None
        self.before_train()
        call_hooks(self.callbacks, "on_train_begin", self)
        try:
            if not self.rows:  # step 0: where we start from
                self.rows.append(self.start_row())
            elif self.evaluation_interrupted():  # a stop came during the last step's evaluation: finish it
                self.rows[-1]["eval_accuracy"] = self.evaluate()
                self.stop_reason = self.early_stop(self.rows[-1])
            while not self.stop_reason and self.step < last_step and (budget_end is None or self.train_time < budget_end):
                metrics = self.train_step()
                out_of_time = budget_end is not None and self.train_time >= budget_end
                if c.eval_every and (self.step % c.eval_every == 0 or self.step == last_step or out_of_time):
                    metrics["eval_accuracy"] = self.evaluate()
                call_hooks(self.callbacks, "on_step_end", self, metrics, self.latest_distributions())
                self.stop_reason = self.early_stop(metrics)
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
        return self.history

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
        weights from before the step."""
        for name, module in self.state_modules().items():
            for param_name, param in module.named_parameters():
                if not bool(torch.isfinite(param).all()):
                    raise NonFiniteLossError(f"non-finite weights in {name}.{param_name} after step {self.step}; "
                                             f"training stopped and the weights were kept from the step before")

    def _commit(self, result) -> dict:
        """Keep what a successful step produced (its row; the RL trainer also its distributions)."""
        self.rows.append(result)
        return result

    def add_callback(self, callback) -> None:
        self.callbacks.append(callback)

    # resumable state: what `rlhf_lab.run_state` saves and loads

    def state_modules(self) -> dict[str, torch.nn.Module]:
        """The trained modules by name, e.g. {"policy": ..., "critic": ...}: their weights are saved
        and checked for NaN after every step. A subclass that returns none cannot be saved."""
        return {}

    def state_generators(self) -> dict[str, torch.Generator]:
        """Every torch.Generator a step draws from, by name (their states are saved)."""
        return {}

    def extra_state(self) -> dict:
        """Anything else a step reads (tensors, numbers, strings, lists and dicts of them)."""
        return {}

    def load_extra_state(self, state: dict) -> None:
        """Restore what `extra_state` returned."""

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

    def start_row(self) -> dict:
        """Row 0 of the history: the model before training."""
        return {"step": 0, "wall_time": 0.0, "eval_accuracy": self.evaluate()}

    def latest_distributions(self):
        """What the live histograms show for the step just done (RL), or None."""
        return None

    def early_stop(self, metrics: dict) -> str | None:
        """A stop reason after this step's row, or None to go on."""
        return None


def clone_state(state: dict) -> dict:
    """A copy of a state_dict that later in-place updates cannot touch (tensors cloned)."""
    return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in state.items()}


def optimizer_snapshot(optimizer: torch.optim.Optimizer):
    """The optimiser's per-parameter state (AdamW: step and moments) and learning rates. Cloning the
    state per parameter is ~10x cheaper than deep-copying optimizer.state_dict() (that copy cost ~7%
    of a lab SFT step on a CPU)."""
    return ({param: clone_state(state) for param, state in optimizer.state.items()},
            [group["lr"] for group in optimizer.param_groups])


def restore_optimizer(optimizer: torch.optim.Optimizer, snapshot) -> None:
    moments, rates = snapshot
    optimizer.state.clear()  # parameters without state at the snapshot (the first step) get none
    optimizer.state.update(moments)
    for group, rate in zip(optimizer.param_groups, rates):
        group["lr"] = rate
