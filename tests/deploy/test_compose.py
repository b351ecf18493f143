"""The container topology: docker/compose.yaml, the Dockerfiles, .dockerignore.

`docker compose config` (or Debian's docker-compose 1.29, which validates
against the Compose Specification's JSON schema; .ci/run installs it)
renders and validates the file offline, no daemon needed. The rendered web
environment then passes `manage.py check --deploy`. The stack itself is
built and run by tests/deploy/test_compose_up.py (slow, needs dockerd).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
APP_SERVICES = {"migrate", "models", "bootstrap", "web", "gpuworker", "celery", "beat"}
SITE_VALUES = {
    "BOOTSTRAP_ADMIN_EMAIL": "ops@example.test",
    "DJANGO_ALLOWED_HOSTS": "llm.example.test",
    "DJANGO_CSRF_TRUSTED_ORIGINS": "https://llm.example.test",
    "DJANGO_ADMIN_URL": "ops-7f3a/",
    "EMAIL_HOST": "smtp.example.test",
    "EMAIL_HOST_USER": "mailer",
    "DEFAULT_FROM_EMAIL": "noreply@example.test",
}


def compose_command() -> list[str]:
    docker = shutil.which("docker")
    if (
        docker
        and subprocess.run([docker, "compose", "version"], capture_output=True).returncode == 0
    ):
        return [docker, "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    pytest.skip("neither `docker compose` nor docker-compose: apt-get install docker-compose")


def template() -> dict[str, str]:
    pairs = re.findall(r"^([A-Z_]+)=(.*)$", (DOCKER / ".env.example").read_text(), re.M)
    return dict(pairs)


def filled_env(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    values = {k: v or SITE_VALUES.get(k) or secrets.token_hex(32) for k, v in template().items()}
    path = tmp_path / "env"
    path.write_text("".join(f"{k}={v}\n" for k, v in values.items()))
    return path, values


def render(env_file: Path) -> subprocess.CompletedProcess:
    cmd = [*compose_command(), "--env-file", str(env_file), "-f", str(DOCKER / "compose.yaml")]
    # Only the env file may supply values: none from this process's environment.
    clean = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/tmp")}
    if "DOCKER_HOST" in os.environ:
        clean["DOCKER_HOST"] = os.environ["DOCKER_HOST"]
    return subprocess.run([*cmd, "config"], capture_output=True, text=True, env=clean, timeout=60)


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> tuple[dict, dict[str, str]]:
    env_file, values = filled_env(tmp_path_factory.mktemp("compose"))
    done = render(env_file)
    assert done.returncode == 0, done.stderr
    return yaml.safe_load(done.stdout), values


def test_the_env_template_holds_no_values_and_compose_refuses_it(tmp_path):
    secrets_in_template = [
        k for k, v in template().items() if k not in ("EMAIL_PORT", "EMAIL_USE_TLS")
    ]
    assert all(template()[k] == "" for k in secrets_in_template)
    empty = tmp_path / "env"
    empty.write_text((DOCKER / ".env.example").read_text())
    done = render(empty)
    assert done.returncode != 0 and "docker/.env" in done.stdout + done.stderr


def test_compose_runs_the_whole_topology_without_a_demo_superuser(rendered):
    config, _ = rendered
    services = config["services"]
    assert set(services) == APP_SERVICES | {"postgres", "redis", "caddy", "prometheus", "grafana"}
    text = yaml.safe_dump(config)
    assert "seed_demo" not in text and "change-me" not in text
    commands = {name: " ".join(map(str, services[name].get("command", []))) for name in services}
    assert commands["web"].startswith("daphne ")
    assert "gpuworker" in commands["gpuworker"]
    assert "celery" in commands["celery"] and " worker " in commands["celery"]
    assert "celery" in commands["beat"] and " beat " in commands["beat"]
    assert commands["migrate"] == "python manage.py migrate --noinput"
    assert commands["bootstrap"] == "python manage.py bootstrap"
    assert commands["models"] == "python -m gpuworkers.engine.convert_gguf"
    for name in APP_SERVICES:
        assert services[name]["build"]["dockerfile"].endswith("docker/Dockerfile"), name
    # Caddy alone faces the network (TLS); the web has no host port, so it
    # scales; everything else published stays on loopback.
    assert "ports" not in services["web"]
    for name, service in services.items():
        for port in service.get("ports", []):
            published = port if isinstance(port, str) else port.get("host_ip", "")
            assert name == "caddy" or str(published).startswith("127.0.0.1"), (name, port)
    targets = {str(p["target"]) if isinstance(p, dict) else p.rsplit(":", 1)[-1].split("/")[0]
               for p in services["caddy"]["ports"]}  # fmt: skip
    assert targets == {"443", "80"}


def test_one_shot_services_order_the_start_and_volumes_carry_the_state(rendered):
    services = rendered[0]["services"]
    for name in ("migrate", "models", "bootstrap"):
        assert services[name]["restart"] == "no", name
    # The workers and the web wait for the converted model; the bootstrap
    # for the migrations.
    for name in ("web", "gpuworker"):
        assert services[name]["depends_on"]["models"]["condition"] == (
            "service_completed_successfully"
        )
    assert services["bootstrap"]["depends_on"]["migrate"]["condition"] == (
        "service_completed_successfully"
    )
    mounts = {
        name: {str(v.get("target", v)) if isinstance(v, dict) else v for v in s.get("volumes", [])}
        for name, s in services.items()
    }

    def targets(name: str) -> set[str]:
        return {m.split(":")[1] if isinstance(m, str) and ":" in m else m for m in mounts[name]}

    assert "/models" in targets("models") and "/models" in targets("gpuworker")
    assert "/models" in targets("web")
    assert "/var/cache/gpuworkers/kernels" in targets("gpuworker")
    env = services["bootstrap"]["environment"]
    assert env["BOOTSTRAP_API_KEY_FILE"].startswith("/bootstrap/")
    assert "/bootstrap" in targets("bootstrap")


def _seconds(value: str) -> float:
    match = re.fullmatch(r"(?:(\d+)m)?(?:(\d+(?:\.\d+)?)s)?", str(value))
    assert match and any(match.groups()), value
    return int(match.group(1) or 0) * 60 + float(match.group(2) or 0)


# The setting that bounds each service's shutdown after SIGTERM, with the
# seconds it needs after it (ending what is left, publishing, exiting).
DRAINS = {
    "web": ("WEB_DRAIN_SECONDS", 5),
    "gpuworker": ("WORKER_DRAIN_SECONDS", 5),
    "celery": ("CELERY_TASK_TIME_LIMIT", 5),
}
# Services whose stop needs no drain: Docker's default 10 s is plenty.
NO_DRAIN = {"migrate", "models", "bootstrap", "beat", "postgres", "redis", "prometheus", "grafana"}
CADDY_GRACE = re.compile(r"^\s*grace_period\s+(\S+)\s*$", re.MULTILINE)


def _drain(service: dict, name: str) -> float:
    """The drain a service runs with: its compose environment's value, else the settings'."""
    from django.conf import settings

    environment = service.get("environment") or {}
    value = environment.get(name) if isinstance(environment, dict) else None
    return float(value) if value is not None else float(getattr(settings, name))


def test_grace_periods_outlast_the_drains():
    """Every service that drains on SIGTERM gets a stop_grace_period longer
    than its drain (settings, or its compose environment), so Docker's
    SIGKILL never cuts a drain short; Caddy's own grace period for open
    streams ends before its SIGKILL too."""
    services = yaml.safe_load((DOCKER / "compose.yaml").read_text())["services"]
    assert set(services) == set(DRAINS) | NO_DRAIN | {"caddy"}, "a new service: classify it"
    for name, (setting, margin) in DRAINS.items():
        grace = _seconds(services[name]["stop_grace_period"])
        assert grace >= _drain(services[name], setting) + margin, name
    for caddyfile in (DOCKER / "caddy").glob("*.Caddyfile"):
        (caddy_grace,) = CADDY_GRACE.findall(caddyfile.read_text())
        assert _seconds(services["caddy"]["stop_grace_period"]) > _seconds(caddy_grace), caddyfile
    for name in NO_DRAIN:
        assert _seconds(services[name].get("stop_grace_period", "10s")) >= 10, name


def test_celery_runs_with_the_task_time_limit_its_grace_period_assumes():
    """The drain the celery service is given time for is the limit Celery enforces."""
    from django.conf import settings

    from config.celery_app import app

    assert app.conf.task_time_limit == settings.CELERY_TASK_TIME_LIMIT > 0


def test_platform_env_reaches_every_app_container_but_not_the_secrets(tmp_path):
    env_file, values = filled_env(tmp_path)
    tunables = tmp_path / "platform.env"
    tunables.write_text("LOG_LEVEL=DEBUG\nENGINE_KV_CACHE_MB=96\nREDIS_PASSWORD=from-env-file\n")
    with env_file.open("a") as handle:
        handle.write(f"PLATFORM_ENV_FILE={tunables}\n")
    done = render(env_file)
    assert done.returncode == 0, done.stderr
    services = yaml.safe_load(done.stdout)["services"]
    for name in APP_SERVICES:
        environment = services[name]["environment"]
        assert environment["LOG_LEVEL"] == "DEBUG", name
        assert str(environment["ENGINE_KV_CACHE_MB"]) == "96", name
    # compose.yaml's own values win over the env file's.
    assert services["gpuworker"]["environment"]["REDIS_PASSWORD"] == values["REDIS_WORKER_PASSWORD"]
    assert services["web"]["environment"]["REDIS_PASSWORD"] == values["REDIS_WEB_PASSWORD"]


def test_no_cuda_hint_in_a_cpu_only_image():
    assert "--device cuda" not in (DOCKER / "compose.yaml").read_text()
    assert "cuda" not in (DOCKER / "Dockerfile").read_text().lower().replace("no cuda build", "")


@pytest.mark.skipif(shutil.which("caddy") is None, reason="Debian's caddy is not installed")
@pytest.mark.parametrize("mode", ["tls", "http-only-behind-proxy"])
def test_caddyfiles_adapt_and_front_every_web_replica(mode):
    done = subprocess.run(
        ["caddy", "adapt", "--adapter", "caddyfile", "--config", f"{mode}.Caddyfile"],
        cwd=DOCKER / "caddy", capture_output=True, text=True, timeout=30,
        env={**os.environ, "SITE_ADDRESS": "llm.example.test"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    config = json.loads(done.stdout)
    text = json.dumps(config)
    assert '"name": "web"' in text and '"port": "8000"' in text  # dynamic A upstreams
    if mode == "tls":
        assert "llm.example.test" in text and '"internal"' in text
    else:
        assert "trusted_proxies" in text and '"internal"' not in text


def test_healthchecks_and_a_protected_redis(rendered):
    services = rendered[0]["services"]
    assert "/healthz" in " ".join(services["web"]["healthcheck"]["test"])
    assert "/readyz" in " ".join(services["gpuworker"]["healthcheck"]["test"])
    assert services["postgres"]["healthcheck"]["test"][1] == "pg_isready"
    redis_health = " ".join(services["redis"]["healthcheck"]["test"])
    assert "--user web" in redis_health
    start = (DOCKER / "redis" / "start.sh").read_text()
    assert "--aclfile" in start and "--appendonly yes" in start
    assert "user default off" in (DOCKER / "redis" / "users.acl.template").read_text()


def test_each_service_gets_only_its_own_secrets(rendered):
    services, values = rendered[0]["services"], rendered[1]
    web, worker = services["web"]["environment"], services["gpuworker"]["environment"]
    assert web["DJANGO_SECRET_KEY"] == values["DJANGO_SECRET_KEY"]
    assert (web["REDIS_USERNAME"], web["REDIS_PASSWORD"]) == ("web", values["REDIS_WEB_PASSWORD"])
    assert (worker["REDIS_USERNAME"], worker["REDIS_PASSWORD"]) == (
        "worker",
        values["REDIS_WORKER_PASSWORD"],
    )
    leaked = {values[k] for k in ("DJANGO_SECRET_KEY", "POSTGRES_PASSWORD", "REDIS_WEB_PASSWORD")}
    assert not leaked & {str(v) for v in worker.values()}
    assert "DATABASE_URL" not in worker
    assert services["postgres"]["environment"]["POSTGRES_PASSWORD"] == values["POSTGRES_PASSWORD"]
    assert values["POSTGRES_PASSWORD"] in web["DATABASE_URL"]


def test_the_web_environment_passes_check_deploy(rendered):
    web = {k: str(v) for k, v in rendered[0]["services"]["web"]["environment"].items()}
    env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/tmp"), **web}
    done = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "no issues (0 silenced)" in done.stdout


def test_the_image_is_multi_stage_non_root_and_bakes_no_local_state():
    dockerfile = (DOCKER / "Dockerfile").read_text()
    assert re.findall(r"^FROM \S+ AS (\w+)", dockerfile, re.M) == ["base", "build", "runtime"]
    assert "COPY --from=build" in dockerfile
    final_stage = dockerfile.split("AS runtime", 1)[1]
    user = re.findall(r"^USER (\S+)", final_stage, re.M)
    assert user and user[-1] not in ("root", "0")
    assert final_stage.index("USER ") < final_stage.index("CMD ")
    assert "HEALTHCHECK" in final_stage and "/healthz" in final_stage
    # Built in: the hashed lock, Chart.js, the CPU kernels; not the model.
    build_stage = dockerfile.split("AS build", 1)[1].split("AS runtime", 1)[0]
    assert "install-locked" in build_stage and "requirements.lock" in build_stage
    assert "bin/chartjs" in build_stage and "cpu_library()" in build_stage
    assert "convert_gguf" not in dockerfile
    ignored = set((ROOT / ".dockerignore").read_text().split())
    assert {".venv", "db.sqlite3", ".cache", ".git", "docker/.env"} <= ignored
