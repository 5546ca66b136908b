"""Pick a device and, on CUDA, a bf16 autocast context.

CPU is the default and what CI tests. On a GPU the matrix multiplies run in bf16 under autocast
while the numerically sensitive parts stay in float32 regardless: RMSNorm statistics, RoPE angles
and cos/sin, logits, and every log-softmax used for log-probabilities.
"""

from __future__ import annotations

import contextlib
import os
import platform

import torch

DEVICE_CHOICES = ("auto", "cpu", "cuda", "mps")


def pick_device(preference: str | torch.device | None = None) -> torch.device:
    """'auto' (default, or env RLHF_LAB_DEVICE) -> cuda if available, else mps, else cpu."""
    if isinstance(preference, torch.device):
        return preference
    choice = (preference or os.environ.get("RLHF_LAB_DEVICE") or "auto").lower()
    kind = choice.split(":")[0]
    if kind not in DEVICE_CHOICES:
        raise ValueError(f"device must be one of {DEVICE_CHOICES} (optionally 'cuda:N'), got {preference!r}")
    if kind == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    if kind == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' was requested but torch.cuda.is_available() is False")
    if kind == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise ValueError("device 'mps' was requested but MPS is not available")
    return torch.device(choice)


def autocast(device: torch.device | str, enabled: bool | None = None):
    """bf16 autocast on CUDA (when the GPU supports it), a no-op elsewhere."""
    device = torch.device(device)
    if enabled is None:
        enabled = device.type == "cuda" and torch.cuda.is_bf16_supported()
    if not enabled:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16)


def describe(device: torch.device | str | None = None) -> str:
    """One line for notebooks and benchmark tables: device, torch version, threads."""
    device = pick_device(device)
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        what = f"cuda ({name}, bf16 {'yes' if torch.cuda.is_bf16_supported() else 'no'})"
    elif device.type == "mps":
        what = "mps (Apple GPU)"
    else:
        what = f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"
    return f"{what}; torch {torch.__version__}"
