"""A throwaway Prometheus for tests, and PromQL's histogram_quantile to check it with.

Debian's ``prometheus`` package (.ci/run installs it when missing) runs
from a temporary directory: its own config and TSDB, a free loopback port,
a 1 s scrape interval.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from bisect import bisect_left
from pathlib import Path

BINARY = shutil.which("prometheus")


class Prometheus:
    """``prometheus`` scraping ``jobs`` ({job: [host:port, ...]}) every second."""

    def __init__(
        self, tmp: Path, port: int, jobs: dict[str, list[str]], rule_files: list[Path] = ()
    ):
        config = tmp / "prometheus.yml"
        scrape = [
            {"job_name": job, "static_configs": [{"targets": targets}]}
            for job, targets in jobs.items()
        ]
        # JSON is YAML: no YAML library needed.
        document = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"}}
        rules = {"rule_files": [str(path) for path in rule_files]} if rule_files else {}
        config.write_text(json.dumps({**document, **rules, "scrape_configs": scrape}))
        self.url = f"http://127.0.0.1:{port}"
        self.log = tmp / "prometheus.log"
        self.process = subprocess.Popen(
            [
                BINARY,
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=self.log.open("w"),
            stderr=subprocess.STDOUT,
        )

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(20)
        except subprocess.TimeoutExpired:
            self.process.kill()

    def query(self, expr: str, at: float | None = None) -> list[dict]:
        """An instant query's result vector; raises on a PromQL error."""
        params = {"query": expr, **({"time": f"{at:.3f}"} if at is not None else {})}
        url = f"{self.url}/api/v1/query?{urllib.parse.urlencode(params)}"
        with urllib.request.urlopen(url, timeout=10) as response:
            body = json.loads(response.read())
        assert body["status"] == "success", body
        return body["data"]["result"]

    def wait_until(self, expr: str, predicate, timeout: float = 60.0) -> tuple[list[dict], float]:
        """Poll ``expr`` until ``predicate(result)``; returns it and when it held."""
        deadline = time.monotonic() + timeout
        result: list[dict] = []
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"prometheus exited:\n{self.log.read_text()[-3000:]}")
            try:
                at = time.time()
                result = self.query(expr, at)
                if predicate(result):
                    return result, at
            except OSError:
                pass  # not listening yet
            time.sleep(0.5)
        raise AssertionError(
            f"{expr}: still {result} after {timeout}s\n{self.log.read_text()[-2000:]}"
        )


def histogram_quantile(q: float, bounds: list[float], values: list[float]) -> float:
    """PromQL's histogram_quantile over the buckets ``values`` fall into.

    Same interpolation as Prometheus: linear within the bucket holding the
    rank, from 0 for the first bucket, the last finite bound for +Inf.
    """
    counts = [0] * (len(bounds) + 1)
    for value in values:
        counts[bisect_left(bounds, value)] += 1  # le: value <= bound
    cumulative, total = [], 0
    for count in counts:
        total += count
        cumulative.append(total)
    rank = q * total
    index = next(i for i, c in enumerate(cumulative) if c >= rank)
    if index == len(bounds):
        return bounds[-1]
    start = 0.0 if index == 0 else bounds[index - 1]
    below = 0 if index == 0 else cumulative[index - 1]
    in_bucket = cumulative[index] - below
    return start + (bounds[index] - start) * (rank - below) / in_bucket


def quantile_bounds(q: float, bounds: list[float], values: list[float], slack: float):
    """The quantile's range when each value is only known to +-``slack``.

    histogram_quantile only grows with each value, so the range is spanned
    by all values low and all values high.
    """
    low = histogram_quantile(q, bounds, [v - slack for v in values])
    high = histogram_quantile(q, bounds, [v + slack for v in values])
    return low, high


def finite(result: list[dict]) -> dict[str, float]:
    """Instance -> value of a vector, NaNs dropped."""
    out = {}
    for sample in result:
        value = float(sample["value"][1])
        if not math.isnan(value):
            out[sample["metric"].get("instance", "")] = value
    return out
