"""The wire contract is Django-free and torch-free at run time, not only on paper."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_importing_every_wire_module_loads_neither_django_nor_torch():
    code = (
        "import sys, wire, wire.bus, wire.bus.redis_bus, wire.bus.memory_bus, "
        "wire.events, wire.logs, wire.requests, wire.snapshot, wire.tracing, wire.usage, "
        "wire.workers\n"
        "bad = sorted(m for m in ('django', 'torch', 'gpuworkers') if m in sys.modules)\n"
        "print(','.join(bad))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == ""
