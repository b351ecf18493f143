"""How long a web process takes to import its ASGI application, and its memory.

    python -m bench.web_start --baseline DIR [--runs 5]

Each run is a fresh interpreter that imports ``config.asgi`` as Daphne
does in the multi-process topology (Redis configured, no embedded engine,
no tokenizer warm-up thread, no in-process settler) and reports the wall
time of the import and its resident memory (``VmRSS`` of
``/proc/self/status``) right after; whether torch was loaded is printed
too. This checkout and ``--baseline`` (another checkout of the project,
e.g. ``git worktree add --detach /tmp/base main``) run alternately, so a
busy machine slows both alike; the medians go side by side. The time is
CPU-bound and noisy on a shared machine; the memory is not. Nothing is
asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROBE = """
import json, sys, time
started = time.perf_counter()
import config.asgi  # noqa: F401
seconds = time.perf_counter() - started
rss_kib = next(
    int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmRSS:")
)
print(json.dumps({"seconds": seconds, "rss_mib": rss_kib / 1024, "torch": "torch" in sys.modules}))
"""


def probe(root: Path, redis_url: str) -> dict:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "DJANGO_ENV": "local",
        "DJANGO_SECRET_KEY": "bench-web-start",
        "REDIS_URL": redis_url,
        "EMBEDDED_ENGINE": "0",
        "WEB_WARM_TOKENIZERS": "0",
        "USAGE_SETTLER_IN_PROCESS": "0",
        "PYTHONPATH": str(root),
    }
    done = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=root, env=env, capture_output=True, text=True
    )
    if done.returncode != 0:
        raise SystemExit(f"{root}: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.web_start")
    parser.add_argument("--baseline", type=Path, required=True, help="another checkout")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument(
        "--redis-url", default=os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379/0"
    )
    args = parser.parse_args(argv)
    results: dict[str, list[dict]] = {"baseline": [], "this": []}
    for _ in range(args.runs):
        results["baseline"].append(probe(args.baseline.resolve(), args.redis_url))
        results["this"].append(probe(ROOT, args.redis_url))
    print(f"{'':10} {'import s (median)':>18} {'RSS MiB (median)':>17} {'torch':>6}")
    for name, runs in results.items():
        seconds = statistics.median(r["seconds"] for r in runs)
        rss = statistics.median(r["rss_mib"] for r in runs)
        torch = "yes" if any(r["torch"] for r in runs) else "no"
        print(f"{name:10} {seconds:18.2f} {rss:17.1f} {torch:>6}")
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
