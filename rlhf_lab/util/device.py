"""Pick a device and, on CUDA, a bf16 autocast context.

CPU is the default and what CI tests. On a GPU the matrix multiplies run in bf16 under autocast
while the numerically sensitive parts stay in float32 regardless: RMSNorm statistics, RoPE angles
and cos/sin, logits, and every log-softmax used for log-probabilities.
"""

from __future__ import annotations

import contextlib
import os
import platform
import subprocess

import torch

DEVICE_CHOICES = ("auto", "cpu", "cuda", "mps")


def check_device(name: str, value) -> None:
    """Raise ValueError naming `name` unless `value` names a device kind: one of DEVICE_CHOICES, or
    'cuda:N'. (Whether that device is present is `pick_device`'s question, asked where it is used.)"""
    kind, _, index = value.lower().partition(":") if isinstance(value, str) else ("", "", "")
    if kind not in DEVICE_CHOICES or (index and not (kind == "cuda" and index.isdigit())):
        raise ValueError(f"{name} must be one of {DEVICE_CHOICES} (optionally 'cuda:N'), got {value!r}")


def pick_device(preference: str | torch.device | None = None) -> torch.device:
    """'auto' (default, or env RLHF_LAB_DEVICE) -> cuda if available, else mps, else cpu."""
    if isinstance(preference, torch.device):
        return preference
    choice = (preference or os.environ.get("RLHF_LAB_DEVICE") or "auto").lower()
    check_device("device", choice)
    kind = choice.split(":")[0]
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


def cpu_name(cpuinfo: str = "/proc/cpuinfo") -> str:
    """The processor's model name, its architecture and the vector instructions torch's CPU kernels
    use on it, e.g. "AMD EPYC 7B13, x86_64, AVX2". A benchmark's times, and even the ratio between
    two codes, move with the machine (bench/RESULTS.md, "RL step time"), so every benchmark table
    names it.

    The name comes from `cpuinfo`'s "model name" line (Linux), else `sysctl` (macOS); many ARM Linux
    kernels do not name the chip, and then the architecture stands alone ("aarch64, DEFAULT")."""
    name = ""
    try:
        with open(cpuinfo) as f:
            name = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        pass
    if not name and platform.system() == "Darwin":
        try:
            name = subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True,
                                  timeout=5).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            pass
    capability = getattr(torch.backends.cpu, "get_cpu_capability", lambda: "")()  # "AVX2", "AVX512", "NO AVX"...
    return ", ".join(part for part in (name, platform.machine(), capability) if part) or "unknown CPU"


def describe(device: torch.device | str | None = None) -> str:
    """One line for notebooks and benchmark tables: device (on the CPU its name, `cpu_name`), torch
    version, threads."""
    device = pick_device(device)
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        what = f"cuda ({name}, bf16 {'yes' if torch.cuda.is_bf16_supported() else 'no'})"
    elif device.type == "mps":
        what = "mps (Apple GPU)"
    else:
        threads = torch.get_num_threads()
        what = f"cpu ({cpu_name()}, {threads} thread{'s' if threads != 1 else ''})"
    return f"{what}; torch {torch.__version__}"
