"""Django settings for Practicum, read from the environment.

The embedded default (no environment at all) is a SQLite file and Celery's
`filesystem://` broker under the data folder, so a newcomer needs no services.
"""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path

import dj_database_url

from webapp.settings_env import env_bool, env_list

BASE_DIR = Path(__file__).resolve().parent.parent
DATA_DIR = Path(os.environ.get("PRACTICUM_DATA_DIR", BASE_DIR / "var")).resolve()
DATA_DIR.mkdir(parents=True, exist_ok=True)
# Prepared model folders (SmolLM2 converted from its GGUF, the tiny test model, adapters).
MODELS_DIR = Path(os.environ.get("PRACTICUM_MODELS_DIR", DATA_DIR / "models")).resolve()


# PRACTICUM_PRODUCTION=1: the settings for a deployment behind HTTPS (README, Security):
# secure cookies, HSTS, HTTP redirected to HTTPS, DEBUG refused, SECRET_KEY required.
# `manage.py check --deploy` is clean under it.
PRODUCTION = env_bool("PRACTICUM_PRODUCTION", False)
DEBUG = env_bool("DEBUG", False)
SECRET_KEY = os.environ.get("SECRET_KEY", "")
if PRODUCTION:
    from django.core.exceptions import ImproperlyConfigured

    if DEBUG:
        raise ImproperlyConfigured("PRACTICUM_PRODUCTION=1 with DEBUG on: turn DEBUG off")
    if len(SECRET_KEY) < 50:
        raise ImproperlyConfigured(
            "PRACTICUM_PRODUCTION=1 needs SECRET_KEY (50 or more random characters, the same for every process)"
        )
if not SECRET_KEY:
    # A stable per-checkout key so sessions and signed feedback links survive restarts
    # on a developer machine; production sets SECRET_KEY explicitly.
    key_file = DATA_DIR / "secret_key"
    if not key_file.exists():
        import secrets

        key_file.write_text(secrets.token_urlsafe(50))
        key_file.chmod(0o600)
    SECRET_KEY = key_file.read_text().strip()

ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", "127.0.0.1,localhost,[::1],testserver")
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", "")

if PRODUCTION:
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_SSL_REDIRECT = env_bool("PRACTICUM_SSL_REDIRECT", True)
    # The load balancer's health check may stay on plain HTTP.
    SECURE_REDIRECT_EXEMPT = [r"^healthz$"]
    SECURE_HSTS_SECONDS = int(os.environ.get("PRACTICUM_HSTS_SECONDS", 365 * 24 * 3600))
    SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("PRACTICUM_HSTS_INCLUDE_SUBDOMAINS", True)
    # Only allows submitting the domain to browsers' preload lists; nothing is submitted.
    SECURE_HSTS_PRELOAD = env_bool("PRACTICUM_HSTS_PRELOAD", True)
    if env_bool("PRACTICUM_BEHIND_TLS_PROXY", False):
        # TLS ends at a proxy that sets X-Forwarded-Proto (and strips it from clients).
        SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "django_htmx",
    "template_partials",
    "axes",
    "webapp",
    # Lowest first: serving (deployments, versions, the live pointer) is what the others point at.
    "training.serving",
    "feedback",
    "training",
    "training.finetuning",
]

MIDDLEWARE = [
    # First, so every response of the site carries the policy (webapp/kernel/csp.py).
    "webapp.kernel.csp.ContentSecurityPolicyMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    # Before the views and CSRF: a NUL in a parameter, form field or path is a 400 (webapp/kernel/nul.py).
    "webapp.kernel.nul.NulRefusalMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    # Who is acting, for the audit rows of account and role changes (webapp/kernel/actor.py).
    "webapp.kernel.actor.ActorMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    # Last: turns a locked-out login into the lockout page (django-axes).
    "axes.middleware.AxesMiddleware",
]

ROOT_URLCONF = "webapp.urls"
WSGI_APPLICATION = "webapp.wsgi.application"
ASGI_APPLICATION = "webapp.asgi.application"

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
                # The nav's count of promotion requests waiting for the signed-in approver.
                "training.notifications.context_processors.inbox",
            ],
        },
    },
]

