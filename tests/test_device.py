"""The device helpers: the choice of device, and the line that names the machine in notebooks and
in every benchmark table (a ratio between two codes moves with the CPU, so the table must say which)."""

import platform

import pytest
import torch

from rlhf_lab.util.device import cpu_name, describe, pick_device


def test_pick_device_refuses_an_unknown_name_and_lists_the_choices():
    with pytest.raises(ValueError, match=r"device must be one of .*'cpu'.*got 'tpu'"):
        pick_device("tpu")
    assert pick_device("cpu") == torch.device("cpu")


def test_cpu_name_reads_the_model_name_line(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: Test CPU 9000 @ 2.4GHz\n"
                       "flags\t\t: fpu sse avx2\n\nprocessor\t: 1\nmodel name\t: Test CPU 9000 @ 2.4GHz\n")
    capability = torch.backends.cpu.get_cpu_capability()  # the vector ISA torch's kernels use here
    assert cpu_name(str(cpuinfo)) == f"Test CPU 9000 @ 2.4GHz, {platform.machine()}, {capability}"


def test_cpu_name_without_a_model_name_falls_back_to_the_architecture(tmp_path, monkeypatch):
    monkeypatch.setattr(platform, "system", lambda: "Linux")  # on macOS, too: no sysctl name to find
    cpuinfo = tmp_path / "cpuinfo"  # what many ARM Linux kernels write: no "model name" line
    cpuinfo.write_text("processor\t: 0\nCPU implementer\t: 0x41\nCPU part\t: 0xd0c\n")
    expected = f"{platform.machine()}, {torch.backends.cpu.get_cpu_capability()}"  # no name to give
    assert cpu_name(str(cpuinfo)) == expected
    assert cpu_name(str(tmp_path / "missing")) == expected  # no such file: the same


def test_describe_names_the_cpu_and_counts_threads_in_words():
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = describe("cpu")
        torch.set_num_threads(2)
        two = describe("cpu")
    finally:
        torch.set_num_threads(threads)
    assert one == f"cpu ({cpu_name()}, 1 thread); torch {torch.__version__}"
    assert two == f"cpu ({cpu_name()}, 2 threads); torch {torch.__version__}"
