"""A web process is light: importing its ASGI application loads no torch.

The web tier tokenizes prompts (``tokenization``) and never loads model
weights; only an embedded engine, started on demand, brings torch in. The
import-linter contract "web-no-torch" checks the code; this checks what a
real process imports (parent packages' ``__init__`` modules included).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHOW = """
import sys
import config.asgi
heavy = ("torch", "transformers.models.auto.modeling_auto", "gpuworkers.engine")
print(sorted(m for m in heavy if m in sys.modules))
"""


def test_importing_the_asgi_application_loads_no_torch():
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "DJANGO_ENV": "local",
        "DJANGO_SECRET_KEY": "test",
        # The multi-process topology's web: no engine in this process.
        "REDIS_URL": os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379/0",
        "EMBEDDED_ENGINE": "0",
        "WEB_WARM_TOKENIZERS": "0",
        "USAGE_SETTLER_IN_PROCESS": "0",
    }
    done = subprocess.run(
        [sys.executable, "-c", SHOW], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"