DATABASE_URL = os.environ.get("DATABASE_URL") or f"sqlite:///{DATA_DIR / 'practicum.sqlite3'}"
DATABASES = {"default": dj_database_url.parse(DATABASE_URL, conn_max_age=60, conn_health_checks=True)}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    DATABASES["default"]["CONN_MAX_AGE"] = 0
    DATABASES["default"]["OPTIONS"] = {
        # WAL lets the web process read while a worker writes; the busy timeout makes a
        # writer wait for the lock instead of failing with "database is locked".
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        "transaction_mode": "IMMEDIATE",
        "timeout": 30,
    }
IS_POSTGRES = DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql"
# PostgreSQL connections are bounded per process: a pool of at most DB_POOL_MAX_SIZE (psycopg's
# pool; Django borrows one per request or task and hands it back at the end), and a web process
# runs at most WEB_MAX_CONCURRENT_REQUESTS Django requests at once — the others wait for a slot
# without a thread or a connection. Sizing: web processes x DB_POOL_MAX_SIZE + worker processes
# x DB_POOL_MAX_SIZE (+1 per gateway process, which listens on its own connection) must stay
# under the server's max_connections (README, Configuration).
DB_POOL_MAX_SIZE = int(os.environ.get("PRACTICUM_DB_POOL_MAX_SIZE", 10))
DB_POOL_TIMEOUT = float(os.environ.get("PRACTICUM_DB_POOL_TIMEOUT", 60))
# Two of a web process's pooled connections stay for the gateway (its key/route lookups and its
# log writer each hold one).
WEB_MAX_CONCURRENT_REQUESTS = int(os.environ.get("PRACTICUM_WEB_MAX_CONCURRENT_REQUESTS", max(1, DB_POOL_MAX_SIZE - 2)))
if IS_POSTGRES and DB_POOL_MAX_SIZE > 0:
    # A pooled connection is returned at the end of each request; persistent connections
    # (CONN_MAX_AGE) would instead keep one per thread, and ASGI runs each request in a new one.
    DATABASES["default"]["CONN_MAX_AGE"] = 0
    DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {
        "min_size": 1,
        "max_size": DB_POOL_MAX_SIZE,
        "timeout": DB_POOL_TIMEOUT,
    }

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]
# Login throttling (django-axes) for the login form, the admin and HTTP Basic: after
# LOGIN_FAILURE_LIMIT failed attempts for one username (from anywhere) or from one client
# address (any username), further attempts are refused for LOGIN_COOLOFF_MINUTES, the right
# password included. `manage.py axes_reset` (or `axes_reset_username NAME`) lifts a lockout.
# Behind a proxy, let the server set the client address (uvicorn --forwarded-allow-ips).
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
AXES_FAILURE_LIMIT = int(os.environ.get("PRACTICUM_LOGIN_FAILURE_LIMIT", 10))
AXES_COOLOFF_TIME = timedelta(minutes=float(os.environ.get("PRACTICUM_LOGIN_COOLOFF_MINUTES", 15)))
AXES_LOCKOUT_PARAMETERS = ["username", "ip_address"]
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_TEMPLATE = "registration/locked_out.html"
AXES_VERBOSE = False
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = DATA_DIR / "staticfiles"
STATIC_ROOT.mkdir(exist_ok=True)
# Static files are served by the app itself (WhiteNoise), so `make demo` needs no web server
# in front; with DEBUG off run `collectstatic` first.
WHITENOISE_USE_FINDERS = True

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "feedback.auth.ApiKeyAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_PARSER_CLASSES": [
        "webapp.kernel.api_errors.JSONParser",
        "rest_framework.parsers.FormParser",
        "rest_framework.parsers.MultiPartParser",
    ],
    "EXCEPTION_HANDLER": "webapp.kernel.api_errors.exception_handler",
    "UNAUTHENTICATED_USER": None,
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Practicum API",
    "DESCRIPTION": "Capture agent traces, collect feedback, train and promote model versions.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    # The schema lists every endpoint and field: for logged-in people and API keys only.
    "SERVE_PERMISSIONS": ["rest_framework.permissions.IsAuthenticated"],
}

