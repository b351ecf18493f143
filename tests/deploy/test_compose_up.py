"""`docker compose up` for real: the images built, the stack up and serving.

Builds docker/Dockerfile and docker/caddy/Dockerfile, brings the stack up
with a generated docker/.env, and checks what a new operator would: the
login page over TLS through Caddy (trusting its internal CA's root), a
chat completion with the key the bootstrap service wrote, and the
platform's series in Prometheus, the web's scraped with the metrics token.

Needs a Docker daemon (``docker info`` answers; tests/deploy/dockerd.sh
starts a private one) and docker-compose: skipped without, as on CI,
whose 30 minutes cannot also build the image (10-20 minutes on 2 cores).
Where no container registry is reachable (only PyPI, Debian's archive and
npm here), the Debian base comes from debootstrap + ``docker import``,
and Debian's PostgreSQL, Redis and Prometheus stand in for the official
images (tests/deploy/images/); the torch CPU wheel comes from pip's
find-links and the host's extra CA certificates are trusted in the build.
"""

from __future__ import annotations

import json
import secrets
import shutil
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
IMAGES = Path(__file__).parent / "images"
BASE = "debian:bookworm-slim"
# The official images compose names, and the Debian stand-ins for them.
STAND_INS = {
    "postgres": ("postgres:15", "postgres.Dockerfile"),
    "redis": ("redis:7.2", "redis.Dockerfile"),
    "prometheus": ("prom/prometheus:v2.53.0", "prometheus.Dockerfile"),
}
TORCH_INDEX = "https://download.pytorch.org/whl/cpu"
CADDY_ROOT = "/data/caddy/pki/authorities/local/root.crt"

# Building the image and warming a worker take far longer than the suite's
# 300 s per test (the fixture's time counts).
pytestmark = [pytest.mark.slow, pytest.mark.timeout(5400)]


def run(
    *cmd: str, timeout: float = 600, check: bool = True, **kwargs
) -> subprocess.CompletedProcess:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kwargs)
    if check and done.returncode != 0:
        raise AssertionError(
            f"{' '.join(cmd)}: {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
        )
    return done


def docker_ready() -> bool:
    if shutil.which("docker") is None:
        return False
    return subprocess.run(["docker", "info"], capture_output=True, timeout=30).returncode == 0


def compose_binary() -> list[str]:
    if subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    pytest.skip("neither `docker compose` nor docker-compose")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def image_present(name: str) -> bool:
    return run("docker", "image", "inspect", name, check=False, timeout=60).returncode == 0


def pulled(name: str) -> bool:
    return (
        image_present(name) or run("docker", "pull", name, check=False, timeout=300).returncode == 0
    )


def ensure_base(tmp: Path) -> None:
    """debian:bookworm-slim from a registry, else from Debian's archive."""
    if pulled(BASE):
        return
    if shutil.which("debootstrap") is None:
        pytest.skip(f"{BASE} cannot be pulled and debootstrap is missing")
    rootfs = tmp / "rootfs"
    run(
        "debootstrap",
        "--variant=minbase",
        "bookworm",
        str(rootfs),
        "http://deb.debian.org/debian",
        timeout=1200,
    )
    tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
    run("docker", "import", "-", BASE, stdin=tar.stdout, timeout=600)
    tar.wait(60)
    shutil.rmtree(rootfs, ignore_errors=True)


def reachable(url: str) -> bool:
    try:
        urllib.request.urlopen(url, timeout=10)
        return True
    except (OSError, urllib.error.URLError):
        return False


def stage_build_inputs() -> tuple[list[Path], dict[str, str]]:
    """docker/wheels and docker/ca-certificates for this machine; (files made, build args)."""
    made: list[Path] = []
    args: dict[str, str] = {}
    if not reachable(f"{TORCH_INDEX}/torch/"):
        lock = (ROOT / "requirements.lock").read_text()
        version = lock.split("\ntorch==", 1)[1].split()[0]
        links = run("pip", "config", "get", "global.find-links", check=False).stdout.split()
        wheels = [w for d in links for w in Path(d).glob(f"torch-{version}-cp311-*.whl")]
        if not wheels:
            pytest.skip(
                f"{TORCH_INDEX} unreachable and no torch {version} wheel in pip's find-links"
            )
        target = DOCKER / "wheels" / wheels[0].name
        if not target.exists():
            shutil.copy(wheels[0], target)
            made.append(target)
        args["TORCH_INDEX_URL"] = ""
    for cert in Path("/usr/local/share/ca-certificates").glob("*.crt"):
        target = DOCKER / "ca-certificates" / cert.name
        if not target.exists():
            shutil.copy(cert, target)
            made.append(target)
    return made, args


