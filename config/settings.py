"""One env-driven settings module; the environment is read here and only here.

Embedded default: with neither DATABASE_URL nor REDIS_URL set the whole
platform runs in one process on SQLite, an in-process bus, an in-memory
channel layer and an in-process engine thread.
"""

import os
from pathlib import Path

import dj_database_url
from celery.schedules import crontab

BASE_DIR = Path(__file__).resolve().parent.parent


def env_bool(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None:
        return default
    return value.strip().lower() in {"1", "true", "yes", "on"}


def env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return default if value in (None, "") else int(value)


SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "dev-insecure-secret-key-change-me")
DEBUG = env_bool("DJANGO_DEBUG", True)
ALLOWED_HOSTS = os.environ.get("DJANGO_ALLOWED_HOSTS", "*").split(",")
CSRF_TRUSTED_ORIGINS = [
    o for o in os.environ.get("DJANGO_CSRF_TRUSTED_ORIGINS", "").split(",") if o
]

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "tenants",
    "billing",
    "inference",
    "gpuworkers",
    "fleet",
    "console",
]

MIDDLEWARE = [
    "inference.middleware.RequestIdMiddleware",
    "inference.middleware.ApiErrorFallbackMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "config.urls"
ASGI_APPLICATION = "config.asgi.application"
WSGI_APPLICATION = None

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "console.context_processors.console",
            ]
        },
    }
]

DATABASE_URL = os.environ.get("DATABASE_URL") or None


def _postgres_with_pool(config: dict) -> dict:
    """Share a bounded pool of connections between a process's threads.

    Without it every in-flight request holds its own connection, and a burst
    of a few hundred requests over two web processes ran PostgreSQL out of
    connections (500s instead of 429s). With the pool, requests wait up to
    the timeout for a free connection.
    """
    if "postgresql" in config.get("ENGINE", ""):
        config.setdefault("OPTIONS", {})["pool"] = {
            "min_size": 1,
            "max_size": env_int("DB_POOL_MAX", 16),
            # DB_POOL_TIMEOUT: with PostgreSQL down, a short wait lets the
            # fleet's fallbacks (snapshot, auth cache, usage outbox) answer.
            "timeout": float(os.environ.get("DB_POOL_TIMEOUT", "30")),
        }
    return config


DATABASES = {
    "default": _postgres_with_pool(dj_database_url.parse(DATABASE_URL, conn_max_age=0))
    if DATABASE_URL
    else {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ.get("SQLITE_PATH", str(BASE_DIR / "db.sqlite3")),
        # The engine thread and web requests write usage rows concurrently.
        "OPTIONS": {"timeout": 20},
    }
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = []
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = BASE_DIR / "staticfiles"
# config.asgi serves /static/ from the finders (Django's async
# ASGIStaticFilesHandler): no collectstatic step before a test run or a dev
# server. WhiteNoise's middleware is sync-only and would force every async
# view (SSE streams) through async_to_sync.
LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/chat/"
LOGOUT_REDIRECT_URL = "/accounts/login/"
# The chat API accepts long prompts; the per-tier context cap is the real bound.
DATA_UPLOAD_MAX_MEMORY_SIZE = env_int("MAX_REQUEST_BYTES", 2 * 1024 * 1024)

# Redis: rate limits, request bus, response streams, heartbeats, channel
# layer and Celery broker. Unset means the embedded in-process backends.
REDIS_URL = os.environ.get("REDIS_URL") or None
if REDIS_URL:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [REDIS_URL]},
        }
    }
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
# Shared cache: the relay keeps each response's route (owner, worker) here so
# any web process can serve a stream resume. Embedded mode: per process.
CACHES = {
    "default": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": REDIS_URL}
    if REDIS_URL
    else {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}
}

# Celery (config/celery_app.py): Redis by default; the in-memory broker of
# embedded mode only serves a worker in the same process (bin/run has none,
# so there the beat's jobs do not run; their services still work when called).
CELERY_BROKER_URL = os.environ.get("CELERY_BROKER_URL") or REDIS_URL or "memory://"
CELERY_RESULT_BACKEND = (
    os.environ.get("CELERY_RESULT_BACKEND") or CELERY_BROKER_URL
    if REDIS_URL or os.environ.get("CELERY_BROKER_URL")
    else "cache+memory://"
)
# Tasks are idempotent, so a task whose worker died is redelivered, not lost.
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_TRACK_STARTED = True
CELERY_RESULT_EXPIRES = 24 * 3600
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TIMEZONE = "UTC"
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# Queues: billing (invoices, roll-ups, budgets, reports) and fleet (worker
# accounting, fleet operations); the first matching route wins.
CELERY_TASK_DEFAULT_QUEUE = "billing"
CELERY_TASK_ROUTES = {
    "billing.tasks.gpu_usage_sample": {"queue": "fleet"},
    "billing.tasks.*": {"queue": "billing"},
    "fleet.tasks.*": {"queue": "fleet"},
}
CELERY_BEAT_SCHEDULE = {
    "billing-daily-usage-rollup": {
        # Hourly: yesterday settles, today stays current.
        "task": "billing.tasks.daily_usage_rollup",
        "schedule": crontab(minute=5),
    },
    "billing-monthly-invoices": {
        # Daily, for the month before: a missed first of the month still bills.
        "task": "billing.tasks.invoices_issue_monthly",
        "schedule": crontab(minute=30, hour=1),
    },
    "billing-budget-checks": {"task": "billing.tasks.budgets_check", "schedule": 300.0},
    "fleet-gpu-usage-sample": {
        "task": "billing.tasks.gpu_usage_sample",
        # Seconds; what a worker that dies between samples leaves uncounted.
        "schedule": float(env_int("GPU_SAMPLE_INTERVAL", 60)),
    },
    # Re-publish the control snapshot even without changes: a Redis that lost
    # it gets it back; drain usage written to the outbox while PostgreSQL was
    # down; retire versions whose rollback grace period is over.
    "fleet-snapshot-publish": {"task": "fleet.tasks.snapshot_publish", "schedule": 30.0},
    "fleet-usage-outbox-drain": {"task": "fleet.tasks.usage_outbox_drain", "schedule": 15.0},
    "fleet-standby-retire": {"task": "fleet.tasks.standby_retire", "schedule": 60.0},
}