# Ingest limits: a request over any of them is refused whole with 413, before parsing.
INGEST_MAX_BODY_BYTES = int(os.environ.get("PRACTICUM_INGEST_MAX_BODY_BYTES", 32 * 1024 * 1024))
INGEST_MAX_TRACES_PER_BATCH = int(os.environ.get("PRACTICUM_INGEST_MAX_TRACES", 1000))
INGEST_MAX_MESSAGES_PER_TRACE = int(os.environ.get("PRACTICUM_INGEST_MAX_MESSAGES", 2000))
# Django's own cap on a request body read through request.body.
DATA_UPLOAD_MAX_MEMORY_SIZE = INGEST_MAX_BODY_BYTES
# Request bodies (webapp/site/request_bodies.py), read before a request takes a slot: at most
# WEB_MAX_BODY_BYTES (a fine-tuning upload: its file limit and the multipart around it), at
# most WEB_ANONYMOUS_MAX_BODY_BYTES to a route anyone may post to (login, feedback links),
# credentials checked first everywhere else, and the whole body in within
# WEB_BODY_TIMEOUT_SECONDS of the headers (else 408).
WEB_MAX_BODY_BYTES = int(os.environ.get("PRACTICUM_WEB_MAX_BODY_BYTES", INGEST_MAX_BODY_BYTES))
# 512 KiB: a feedback link's comment and correction (20,000 characters each) form-encoded.
WEB_ANONYMOUS_MAX_BODY_BYTES = int(os.environ.get("PRACTICUM_WEB_ANONYMOUS_MAX_BODY_BYTES", 512 * 1024))
WEB_BODY_TIMEOUT_SECONDS = float(os.environ.get("PRACTICUM_WEB_BODY_TIMEOUT_SECONDS", 60))

# Celery. The database row of a job is the source of truth, so no result backend.
CELERY_BROKER_URL = os.environ.get("CELERY_BROKER_URL") or "filesystem://"
CELERY_BROKER_TRANSPORT_OPTIONS: dict[str, object] = {}
if CELERY_BROKER_URL.startswith("filesystem://"):
    _broker_dir = DATA_DIR / "celery-broker"
    for sub in ("out", "processed", "control"):
        (_broker_dir / sub).mkdir(parents=True, exist_ok=True)
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(_broker_dir / "out"),
        "data_folder_out": str(_broker_dir / "out"),
        "processed_folder": str(_broker_dir / "processed"),
        "control_folder": str(_broker_dir / "control"),
        "store_processed": False,
    }
else:
    # Above the longest training job, so a long unacknowledged task is not redelivered
    # to a second worker while the first still runs it.
    CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": 12 * 3600}
CELERY_TASK_ALWAYS_EAGER = env_bool("CELERY_TASK_ALWAYS_EAGER", False)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": os.environ.get("LOG_LEVEL", "INFO")},
    # django-axes logs every login at INFO; failures and lockouts still show at WARNING.
    "loggers": {"django.server": {"level": "WARNING"}, "axes": {"level": "WARNING"}},
}

# Customer feedback links: signed URLs that let a browser post feedback on one trace.
# A link lives FEEDBACK_LINK_DEFAULT_AGE seconds unless the API call asks for less or more,
# never longer than FEEDBACK_LINK_MAX_AGE.
FEEDBACK_LINK_DEFAULT_AGE = int(os.environ.get("PRACTICUM_FEEDBACK_LINK_DEFAULT_AGE", 24 * 3600))
FEEDBACK_LINK_MAX_AGE = int(os.environ.get("PRACTICUM_FEEDBACK_LINK_MAX_AGE", 7 * 24 * 3600))

# The LLM judge (webapp/settings_judge.py).
from webapp.settings_judge import *  # noqa: E402, F403