def build(tag: str, dockerfile: Path, context: Path, args: dict[str, str]) -> None:
    cmd = ["docker", "build", "--network", "host", "-t", tag, "-f", str(dockerfile)]
    for name, value in args.items():
        cmd += ["--build-arg", f"{name}={value}"]
    run(*cmd, str(context), timeout=3600)


def fetch(url: str, *, context: ssl.SSLContext | None = None, data: dict | None = None,
          headers: dict[str, str] | None = None) -> tuple[int, str, dict[str, str]]:  # fmt: skip
    body = None if data is None else json.dumps(data).encode()
    request = urllib.request.Request(
        url, data=body, headers={"Content-Type": "application/json", **(headers or {})}
    )
    opener = urllib.request.build_opener(
        urllib.request.HTTPSHandler(context=context), _NoRedirect()
    )
    try:
        with opener.open(request, timeout=120) as response:
            return response.status, response.read().decode(), dict(response.headers)
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode(errors="replace"), dict(error.headers)
    except (urllib.error.URLError, OSError) as error:
        # Not answering yet (Caddy still issuing its certificate, a service
        # starting): the callers wait and ask again.
        return 0, str(error), {}


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None


class Stack:
    def __init__(self, tmp: Path, overrides: dict[str, str]):
        self.project = f"llmp-{uuid.uuid4().hex[:8]}"
        self.https, self.http, self.prometheus = free_port(), free_port(), free_port()
        platform_env = tmp / "platform.env"
        # Small enough for a shared 2-core machine.
        platform_env.write_text("ENGINE_KV_CACHE_MB=64\nLOG_LEVEL=INFO\n")
        values = {
            "DJANGO_SECRET_KEY": secrets.token_urlsafe(50),
            "DJANGO_ALLOWED_HOSTS": "localhost",
            "DJANGO_CSRF_TRUSTED_ORIGINS": f"https://localhost:{self.https}",
            "DJANGO_ADMIN_URL": "ops-admin/",
            "POSTGRES_PASSWORD": secrets.token_hex(16),
            "REDIS_WEB_PASSWORD": secrets.token_hex(16),
            "REDIS_WORKER_PASSWORD": secrets.token_hex(16),
            "GRAFANA_ADMIN_PASSWORD": secrets.token_hex(16),
            "METRICS_TOKEN": secrets.token_hex(16),
            "FLEET_SIGNAL_TOKEN": secrets.token_hex(16),
            "EMAIL_HOST": "localhost",
            "BOOTSTRAP_TENANT": "Acme",
            "BOOTSTRAP_ADMIN_USER": "ops",
            "BOOTSTRAP_ADMIN_EMAIL": "ops@acme.test",
            "BOOTSTRAP_ADMIN_PASSWORD": secrets.token_urlsafe(16),
            "PUBLISH_ADDRESS": "127.0.0.1",
            "HTTPS_PORT": str(self.https),
            "HTTP_PORT": str(self.http),
            "PROMETHEUS_PORT": str(self.prometheus),
            "PLATFORM_ENV_FILE": str(platform_env),
        }
        self.values = values
        self.env_file = tmp / "env"
        self.env_file.write_text("".join(f"{k}={v}\n" for k, v in values.items()))
        override = {"services": {n: {"image": i} for n, i in overrides.items()}}
        self.files = ["-f", str(DOCKER / "compose.yaml")]
        if overrides:
            (tmp / "override.yaml").write_text(yaml.safe_dump(override))
            self.files += ["-f", str(tmp / "override.yaml")]
        self.compose = [
            *compose_binary(),
            "-p",
            self.project,
            "--env-file",
            str(self.env_file),
            *self.files,
        ]

    def __call__(
        self, *args: str, timeout: float = 900, check: bool = True
    ) -> subprocess.CompletedProcess:
        return run(*self.compose, *args, timeout=timeout, check=check, cwd=DOCKER)

    def logs(self) -> str:
        return self("logs", "--no-color", "--tail", "60", check=False).stdout[-12000:]


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    if not docker_ready():
        pytest.skip("no Docker daemon answers `docker info` (tests/deploy/dockerd.sh starts one)")
    tmp = tmp_path_factory.mktemp("compose-up")
    ensure_base(tmp)
    made, args = stage_build_inputs()
    overrides = {}
    try:
        for service, (official, dockerfile) in STAND_INS.items():
            if not pulled(official):
                tag = f"llmp-test/{service}:debian"
                build(tag, IMAGES / dockerfile, IMAGES, {})
                overrides[service] = tag
        build("llm-platform-caddy:latest", DOCKER / "caddy" / "Dockerfile", ROOT, {})
        build("llm-platform:latest", DOCKER / "Dockerfile", ROOT, args)
    finally:
        for path in made:
            path.unlink(missing_ok=True)
    up = Stack(tmp, overrides)
    try:
        up("up", "-d", "--no-build", "caddy", "prometheus", "gpuworker", "celery", "beat", "bootstrap",
           timeout=1800)  # fmt: skip
        yield up
    except BaseException:
        print(up.logs())
        raise
    finally:
        up("down", "-v", "--remove-orphans", "--timeout", "60", check=False, timeout=600)


