"""The GPU path of transparent mode (transparent/cuda.py) without a GPU: a real process that
maps a file named like the CUDA driver library, a fake driver version file, and a stand-in
``cuda-checkpoint`` that records its calls and fails on demand."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from torchrelay.transparent import cuda


@pytest.fixture
def cuda_like(tmp_path):
    """A live process that has mapped ``.../libcuda.so.1`` (as a CUDA process has)."""
    lib = tmp_path / "libcuda.so.1"
    lib.write_bytes(b"\0" * 4096)
    code = textwrap.dedent(f"""
        import mmap, sys
        f = open({str(lib)!r}, "rb")
        m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
        print("mapped", flush=True)
        sys.stdin.read()
    """)
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout.readline().strip() == "mapped"
    yield proc.pid
    proc.kill()
    proc.wait()


@pytest.fixture
def driver(tmp_path):
    def write(major: int):
        path = tmp_path / "version"
        path.write_text(
            f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {major}.86.15  Wed Jan 1 2025\n"
        )
        return path

    return write


@pytest.fixture
def fake_tool(tmp_path, monkeypatch):
    """A cuda-checkpoint stand-in: appends 'ACTION PID' to calls.txt; fails on $FAIL_ACTION."""
    calls = tmp_path / "calls.txt"
    tool = tmp_path / "cuda-checkpoint"
    tool.write_text(
        "#!/bin/sh\n"
        f'echo "$2 $4" >> {calls}\n'
        'if [ "$2" = "$FAIL_ACTION" ]; then echo "CUDA_ERROR_NOT_SUPPORTED" >&2; exit 1; fi\n'
    )
    tool.chmod(0o755)
    monkeypatch.setenv(cuda.ENV, str(tool))
    return calls


def test_a_process_without_cuda_needs_no_tool(driver):
    assert not cuda.uses_cuda(os.getpid())
    assert cuda.tool_for(os.getpid(), driver(570)) is None
    cuda.refuse_clone(os.getpid())  # nothing to refuse


def test_the_driver_version_is_read_from_the_kernel_module_line(driver, tmp_path):
    assert cuda.driver_major(driver(575)) == 575
    assert cuda.driver_major(tmp_path / "missing") is None


def test_a_cuda_process_needs_driver_570_and_the_utility(cuda_like, driver, fake_tool, monkeypatch):
    assert cuda.uses_cuda(cuda_like)
    with pytest.raises(
        cuda.DeviceStateUnavailable, match=r"driver >= 570 \(found NVIDIA driver 550\)"
    ):
        cuda.tool_for(cuda_like, driver(550))
    assert cuda.tool_for(cuda_like, driver(570)) == os.environ[cuda.ENV]
    monkeypatch.delenv(cuda.ENV)
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(cuda.DeviceStateUnavailable, match="cuda-checkpoint utility on PATH") as e:
        cuda.tool_for(cuda_like, driver(570))
    assert "\n" not in str(e.value)


def test_suspend_and_resume_drive_the_actions_in_order(cuda_like, fake_tool):
    tool = os.environ[cuda.ENV]
    cuda.suspend(tool, cuda_like)
    cuda.resume(tool, 4242)
    assert fake_tool.read_text().split("\n")[:-1] == [
        f"lock {cuda_like}",
        f"checkpoint {cuda_like}",
        "restore 4242",
        "unlock 4242",
    ]


def test_a_failed_checkpoint_unlocks_the_process_and_says_one_line(
    cuda_like, fake_tool, monkeypatch
):
    monkeypatch.setenv("FAIL_ACTION", "checkpoint")
    with pytest.raises(cuda.DeviceStateError) as failed:
        cuda.suspend(os.environ[cuda.ENV], cuda_like)
    assert str(failed.value) == (
        f"cuda-checkpoint --action checkpoint --pid {cuda_like}: CUDA_ERROR_NOT_SUPPORTED"
    )
    assert fake_tool.read_text().split()[-2:] == ["unlock", str(cuda_like)]


def test_a_cuda_donor_is_not_cloned(cuda_like):
    with pytest.raises(cuda.DeviceStateUnavailable, match="restored onto its donor's GPU"):
        cuda.refuse_clone(cuda_like)