# Inference server (a vLLM OpenAI-compatible server the project starts, bound to loopback)
# and the /v1/ completion gateway in front of it.
INFERENCE_HOST = os.environ.get("PRACTICUM_INFERENCE_HOST", "127.0.0.1")
INFERENCE_PORT = int(os.environ.get("PRACTICUM_INFERENCE_PORT", 8001))
INFERENCE_URL = os.environ.get("PRACTICUM_INFERENCE_URL") or f"http://{INFERENCE_HOST}:{INFERENCE_PORT}"
# The inference server's own key: vLLM is started with it (runtime LoRA loading is on, so
# whoever reaches its port could otherwise load or unload the adapter behind a live name), and
# every project client sends it. Unset: generated once per installation into DATA_DIR, like
# SECRET_KEY; servers on other machines need PRACTICUM_INFERENCE_API_KEY set to the same value.
INFERENCE_API_KEY = os.environ.get("PRACTICUM_INFERENCE_API_KEY", "")
if not INFERENCE_API_KEY:
    _inference_key_file = DATA_DIR / "inference_api_key"
    if not _inference_key_file.exists():
        import secrets
        import tempfile

        # Written aside, then linked into place: processes starting together agree on one key.
        with tempfile.NamedTemporaryFile("w", dir=DATA_DIR, prefix=".inference_api_key.", delete=False) as _tmp:
            _tmp.write(secrets.token_urlsafe(32))
        os.chmod(_tmp.name, 0o600)
        try:
            os.link(_tmp.name, _inference_key_file)
        except FileExistsError:
            pass
        finally:
            os.unlink(_tmp.name)
    INFERENCE_API_KEY = _inference_key_file.read_text().strip()
# A judge served by our own inference server (as `make demo` runs it) gets that server's key
# unless PRACTICUM_JUDGE_API_KEY says otherwise; no other judge URL is sent it.
_judge_url = JUDGE_BASE_URL.rstrip("/").removesuffix("/v1")  # noqa: F405
if JUDGE_BASE_URL and not JUDGE_API_KEY and _judge_url == INFERENCE_URL.rstrip("/"):  # noqa: F405
    JUDGE_API_KEY = INFERENCE_API_KEY
