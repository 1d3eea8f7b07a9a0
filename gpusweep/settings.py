"""Settings for gpusweep. Everything deployment-specific comes from the environment.

With no configuration at all a user gets the embedded default: a SQLite file and a
filesystem Celery broker under ``var/``. PostgreSQL and Redis/RabbitMQ are selected by
``DATABASE_URL`` and ``CELERY_BROKER_URL`` alone.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from gpusweep.env import env_bool, env_int, env_json_object, env_list, env_str, env_url, persistent_secret, secret_key

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(env_str("GPUSWEEP_VAR_DIR", str(BASE_DIR / "var"))).resolve()
VAR_DIR.mkdir(parents=True, exist_ok=True)

DEBUG = env_bool("DEBUG", True)
SECRET_KEY = secret_key(VAR_DIR, debug=DEBUG)
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]", "testserver"])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])
# Behind a proxy that ends TLS and sets X-Forwarded-Proto (and strips it from clients): requests it
# forwards are https, so absolute URLs built from a request (single sign-on's redirect URI) are too.
if env_bool("GPUSWEEP_TRUST_FORWARDED_PROTO", False):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "rest_framework.authtoken",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "django_celery_beat",
    "gpusweep",
    "accounts",
    "inventory",
    "advisories",
    "campaigns",
    "reports",
    "webhooks",
    "executors",
    "costs",
    "metrics",
    "console",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # Early, so an oversized body is refused before anything reads it; answers /api/ errors as JSON.
    "gpusweep.errors.ApiErrorMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # Last, so it sees request.user: every page but the open list needs a login.
    "gpusweep.middleware.LoginRequiredMiddleware",
]

ROOT_URLCONF = "gpusweep.urls"
WSGI_APPLICATION = "gpusweep.wsgi.application"
ASGI_APPLICATION = "gpusweep.asgi.application"

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
            ],
        },
    },
]

# --- Database -------------------------------------------------------------------------
DATABASE_URL = env_url(
    "DATABASE_URL",
    f"sqlite:///{VAR_DIR / 'gpusweep.sqlite3'}",
    schemes={"sqlite", "postgres", "postgresql", "pgsql"},
)
_default_db = dj_database_url.parse(DATABASE_URL, conn_max_age=env_int("DB_CONN_MAX_AGE", 0, minimum=0))
if _default_db["ENGINE"] == "django.db.backends.sqlite3":
    # WAL lets the web process read while a worker writes; IMMEDIATE transactions take the
    # write lock up front so two processes never deadlock upgrading a read lock.
    _default_db["OPTIONS"] = {
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        "transaction_mode": "IMMEDIATE",
        "timeout": 30,
    }
elif (_pool_size := env_int("GPUSWEEP_DB_POOL_SIZE", 0, minimum=0)) and not _default_db.get("CONN_MAX_AGE"):
    # PostgreSQL through a connection pool per process (psycopg_pool): a campaign step gives its
    # connection back while the executor waits on a node, so k nodes in flight do not hold k
    # connections (campaigns.engine). 0 (the default) keeps one connection per thread.
    _default_db["OPTIONS"] = {**_default_db.get("OPTIONS", {}),
                              "pool": {"min_size": 1, "max_size": _pool_size, "timeout": 60}}
DATABASES = {"default": _default_db}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = env_str("TIME_ZONE", "UTC")
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = Path(env_str("STATIC_ROOT", str(BASE_DIR / "staticfiles")))

LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/accounts/login/"

# --- Single sign-on (OpenID Connect) ------------------------------------------------------
# Off unless GPUSWEEP_OIDC_ISSUER is set; README "Single sign-on" has a provider's walk-through.
# The endpoints come from the issuer's /.well-known/openid-configuration (read at the first
# sign-in, kept an hour: accounts.oidc); each may be given instead. Users are matched by the
# issuer and the `sub` claim (accounts.OidcIdentity) and made at their first sign-in; at every
# sign-in their roles are set from the groups claim through the role map, so a group removed at
# the provider loses its role at the next sign-in.
GPUSWEEP_OIDC_ISSUER = env_str("GPUSWEEP_OIDC_ISSUER", "") and env_url(
    "GPUSWEEP_OIDC_ISSUER", "", schemes={"https", "http"})
GPUSWEEP_OIDC_ENDPOINTS = {
    key: value for key, value in (
        (key, env_str(f"GPUSWEEP_OIDC_{key.upper()}", "").strip())
        for key in ("authorization_endpoint", "token_endpoint", "userinfo_endpoint", "jwks_uri",
                    "end_session_endpoint"))
    if value}
# On the login page: "Sign in with <this>" (default: the issuer's host).
GPUSWEEP_OIDC_PROVIDER_NAME = env_str("GPUSWEEP_OIDC_PROVIDER_NAME", "").strip()
GPUSWEEP_OIDC_GROUPS_CLAIM = env_str("GPUSWEEP_OIDC_GROUPS_CLAIM", "groups").strip()
# The new user's name (matching is by `sub`, never by this): the first of these claims present.
GPUSWEEP_OIDC_USERNAME_CLAIMS = env_list("GPUSWEEP_OIDC_USERNAME_CLAIMS", ["preferred_username", "email", "sub"])
# {"<group at the provider>": "<role>" or ["<role>", ...]}; roles are gpusweep.roles.Role's values.
GPUSWEEP_OIDC_ROLE_MAP: dict[str, list[str]] = {}
_ROLES = ("viewer", "operator", "approver", "admin")  # gpusweep.roles.Role (not importable from settings)
for _group, _mapped in env_json_object("GPUSWEEP_OIDC_ROLE_MAP").items():
    _names = [_mapped] if isinstance(_mapped, str) else _mapped
    if not isinstance(_names, list) or not _names or any(name not in _ROLES for name in _names):
        raise ImproperlyConfigured(f"GPUSWEEP_OIDC_ROLE_MAP: group {_group!r} maps to {_mapped!r}; "
                                   f"give a role or a list of roles among {', '.join(_ROLES)}")
    GPUSWEEP_OIDC_ROLE_MAP[_group] = list(_names)
# A sign-in through the provider lasts this long (0: Django's session age, two weeks): the longest
# a group removed at the provider keeps its role in a session already open.
GPUSWEEP_OIDC_SESSION_S = env_int("GPUSWEEP_OIDC_SESSION_S", 8 * 3600, minimum=0)
# Read by mozilla-django-oidc (its setting names), set whether or not single sign-on is on.
OIDC_RP_CLIENT_ID = env_str("GPUSWEEP_OIDC_CLIENT_ID", "").strip()
OIDC_RP_CLIENT_SECRET = env_str("GPUSWEEP_OIDC_CLIENT_SECRET", "").strip()  # from the environment only
OIDC_RP_SCOPES = " ".join(env_str("GPUSWEEP_OIDC_SCOPES", "openid email profile").replace(",", " ").split())
OIDC_RP_SIGN_ALGO = env_str("GPUSWEEP_OIDC_SIGN_ALGO", "RS256").strip()
OIDC_TOKEN_USE_BASIC_AUTH = env_str("GPUSWEEP_OIDC_TOKEN_AUTH", "client_secret_basic").strip() != "client_secret_post"
OIDC_TIMEOUT = float(env_int("GPUSWEEP_OIDC_TIMEOUT_S", 10, minimum=1))
# A CA bundle (file) for a provider whose certificate the system does not trust; empty: the system's.
OIDC_VERIFY_SSL: bool | str = env_str("GPUSWEEP_OIDC_CA_BUNDLE", "").strip() or True
OIDC_USE_PKCE = True
OIDC_STORE_ID_TOKEN = True  # the hint sent to the provider's end_session_endpoint at logout
OIDC_AUTHENTICATION_CALLBACK_URL = "oidc-callback"
if GPUSWEEP_OIDC_ISSUER:
    if not OIDC_RP_CLIENT_ID or not OIDC_RP_CLIENT_SECRET:
        raise ImproperlyConfigured("GPUSWEEP_OIDC_ISSUER is set: set GPUSWEEP_OIDC_CLIENT_ID and "
                                   "GPUSWEEP_OIDC_CLIENT_SECRET too (the client registered at the provider)")
    if "openid" not in OIDC_RP_SCOPES.split():
        raise ImproperlyConfigured(f"GPUSWEEP_OIDC_SCOPES={OIDC_RP_SCOPES!r} must include openid")
    if env_str("GPUSWEEP_OIDC_TOKEN_AUTH", "client_secret_basic") not in ("client_secret_basic", "client_secret_post"):
        raise ImproperlyConfigured("GPUSWEEP_OIDC_TOKEN_AUTH must be client_secret_basic or client_secret_post")
# Local accounts (username and password). false: the login page shows only the provider's button,
# and every password is refused (the console's login, POST /api/v1/token/) except a superuser's on
# the admin site's own login page (/admin/login/): the way in when the provider is down.
GPUSWEEP_LOCAL_LOGIN = env_bool("GPUSWEEP_LOCAL_LOGIN", True)
if not GPUSWEEP_LOCAL_LOGIN and not GPUSWEEP_OIDC_ISSUER:
    raise ImproperlyConfigured("GPUSWEEP_LOCAL_LOGIN=false needs GPUSWEEP_OIDC_ISSUER: nobody could sign in")
AUTHENTICATION_BACKENDS = [
    "django.contrib.auth.backends.ModelBackend" if GPUSWEEP_LOCAL_LOGIN else "accounts.backends.BreakGlassBackend",
    *(["accounts.oidc.OidcBackend"] if GPUSWEEP_OIDC_ISSUER else []),
]

if not DEBUG:
    SESSION_COOKIE_SECURE = env_bool("SECURE_COOKIES", True)
    CSRF_COOKIE_SECURE = env_bool("SECURE_COOKIES", True)

# --- Cache ----------------------------------------------------------------------------
# Shared by every process when set (redis://host:6379/N): the console's fleet-wide figures are then
# computed once for all workers, and API list answers and token checks are cached until a table
# they read is written (gpusweep.responses). The database itself counts the writes (a trigger per
# table, gpusweep.datagen), so a process without this setting still invalidates; it only caches
# nothing itself (a per-process memory cache). Sessions live in the database, read through the
# cache while their table is unwritten (gpusweep.sessions): one deleted anywhere ends at once.
GPUSWEEP_CACHE_URL = env_str("GPUSWEEP_CACHE_URL", "") and env_url("GPUSWEEP_CACHE_URL", "",
                                                                  schemes={"redis", "rediss"})
if GPUSWEEP_CACHE_URL:
    CACHES = {"default": {"BACKEND": "gpusweep.cache.RedisCache", "LOCATION": GPUSWEEP_CACHE_URL,
                          "KEY_PREFIX": env_str("GPUSWEEP_CACHE_PREFIX", "gpusweep")}}
else:
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
SESSION_ENGINE = "gpusweep.sessions"
# The longest an answer is kept in the cache (its memory; a write of any kind invalidates it at
# the next request). 0 turns the answer cache off.
GPUSWEEP_RESPONSE_CACHE_S = env_int("GPUSWEEP_RESPONSE_CACHE_S", 300, minimum=0)
# Bounded staleness of cached list answers (gpusweep.responses): 0, the default, shows every write
# at the next request; S > 0 serves an answer written over for up to S seconds while one request
# recomputes it (fleets whose campaigns and heartbeats write the listed tables every second).
GPUSWEEP_ANSWER_STALE_S = env_int("GPUSWEEP_ANSWER_STALE_S", 0, minimum=0)

# --- Celery ---------------------------------------------------------------------------
CELERY_BROKER_URL = env_url(
    "CELERY_BROKER_URL",
    "filesystem://",
    schemes={"filesystem", "redis", "rediss", "amqp", "amqps", "pyamqp", "memory"},
)
if CELERY_BROKER_URL.startswith("filesystem://"):
    _broker_dir = VAR_DIR / "broker"
    for _sub in ("queue", "processed", "control"):
        (_broker_dir / _sub).mkdir(parents=True, exist_ok=True)
    CELERY_BROKER_TRANSPORT_OPTIONS: dict[str, object] = {
        "data_folder_in": str(_broker_dir / "queue"),
        "data_folder_out": str(_broker_dir / "queue"),
        "processed_folder": str(_broker_dir / "processed"),
        "control_folder": str(_broker_dir / "control"),
        "store_processed": False,
    }
else:
    CELERY_BROKER_TRANSPORT_OPTIONS = {}
# The database row is the source of truth for every long operation; results are not stored.
CELERY_RESULT_BACKEND = None
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
# When the broker goes away mid-task, the task is cancelled and its message redelivered instead
# of being acked over a dead connection (which crashed the worker in tests of a Redis restart);
# the engine's leases and idempotent operations make the redelivery harmless.
CELERY_WORKER_CANCEL_LONG_RUNNING_TASKS_ON_CONNECTION_LOSS = True
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_BEAT_SCHEDULER = "django_celery_beat.schedulers:DatabaseScheduler"
CELERY_TIMEZONE = TIME_ZONE
CELERY_TASK_ALWAYS_EAGER = env_bool("CELERY_TASK_ALWAYS_EAGER", False)
# One queue per deployment sharing a broker (tests use a private one per run).
CELERY_TASK_DEFAULT_QUEUE = env_str("GPUSWEEP_CELERY_QUEUE", "celery")

# --- REST API -------------------------------------------------------------------------
# The user an API token in an "Authorization" header names, for the download pages that take one
# (gpusweep.middleware.accepts_token); named here so that the core imports no app.
GPUSWEEP_TOKEN_USER = "accounts.authentication.user_for_header"
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        # "Authorization: Bearer <key>" or "Token <key>": named tokens (accounts), DRF's own still accepted.
        # First, so a refused request answers 401 with its WWW-Authenticate challenge.
        "accounts.authentication.ApiTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["gpusweep.roles.RolePermission"],
    # DRF's JSON written by orjson (gpusweep/renderers.py); the browsable API as DRF has it.
    "DEFAULT_RENDERER_CLASSES": ["gpusweep.renderers.JSONRenderer", "rest_framework.renderers.BrowsableAPIRenderer"],
    # Bounded input everywhere (gpusweep/parsers.py, filters.py, pagination.py) and one error
    # format for every error (gpusweep/errors.py).
    "DEFAULT_PARSER_CLASSES": [
        "gpusweep.parsers.JSONParser",
        "gpusweep.parsers.EmptyFormParser",
        "gpusweep.parsers.EmptyMultiPartParser",
    ],
    "DEFAULT_FILTER_BACKENDS": [
        "gpusweep.filters.FilterBackend",
        "gpusweep.filters.SearchFilter",
        "gpusweep.filters.OrderingFilter",
    ],
    "DEFAULT_PAGINATION_CLASS": "gpusweep.pagination.BoundedLimitOffsetPagination",
    "PAGE_SIZE": 100,
    "EXCEPTION_HANDLER": "gpusweep.errors.exception_handler",
    "DEFAULT_SCHEMA_CLASS": "gpusweep.schema.AutoSchema",
}
# The largest request body the API reads (Django's setting; the API answers 413 above it).
DATA_UPLOAD_MAX_MEMORY_SIZE = env_int("GPUSWEEP_API_MAX_BODY_KB", 2560, minimum=64) * 1024
SPECTACULAR_SETTINGS = {
    "TITLE": "gpusweep API",
    "DESCRIPTION": "GPU fleet patching on the security team's calendar. Errors: "
                   '{"detail": "...", "errors": {"field": ["..."]}} (errors only for refused fields).',
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    # The schema and its docs page need a login with a role, like every other read.
    "SERVE_PERMISSIONS": ["gpusweep.roles.RolePermission"],
    "COMPONENT_SPLIT_REQUEST": True,
    # Request bodies are JSON (form bodies only when empty: gpusweep/parsers.py).
    "PARSER_WHITELIST": ["gpusweep.parsers.JSONParser"],
    # Swagger UI from the project's own static files (drf-spectacular-sidecar): no CDN, works offline.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # Fields named "policy" in several serializers: one enum, named after its one choice set.
    # Each webhook event's body as a component (webhooks/schemas.py), after the default enum hook.
    "POSTPROCESSING_HOOKS": ["drf_spectacular.hooks.postprocess_schema_enums", "webhooks.schemas.add_to_openapi"],
    "ENUM_NAME_OVERRIDES": {"WorkloadPolicyEnum": "inventory.choices.WorkloadPolicy.choices",
                            "WebhookEventTypeEnum": "webhooks.choices.EventType.choices"},
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO")},
}

# --- gpusweep's own settings ----------------------------------------------------------
GPUSWEEP_READYZ_PING_TIMEOUT = float(env_int("GPUSWEEP_READYZ_PING_TIMEOUT_MS", 2000, minimum=1)) / 1000
GPUSWEEP_SHARED_DATA_DIR = Path(env_str("GPUSWEEP_SHARED_DATA_DIR", str(BASE_DIR.parent / "shared" / "data")))

# --- inventory --------------------------------------------------------------------------
# Node keys for agents are derived from this secret (agent/src/gpusweep_agent/auth.py). In DEBUG it
# is generated once under var/ (so the demo fleet works with no configuration); in production it
# must come from the environment, and empty means agent heartbeats are refused.
GPUSWEEP_AGENT_FLEET_SECRET = persistent_secret(VAR_DIR, "GPUSWEEP_AGENT_FLEET_SECRET", generate=DEBUG)
# The Ed25519 key that signs evidence heads (campaigns.signing): GPUSWEEP_EVIDENCE_KEY inline, or
# this file; in DEBUG generated under var/ when absent. Never in the database.
GPUSWEEP_EVIDENCE_KEY_FILE = env_str(
    "GPUSWEEP_EVIDENCE_KEY_FILE", str(VAR_DIR / "evidence-signing-key.pem") if DEBUG else "")
GPUSWEEP_EVIDENCE_KEY_GENERATE = DEBUG
# Every seal and signed node head is also appended here, outside the database (campaigns.digests).
# Where a pod's service account token and CA are mounted (the in-cluster Kubernetes configuration).
GPUSWEEP_KUBE_SERVICE_ACCOUNT_DIR = Path(env_str("GPUSWEEP_KUBE_SERVICE_ACCOUNT_DIR",
                                                 "/var/run/secrets/kubernetes.io/serviceaccount"))
GPUSWEEP_EVIDENCE_DIGEST_DIR = Path(env_str("GPUSWEEP_EVIDENCE_DIGEST_DIR", str(VAR_DIR / "evidence-digests")))
GPUSWEEP_EVIDENCE_DIGEST_STORE = env_str("GPUSWEEP_EVIDENCE_DIGEST_STORE", "")
# campaigns.digests.ObjectLockStore as the store: one object per digest in this S3 bucket (created with
# Object Lock), each kept RETENTION_DAYS (7 years by default) in RETENTION_MODE (COMPLIANCE: nobody can
# delete it or shorten that; GOVERNANCE: those granted s3:BypassGovernanceRetention can). ENDPOINT_URL
# names an S3-compatible store (empty: AWS). Credentials and region only from boto3's own chain (AWS_*
# variables, a profile, an instance or pod role), never here.
GPUSWEEP_EVIDENCE_DIGEST_BUCKET = env_str("GPUSWEEP_EVIDENCE_DIGEST_BUCKET", "")
GPUSWEEP_EVIDENCE_DIGEST_ENDPOINT_URL = env_str("GPUSWEEP_EVIDENCE_DIGEST_ENDPOINT_URL", "").strip()
if GPUSWEEP_EVIDENCE_DIGEST_ENDPOINT_URL and urlsplit(GPUSWEEP_EVIDENCE_DIGEST_ENDPOINT_URL).scheme not in (
        "http", "https"):
    raise ImproperlyConfigured(f"GPUSWEEP_EVIDENCE_DIGEST_ENDPOINT_URL={GPUSWEEP_EVIDENCE_DIGEST_ENDPOINT_URL!r}: "
                               "an http:// or https:// URL (or empty for AWS)")
GPUSWEEP_EVIDENCE_DIGEST_PREFIX = env_str("GPUSWEEP_EVIDENCE_DIGEST_PREFIX", "")
GPUSWEEP_EVIDENCE_DIGEST_RETENTION_DAYS = env_int("GPUSWEEP_EVIDENCE_DIGEST_RETENTION_DAYS", 2557, minimum=1)
GPUSWEEP_EVIDENCE_DIGEST_RETENTION_MODE = env_str("GPUSWEEP_EVIDENCE_DIGEST_RETENTION_MODE", "COMPLIANCE").upper()
if GPUSWEEP_EVIDENCE_DIGEST_RETENTION_MODE not in ("COMPLIANCE", "GOVERNANCE"):
    raise ImproperlyConfigured(f"GPUSWEEP_EVIDENCE_DIGEST_RETENTION_MODE={GPUSWEEP_EVIDENCE_DIGEST_RETENTION_MODE!r}: "
                               "COMPLIANCE or GOVERNANCE")
# A webhook's authorization_env or a cluster's secret_env may name only variables with one of these
# prefixes, never one of the service's own settings (gpusweep.secret_env).
GPUSWEEP_SECRET_ENV_PREFIXES = env_list("GPUSWEEP_SECRET_ENV_PREFIXES", ["GPUSWEEP_SECRET_"])
GPUSWEEP_IMPORT_MAX_BYTES = env_int("GPUSWEEP_IMPORT_MAX_MB", 100, minimum=1) * 1024 * 1024
GPUSWEEP_SLURM_TIMEOUT_S = float(env_int("GPUSWEEP_SLURM_TIMEOUT_S", 30, minimum=1))
GPUSWEEP_AGENT_HEARTBEAT_S = env_int("GPUSWEEP_AGENT_HEARTBEAT_S", 30, minimum=5)
# A full sync refreshes Node.last_seen only when it is older than this (saves rewriting the table).
GPUSWEEP_LAST_SEEN_RESOLUTION_S = env_int("GPUSWEEP_LAST_SEEN_RESOLUTION_S", 600, minimum=0)
# Heartbeat counters and last_seen of unchanged heartbeats go through Redis and reach the database
# in batches, within this many seconds (inventory/heartbeats.py). Empty URL: written per heartbeat.
GPUSWEEP_HEARTBEAT_REDIS_URL = env_str(
    "GPUSWEEP_HEARTBEAT_REDIS_URL", CELERY_BROKER_URL if CELERY_BROKER_URL.startswith(("redis", "rediss")) else "")
GPUSWEEP_HEARTBEAT_FLUSH_S = float(env_int("GPUSWEEP_HEARTBEAT_FLUSH_S", 10, minimum=1))

# --- metrics ----------------------------------------------------------------------------
# /metrics answers only a scraper sending "Authorization: Bearer <this>"; empty turns it off.
GPUSWEEP_METRICS_TOKEN = env_str("GPUSWEEP_METRICS_TOKEN", "")
if GPUSWEEP_METRICS_TOKEN and len(GPUSWEEP_METRICS_TOKEN) < 32:
    raise ImproperlyConfigured("GPUSWEEP_METRICS_TOKEN must be at least 32 characters (or empty to turn /metrics off)")
# Evidence events a scrape folds at most (the rest at the next one), and how long finished campaigns stay.
GPUSWEEP_METRICS_FOLD_BATCH = env_int("GPUSWEEP_METRICS_FOLD_BATCH", 5000, minimum=100)
GPUSWEEP_METRICS_FINISHED_CAMPAIGNS_S = env_int("GPUSWEEP_METRICS_FINISHED_CAMPAIGNS_S", 86400, minimum=0)
# "app_label.Model:field" of the webhook delivery log; empty tries webhooks.Delivery / WebhookDelivery.
GPUSWEEP_METRICS_WEBHOOK_DELIVERIES = env_str("GPUSWEEP_METRICS_WEBHOOK_DELIVERIES", "")

# --- webhooks ---------------------------------------------------------------------------
GPUSWEEP_WEBHOOK_TIMEOUT_S = float(env_int("GPUSWEEP_WEBHOOK_TIMEOUT_S", 10, minimum=1))
# A failed delivery is retried after BACKOFF, 2x, 4x ... (capped at an hour) up to MAX_ATTEMPTS tries in all.
GPUSWEEP_WEBHOOK_BACKOFF_MS = env_int("GPUSWEEP_WEBHOOK_BACKOFF_MS", 10000, minimum=1)
GPUSWEEP_WEBHOOK_MAX_ATTEMPTS = env_int("GPUSWEEP_WEBHOOK_MAX_ATTEMPTS", 8, minimum=1)
GPUSWEEP_WEBHOOK_DUE_SOON_DAYS = env_int("GPUSWEEP_WEBHOOK_DUE_SOON_DAYS", 7, minimum=1)
# Where people open the console: webhook bodies link back with absolute URLs under it (no trailing slash).
GPUSWEEP_BASE_URL = env_url("GPUSWEEP_BASE_URL", "http://127.0.0.1:8000", schemes={"http", "https"}).rstrip("/")

# --- advisories -------------------------------------------------------------------------
# Named advisory sources: GPUSWEEP_ADVISORY_SOURCES="nvidia=github:https://raw...|https://github.com/...atom,
# index=index:https://www.nvidia.com/.../product-security.json". Default: the local mirror.
GPUSWEEP_ADVISORY_SOURCES: dict[str, str] = dict(
    item.split("=", 1)
    for item in env_list(
        "GPUSWEEP_ADVISORY_SOURCES", [f"local-mirror={GPUSWEEP_SHARED_DATA_DIR / 'nvidia-csaf'}"]
    )
    if "=" in item
)
GPUSWEEP_ADVISORY_HTTP_TIMEOUT = float(env_int("GPUSWEEP_ADVISORY_HTTP_TIMEOUT_S", 20, minimum=1))
GPUSWEEP_ADVISORY_MAX_BYTES = env_int("GPUSWEEP_ADVISORY_MAX_BYTES", 20 * 1024 * 1024, minimum=1024)
# Who publishes the fleet's CSAF VEX documents: document.publisher.namespace (a URI naming the site).
GPUSWEEP_VEX_PUBLISHER = env_str("GPUSWEEP_VEX_PUBLISHER", "gpusweep")
GPUSWEEP_VEX_NAMESPACE = env_url("GPUSWEEP_VEX_NAMESPACE", "https://gpusweep.invalid", schemes={"https", "http"})
# Seeded into django-celery-beat's tables by its DatabaseScheduler; editable in the admin.
CELERY_BEAT_SCHEDULE = {
    "advisories-ingest": {
        "task": "advisories.tasks.ingest_configured_sources",
        "schedule": float(env_int("GPUSWEEP_ADVISORY_INGEST_EVERY_S", 3600, minimum=60)),
    },
    # Re-drives campaign steps whose deadline passed (a killed worker only delays a campaign).
    "campaigns-redrive": {
        "task": "campaigns.redrive",
        "schedule": float(env_int("GPUSWEEP_CAMPAIGN_REDRIVE_EVERY_S", 30, minimum=1)),
    },
    # Webhooks: re-enqueues due deliveries (a lost message) and emits overdue/due-soon events.
    "webhooks-scan": {
        "task": "webhooks.scan",
        "schedule": float(env_int("GPUSWEEP_WEBHOOK_SCAN_EVERY_S", 300, minimum=10)),
    },
    # Writes heartbeats accepted since the last flush when no web process did (inventory/heartbeats.py).
    "inventory-heartbeat-flush": {
        "task": "inventory.tasks.flush_heartbeats",
        "schedule": GPUSWEEP_HEARTBEAT_FLUSH_S,
    },
    # Syncs every enabled Slurm/Kubernetes cluster (one task per cluster, by id).
    "inventory-sync": {
        "task": "inventory.tasks.sync_all_clusters",
        "schedule": float(env_int("GPUSWEEP_INVENTORY_SYNC_EVERY_S", 300, minimum=5)),
    },
}
# How old the console's fleet-wide figures (overview, exposed counts per advisory) may be, in seconds.
GPUSWEEP_CONSOLE_FIGURES_S = env_int("GPUSWEEP_CONSOLE_FIGURES_S", 30, minimum=0)