# Billing: one currency; soft budget alerts go out by email.
BILLING_CURRENCY = os.environ.get("BILLING_CURRENCY", "USD")
EMAIL_BACKEND = os.environ.get("EMAIL_BACKEND", "django.core.mail.backends.console.EmailBackend")
EMAIL_HOST = os.environ.get("EMAIL_HOST", "localhost")
EMAIL_PORT = env_int("EMAIL_PORT", 25)
EMAIL_HOST_USER = os.environ.get("EMAIL_HOST_USER", "")
EMAIL_HOST_PASSWORD = os.environ.get("EMAIL_HOST_PASSWORD", "")
EMAIL_USE_TLS = env_bool("EMAIL_USE_TLS", False)
DEFAULT_FROM_EMAIL = os.environ.get("DEFAULT_FROM_EMAIL", "billing@localhost")
# A GPU worker's price per hour (gpuworker --hourly-price overrides it).
WORKER_HOURLY_PRICE = os.environ.get("WORKER_HOURLY_PRICE", "0")

# Rate limits and quotas (tenants.ratelimit): Redis key prefix, and how long
# a concurrency slot is held at most when its response never settles (a web
# process died mid-response).
RATE_LIMIT_PREFIX = os.environ.get("RATE_LIMIT_PREFIX", "rl")
RATE_LIMIT_SLOT_TTL = env_int("RATE_LIMIT_SLOT_TTL", 900)

# Inference: served models and the engine.
# Directory of the demo model, converted from GGUF on first use.
LLM_MODEL_CACHE = os.environ.get("LLM_MODEL_CACHE") or None
DEMO_MODEL_NAME = os.environ.get("DEMO_MODEL_NAME", "smollm2-135m-instruct")
# Run an engine thread inside the web process (embedded mode). Defaults to on
# when there is no Redis, since nothing else could serve requests then.
EMBEDDED_ENGINE = env_bool("EMBEDDED_ENGINE", REDIS_URL is None)
ENGINE_DTYPE = os.environ.get("ENGINE_DTYPE", "bfloat16")
ENGINE_KV_CACHE_MB = env_int("ENGINE_KV_CACHE_MB", 512)
ENGINE_THREADS = env_int("ENGINE_THREADS", 0)  # 0: torch's default
# Token budget per engine step for serving workers: smaller than the engine's
# offline default, so running streams keep a steady inter-token latency.
ENGINE_MAX_BATCHED_TOKENS = env_int("ENGINE_MAX_BATCHED_TOKENS", 512)
# How the engine shares a worker between tiers: fair (weighted fair share by
# Tier.scheduling_weight, with preemption), priority, or fcfs (issue 5).
ENGINE_SCHEDULING_POLICY = os.environ.get("ENGINE_SCHEDULING_POLICY", "fair")
# Seconds without a heartbeat before a worker is treated as dead.
WORKER_HEARTBEAT_TTL = env_int("WORKER_HEARTBEAT_TTL", 6)
# How long a finished response's event stream stays readable for resumes.
RESPONSE_STREAM_TTL = env_int("RESPONSE_STREAM_TTL", 600)
# Seconds a response stream may go without any event before the web tier
# aborts it and ends it failed (inference.dispatch.stream_events).
STREAM_IDLE_TIMEOUT = env_int("STREAM_IDLE_TIMEOUT", 300)

# Fleet (fleet/): the versioned control snapshot in Redis, how often each
# process re-reads it, the routing policy (cache_aware, affinity_only,
# round_robin, least_loaded), the bearer token of /fleet/signal and
# /fleet/state for orchestrators (staff sessions need none), and how long
# a successful API key authentication may stand in for the database when
# PostgreSQL is unreachable.
FLEET_SNAPSHOT_KEY = os.environ.get("FLEET_SNAPSHOT_KEY", "fleet:snapshot")
FLEET_SNAPSHOT_REFRESH = float(os.environ.get("FLEET_SNAPSHOT_REFRESH", "2"))
FLEET_ROUTING_POLICY = os.environ.get("FLEET_ROUTING_POLICY", "cache_aware")
FLEET_SIGNAL_TOKEN = os.environ.get("FLEET_SIGNAL_TOKEN", "")
FLEET_AUTH_CACHE_SECONDS = env_int("FLEET_AUTH_CACHE_SECONDS", 300)
FLEET_USAGE_OUTBOX_KEY = os.environ.get("FLEET_USAGE_OUTBOX_KEY", "fleet:usage-outbox")
# Console chat: how long a reply whose socket dropped abnormally (not a clean
# close) keeps generating, waiting for the browser to reconnect and resume it.
CONSOLE_RESUME_GRACE_SECONDS = env_int("CONSOLE_RESUME_GRACE_SECONDS", 10)
# Longest console reply (further capped by the tier). The engine reserves KV
# for a request's full length, so a chat must not ask for the tier's whole
# output cap by default (4096 tokens would not even fit a small worker).
CONSOLE_MAX_OUTPUT_TOKENS = env_int("CONSOLE_MAX_OUTPUT_TOKENS", 1024)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": os.environ.get("LOG_LEVEL", "INFO")},
}