# Other OpenAI-compatible servers a training job may sample rollouts from, besides each base
# model's own inference server (comma-separated base URLs). A job config cannot name any other.
INFERENCE_ROLLOUT_URLS = env_list("PRACTICUM_INFERENCE_ROLLOUT_URLS", "")
INFERENCE_MAX_MODEL_LEN = int(os.environ.get("PRACTICUM_INFERENCE_MAX_MODEL_LEN", 2048))
INFERENCE_MAX_LORA_RANK = int(os.environ.get("PRACTICUM_INFERENCE_MAX_LORA_RANK", 32))
INFERENCE_MAX_LORAS = int(os.environ.get("PRACTICUM_INFERENCE_MAX_LORAS", 4))
INFERENCE_KV_CACHE_GIB = int(os.environ.get("PRACTICUM_INFERENCE_KV_CACHE_GIB", 1))
# Seconds a completion may take end to end before the gateway gives up on the upstream.
GATEWAY_UPSTREAM_TIMEOUT = float(os.environ.get("PRACTICUM_GATEWAY_UPSTREAM_TIMEOUT", 600))
# How long the gateway trusts a cached API key / live version before asking the database again:
# a revoked key or a flipped live pointer takes effect within this many seconds.
GATEWAY_AUTH_CACHE_SECONDS = float(os.environ.get("PRACTICUM_GATEWAY_AUTH_CACHE_SECONDS", 10))
GATEWAY_LIVE_CACHE_SECONDS = float(os.environ.get("PRACTICUM_GATEWAY_LIVE_CACHE_SECONDS", 2))
# While a progressive release splits a deployment's traffic, each gateway process remembers for
# this long after a conversation's last call which version served it (at most 100,000
# conversations); a conversation it does not remember is looked up once in the trace store, so
# no step, process or restart moves a conversation in flight (0: look up every continuing call).
GATEWAY_PIN_SECONDS = float(os.environ.get("PRACTICUM_GATEWAY_PIN_SECONDS", 6 * 3600))
# On PostgreSQL the gateway also LISTENs for live-pointer flips and drops the cached route at
# once, so a promotion or rollback applies from the next request (the TTL stays as a fallback).
GATEWAY_LIVE_LISTEN = env_bool("PRACTICUM_GATEWAY_LIVE_LISTEN", True)
# Exchanges waiting to be written; past this the overflow goes to a spill file under DATA_DIR.
GATEWAY_LOG_QUEUE_SIZE = int(os.environ.get("PRACTICUM_GATEWAY_LOG_QUEUE_SIZE", 20000))
GATEWAY_LOG_BATCH_SIZE = int(os.environ.get("PRACTICUM_GATEWAY_LOG_BATCH_SIZE", 500))
# A failure-mode run silent this long (no progress written) is failed by the stale-work sweep.
FAILURE_MODE_STALE_AFTER_SECONDS = float(os.environ.get("PRACTICUM_FAILURE_MODE_STALE_AFTER_SECONDS", 1800))
# How long an OpenTelemetry span is kept to shape its trace (a run's spans arrive over
# several exports); a run that lasts longer is read from the spans still kept.
OTEL_SPAN_RETENTION_SECONDS = float(os.environ.get("PRACTICUM_OTEL_SPAN_RETENTION_SECONDS", 24 * 3600))
# What one OpenTelemetry span may leave stored (the messages it adds to its trace, or the tool
# result it parks until its call arrives), and what all spans of one trace may: past either,
# that trace's spans of the export are rejected (partialSuccess), its other traces taken.
OTEL_SPAN_MAX_BYTES = int(os.environ.get("PRACTICUM_OTEL_SPAN_MAX_BYTES", 1024 * 1024))
OTEL_TRACE_MAX_BYTES = int(os.environ.get("PRACTICUM_OTEL_TRACE_MAX_BYTES", 32 * 1024 * 1024))
# The largest JSONL a fine-tuning upload (/api/openai/v1/files) may be; it is stored in the database.
FINETUNE_FILE_MAX_BYTES = int(os.environ.get("PRACTICUM_FINETUNE_FILE_MAX_BYTES", 32 * 1024 * 1024))
# All of one deployment's stored fine-tuning data together: its files (deleted ones too, until
# no job still has to read them) and the training items its jobs made of them.
FINETUNE_STORAGE_MAX_BYTES = int(os.environ.get("PRACTICUM_FINETUNE_STORAGE_MAX_BYTES", 1024 * 1024 * 1024))
# A supervised line makes one item per assistant message, each carrying the messages before
# it (N such messages: N items of up to N messages): bounds per line, and on the bytes of
# items one job makes (counted before any item is built).
FINETUNE_MAX_MESSAGES_PER_LINE = int(os.environ.get("PRACTICUM_FINETUNE_MAX_MESSAGES_PER_LINE", 256))
FINETUNE_MAX_TARGETS_PER_LINE = int(os.environ.get("PRACTICUM_FINETUNE_MAX_TARGETS_PER_LINE", 32))
FINETUNE_MAX_ITEM_BYTES = int(os.environ.get("PRACTICUM_FINETUNE_MAX_ITEM_BYTES", 4 * FINETUNE_FILE_MAX_BYTES))
# How long a logged history can be continued by a call that names no trace (conversation stitching).
GATEWAY_STITCH_WINDOW_SECONDS = float(os.environ.get("PRACTICUM_GATEWAY_STITCH_WINDOW_SECONDS", 6 * 3600))

# Comment-conditioned distillation and hinted GRPO are offered for a model only where its
# student-teacher gap (`manage.py probe_gap`) is at least this; an unprobed model is allowed
# with a warning on the job (docs/decisions/0042-readers-that-choose-actions-and-the-gap-probe.md).
TRAINING_MIN_HINT_GAP = float(os.environ.get("PRACTICUM_TRAINING_MIN_HINT_GAP", 0.10))

