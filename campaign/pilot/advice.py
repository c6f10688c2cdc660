"""What to do when a pilot phase fails (docs/report.md, pilot phases): one line per phase,
after its verdict."""

from __future__ import annotations

ADVICE = {
    "data": "fix the data or the task's collate (see the failed checks)",
    "forward": "check the model's output shapes and the loss; a non-finite loss at step 0 "
    "means broken inputs or initialisation",
    "backward": "a parameter without gradient is detached, unused or frozen by mistake; "
    "non-finite gradients need a smaller learning rate, clipping or fp32",
    "update_first": "the optimizer must change the parameters: check the learning rate, "
    "the parameter groups and requires_grad",
    "update": "later updates must keep changing the parameters with finite values",
    "validation": "validation must run in eval mode under torch.no_grad() and cover every "
    "validation example; do not switch modes inside predict()",
    "checkpoint": "the checkpoint must hold model, optimizer, scheduler, scaler and RNG state",
    "resume": "a fresh process must restore step, LR, RNG and data position and compute the "
    "same next loss: save every piece of state the update depends on",
    "export": "the final artifact must reproduce the control outputs: keep all model state in "
    "parameters or registered buffers, and make predict() deterministic",
    "replicas": "every rank must build the same model from the run's seed and take its share "
    "of each update: no rank- or process-dependent code in the task",
    "overfit": "a handful of examples must be learnable: check labels, loss and masks "
    "(inspect), and the learning rate",
}


class PhaseFailure(Exception):
    """A gate's verdict: the phase ran, and what it checked does not hold. ``advice`` replaces
    the phase's own where the failure says something else (a metric name, not the mode)."""

    def __init__(self, message: str, advice: str | None = None) -> None:
        super().__init__(message)
        self.advice = advice
