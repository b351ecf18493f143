"""The container topology: docker/compose.yaml, the Dockerfile, .dockerignore.

There is no Docker daemon here: `docker compose config` (or Debian's
docker-compose 1.29, which validates against the Compose Specification's
JSON schema; .ci/run installs it) renders and validates the file offline.
The rendered web environment then passes `manage.py check --deploy`.
"""

from __future__ import annotations

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
APP_SERVICES = {"migrate", "web", "gpuworker", "celery", "beat"}
SITE_VALUES = {
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
    assert set(services) == APP_SERVICES | {"postgres", "redis", "prometheus", "grafana"}
    text = yaml.safe_dump(config)
    assert "seed_demo" not in text and "change-me" not in text
    commands = {name: " ".join(map(str, services[name].get("command", []))) for name in services}
    assert commands["web"].startswith("daphne ")
    assert "gpuworker" in commands["gpuworker"]
    assert "celery" in commands["celery"] and " worker " in commands["celery"]
    assert "celery" in commands["beat"] and " beat " in commands["beat"]
    assert commands["migrate"] == "python manage.py migrate --noinput"
    for name in APP_SERVICES:
        assert services[name]["build"]["dockerfile"].endswith("docker/Dockerfile"), name
    # Everything published stays on loopback: a TLS proxy fronts the web.
    for name, service in services.items():
        for port in service.get("ports", []):
            published = port if isinstance(port, str) else port.get("host_ip", "")
            assert str(published).startswith("127.0.0.1"), (name, port)


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
    assert len(re.findall(r"^FROM ", dockerfile, re.M)) == 2
    assert "COPY --from=build" in dockerfile
    final_stage = dockerfile.split("AS runtime", 1)[1]
    user = re.findall(r"^USER (\S+)", final_stage, re.M)
    assert user and user[-1] not in ("root", "0")
    assert final_stage.index("USER ") < final_stage.index("CMD ")
    assert "HEALTHCHECK" in final_stage and "/healthz" in final_stage
    ignored = set((ROOT / ".dockerignore").read_text().split())
    assert {".venv", "db.sqlite3", ".cache", ".git", "docker/.env"} <= ignored