# Training jobs: run folders, and how a worker's liveness is judged. A running job whose
# heartbeat is older than TRAINING_STALE_AFTER_SECONDS is resumed from its checkpoint
# (at most TRAINING_MAX_ATTEMPTS starts in all) or marked failed.
TRAINING_DIR = Path(os.environ.get("PRACTICUM_TRAINING_DIR", DATA_DIR / "training")).resolve()
TRAINING_HEARTBEAT_SECONDS = float(os.environ.get("PRACTICUM_TRAINING_HEARTBEAT_SECONDS", 10))
TRAINING_STALE_AFTER_SECONDS = float(os.environ.get("PRACTICUM_TRAINING_STALE_AFTER_SECONDS", 300))
TRAINING_MAX_ATTEMPTS = int(os.environ.get("PRACTICUM_TRAINING_MAX_ATTEMPTS", 3))
TRAINING_STALE_CHECK_SECONDS = float(os.environ.get("PRACTICUM_TRAINING_STALE_CHECK_SECONDS", 60))
# Data-parallel jobs ("processes": N > 1): the worker runs `torchrun <these arguments>
# --nproc-per-node N manage.py train_rank …` on its own machine ("{job}" becomes the job's
# id). With "--nnodes 2 --node-rank 0 --master-addr head --master-port 29400" each other
# node runs `manage.py train_node --job <id> --node-rank K` (by hand or from a scheduler, with
# the same setting), or the group waits; the worker's node is node 0 and owns the job. A collective
# that waits this long for a silent process fails the group (it waits for rank 0's
# evaluations too, so it must be longer than the longest one).
TRAINING_TORCHRUN_ARGS = os.environ.get("PRACTICUM_TRAINING_TORCHRUN_ARGS", "--standalone")
TRAINING_COLLECTIVE_TIMEOUT_SECONDS = float(os.environ.get("PRACTICUM_TRAINING_COLLECTIVE_TIMEOUT_SECONDS", 1800))