def wait_for(what: str, probe, stack: Stack, timeout: float = 600.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = probe()
        if result:
            return result
        time.sleep(3)
    pytest.fail(f"{what} never happened:\n{stack.logs()}")


def test_the_stack_serves_over_tls_and_reports_to_prometheus(stack: Stack, tmp_path):
    # Caddy's internal CA, as docs/deployment.md has operators fetch it.
    root = stack("exec", "-T", "caddy", "cat", CADDY_ROOT).stdout
    assert "BEGIN CERTIFICATE" in root
    context = ssl.create_default_context(cadata=root)
    base = f"https://localhost:{stack.https}"

    status, body, _ = wait_for(
        "the login page over TLS",
        lambda: (r := fetch(f"{base}/accounts/login/", context=context))[0] == 200 and r,
        stack,
    )
    assert 'name="password"' in body and 'name="csrfmiddlewaretoken"' in body
    # Plain HTTP goes to HTTPS; HSTS on the TLS answers.
    status, _, headers = fetch(f"http://localhost:{stack.http}/accounts/login/")
    assert status in (301, 308) and headers["Location"].startswith("https://")
    assert "max-age" in fetch(f"{base}/accounts/login/", context=context)[2].get(
        "Strict-Transport-Security", ""
    )

    key = stack(
        "run", "--rm", "--no-deps", "-T", "bootstrap", "cat", "/bootstrap/api-key"
    ).stdout.strip()
    assert key.count(".") == 1, key
    wait_for("a ready gpuworker", lambda: fetch(f"{base}/readyz", context=context)[0] == 200, stack)
    status, body, _ = fetch(
        f"{base}/v1/chat/completions",
        context=context,
        data={
            "model": "smollm2-135m-instruct",
            "messages": [{"role": "user", "content": "Name a colour."}],
            "max_tokens": 8,
            "temperature": 0,
        },
        headers={"Authorization": f"Bearer {key}"},
    )
    assert status == 200, body
    completion = json.loads(body)
    assert completion["choices"][0]["message"]["content"]
    assert completion["usage"]["completion_tokens"] > 0

    prometheus = f"http://127.0.0.1:{stack.prometheus}/api/v1/query?query="

    def query(expr: str) -> list[dict]:
        status, text, _ = fetch(prometheus + urllib.parse.quote(expr))
        return json.loads(text)["data"]["result"] if status == 200 else []

    tokens = completion["usage"]["completion_tokens"]
    # Every token of the completion counted, in a scrape after it ended.
    wait_for(
        "the worker's tokens in Prometheus",
        lambda: (
            (r := query("sum(vllm:generation_tokens_total)")) and float(r[0]["value"][1]) >= tokens
        ),
        stack,
        timeout=120,
    )
    # The web, scraped with the metrics token, reports the request by tier.
    web_ttft = wait_for(
        "the web's TTFT by tier in Prometheus",
        lambda: query("sum by (tier) (llmp_time_to_first_token_seconds_count)"),
        stack,
        timeout=120,
    )
    assert {r["metric"]["tier"] for r in web_ttft} == {"pro"}
    wait_for(
        "every web, gpuworker and Celery target up",
        lambda: (
            {r["metric"]["job"] for r in query('up{job=~"web|gpuworker|celery"} == 1')}
            == {"web", "gpuworker", "celery"}
        ),
        stack,
        timeout=120,
    )
    rules = json.loads(fetch(f"http://127.0.0.1:{stack.prometheus}/api/v1/rules")[1])
    names = {r["name"] for g in rules["data"]["groups"] for r in g["rules"]}
    assert {"TierTTFTOverSLO", "GpuworkerDown", "UsageDeadLetters"} <= names