# Evaluation, promotion and release. Evaluations generate through the inference server
# ("server"), in the worker with transformers ("local"), or "auto": the server when it
# answers, else local. Releases load a version, send one smoke request, then flip.
EVAL_GENERATOR = os.environ.get("PRACTICUM_EVAL_GENERATOR", "auto")
EVAL_MAX_ITEMS = int(os.environ.get("PRACTICUM_EVAL_MAX_ITEMS", 500))
EVAL_MAX_TOKENS = int(os.environ.get("PRACTICUM_EVAL_MAX_TOKENS", 256))
EVAL_TEMPERATURE = float(os.environ.get("PRACTICUM_EVAL_TEMPERATURE", 0))
# An environment's decision curve: held-out contexts per point (0: no curve), at every
# EVERY-th value of its x (and both sides of the rule's threshold).
EVAL_DECISION_CURVE_PER_POINT = int(os.environ.get("PRACTICUM_EVAL_DECISION_CURVE_PER_POINT", 2))
EVAL_DECISION_CURVE_EVERY = int(os.environ.get("PRACTICUM_EVAL_DECISION_CURVE_EVERY", 1))
# Drift watch (the overview): the live version's first and latest DRIFT_WINDOW graded
# outcomes and customer ratings are compared; a drop of more than DRIFT_DROP flags it.
DRIFT_WINDOW = int(os.environ.get("PRACTICUM_DRIFT_WINDOW", 50))
DRIFT_DROP = float(os.environ.get("PRACTICUM_DRIFT_DROP", 0.15))
# A running evaluation with no item finished for this long lost its worker: the stale-work
# sweep marks it failed, with an audit record. Longer
# than one item may take: an episode item is two sides of up to 4 completions of at most
# 120 s each (960 s).
EVALUATION_STALE_AFTER_SECONDS = float(os.environ.get("PRACTICUM_EVALUATION_STALE_AFTER_SECONDS", 1800))
# The rubric for held-out turns that carry none of their own (no judgement yet).
EVAL_DEFAULT_RUBRIC = os.environ.get("PRACTICUM_EVAL_DEFAULT_RUBRIC", GENERAL_RUBRIC)  # noqa: F405
RELEASE_SMOKE_PROMPT = os.environ.get("PRACTICUM_RELEASE_SMOKE_PROMPT", "Say hello.")
RELEASE_SMOKE_MAX_TOKENS = int(os.environ.get("PRACTICUM_RELEASE_SMOKE_MAX_TOKENS", 8))
RELEASE_SMOKE_TIMEOUT = float(os.environ.get("PRACTICUM_RELEASE_SMOKE_TIMEOUT", 60))
RELEASE_LOAD_TIMEOUT = float(os.environ.get("PRACTICUM_RELEASE_LOAD_TIMEOUT", 120))
# A release queued this long with no worker taking it, or running with its worker silent
# this long (longer than a load and a smoke request may take), is failed by the stale-work
# sweep and before the next release or rollback is asked for.
RELEASE_STALE_SECONDS = float(os.environ.get("PRACTICUM_RELEASE_STALE_SECONDS", 600))
# Judge jobs, failure-mode runs, evaluations and releases are taken over at once by a
# redelivered task; one that has been started this many times is failed at the next
# takeover instead (its work kills every worker it reaches), `webapp.kernel.work.work_claim`.
WORK_MAX_ATTEMPTS = int(os.environ.get("PRACTICUM_WORK_MAX_ATTEMPTS", 3))
# After a flip the version that went out of service is unloaded from every replica this many
# seconds later: by then no request that started on it can still be running (the gateway
# gives up on one after its upstream timeout; a gateway process that missed the flip's NOTIFY
# stops routing to it after its route cache's TTL).
RELEASE_UNLOAD_AFTER_SECONDS = float(
    os.environ.get("PRACTICUM_RELEASE_UNLOAD_AFTER_SECONDS", GATEWAY_UPSTREAM_TIMEOUT + GATEWAY_LIVE_CACHE_SECONDS + 5)
)

# Where the project's own processes reach its gateway (`/v1/`), e.g. the tour's "run the agent
# again", whose worker sends a freshly minted key there. Always configured, never taken from a
# request: a Host header (whose port ALLOWED_HOSTS does not check) must not choose where a
# key goes. PRACTICUM_DEMO_AGENT_BASE_URL is the older name of the same setting.
GATEWAY_URL = (
    os.environ.get("PRACTICUM_GATEWAY_URL")
    or os.environ.get("PRACTICUM_DEMO_AGENT_BASE_URL")
    or f"http://127.0.0.1:{os.environ.get('PRACTICUM_PORT', '8000')}"
).rstrip("/")
# The site's address as people reach it, for the links in mails (a learning policy's request
# to its approvers): configured, never taken from a request, for the same reason.
SITE_URL = (
    os.environ.get("PRACTICUM_SITE_URL") or f"http://127.0.0.1:{os.environ.get('PRACTICUM_PORT', '8000')}"
).rstrip("/")
# The tour's "run the agent again": how many tasks, and how long its key lives.
DEMO_AGENT_EPISODES = int(os.environ.get("PRACTICUM_DEMO_AGENT_EPISODES", 12))
# `make demo` sets how many episodes its agent works before the demo is ready; the tour shows
# how far it has got (n/36 episodes). 0 outside the demo: no readiness line.
DEMO_EPISODES = int(os.environ.get("PRACTICUM_DEMO_EPISODES", 0))
DEMO_AGENT_KEY_SECONDS = int(os.environ.get("PRACTICUM_DEMO_AGENT_KEY_SECONDS", 7200))

# Task environments for multi-turn episodes: modules whose import registers them (`@register`).
PRACTICUM_ENVIRONMENT_MODULES = env_list(
    "PRACTICUM_ENVIRONMENT_MODULES", "training.environments.files,training.environments.support_desk"
)
