"""Settings tree (pydantic-settings, env prefix ``COSIGNER_``, nested with ``__``).

Nothing here is created at import time: :func:`get_settings` builds a fresh
:class:`Settings` from the environment, and ``create_app(settings)`` receives it.
Invalid values refuse to start (pydantic validation error), never fall back open.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from cosigner.core.roles import is_approver_role


class WebhookTarget(BaseModel):
    """One receiver of approval notifications; ``secret`` keys the HMAC-SHA256 signature."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: str = Field(pattern=r"^https?://", max_length=2048)
    secret: SecretStr = Field(min_length=16)


class SlackWorkspace(BaseModel):
    """One tenant's Slack app (README § Slack approvals): where its approval requests are
    posted, and the secrets that authenticate both directions.

    ``bot_token``: the app's bot token (``xoxb-...``, scope ``chat:write``) for the Web API;
    ``signing_secret``: the app's signing secret, which keys Slack's ``v0`` request
    signatures on the interactivity endpoint; ``team_id``: the workspace (``T...``) whose
    clicks count for this tenant; ``channel``: the channel id (``C...``) or name new
    requests are posted to (the app must be a member).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    bot_token: SecretStr = Field(min_length=8)
    signing_secret: SecretStr = Field(min_length=8)
    team_id: str = Field(pattern=r"^[A-Z0-9]{2,32}$")
    channel: str = Field(min_length=1, max_length=80)


class RateLimits(BaseModel):
    """Limits and quotas of one tenant (``0``: no limit). Per replica: each process counts
    in its own memory (README § Rate limits), so N replicas admit up to N times these.

    ``*_per_s`` is the sustained rate, counted over 10 s; ``*_burst`` the most requests in
    any one second. Both must hold, so a credential may send ``burst`` at once, then
    ``per_s`` on average.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    credential_per_s: int = Field(default=500, ge=0)
    credential_burst: int = Field(default=1000, ge=0)
    tenant_per_s: int = Field(default=1000, ge=0)
    tenant_burst: int = Field(default=2000, ge=0)
    decisions_per_min: int = Field(default=60_000, ge=0)
    approvals_per_min: int = Field(default=1200, ge=0)


#: Issuers over plain http are accepted only on these hosts (tests, a local IdP); OpenID
#: Connect Discovery 1.0 §3 requires https everywhere else.
_LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]")


class OidcProvider(BaseModel):
    """One tenant's OpenID provider (README § Single sign-on).

    ``issuer`` is compared exactly with the ID token's ``iss`` and its discovery document
    (``{issuer}/.well-known/openid-configuration``). ``role_map`` maps each value of the
    ``roles_claim`` claim (a string or a list of strings) to Cosigner approver roles; the
    roles of a principal signed in this way are replaced by the mapped roles at every
    sign-in. ``acr_values`` is the provider's ``acr`` values ordered weakest first (a
    requirement's ``min_acr`` is met by that value or any later one); ``mfa_acr_values``
    are the ``acr`` values that count as multi-factor (besides the RFC 8176 ``amr`` values
    :data:`cosigner.approvals.stepup.MFA_AMR`). ``leeway_s``: clock skew allowed on
    ``exp``/``iat``/``auth_time``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    issuer: str = Field(max_length=512)
    client_id: str = Field(min_length=1, max_length=256)
    client_secret: SecretStr = Field(min_length=1)
    scopes: list[str] = Field(default_factory=lambda: ["openid", "profile"])
    roles_claim: str = Field(default="groups", min_length=1, max_length=128)
    role_map: dict[str, list[str]] = Field(min_length=1)
    allow_passwords: bool = True
    label: str = Field(default="single sign-on", min_length=1, max_length=80)
    acr_values: list[str] = Field(default_factory=list)
    mfa_acr_values: list[str] = Field(default_factory=list)
    leeway_s: int = Field(default=60, ge=0, le=600)

    @field_validator("issuer")
    @classmethod
    def _issuer_is_https(cls, value: str) -> str:
        plain = value.startswith("http://") and value[7:].split("/")[0].rsplit(
            ":", 1)[0] in _LOOPBACK_HOSTS
        if not (value.startswith("https://") or plain) or "#" in value or "?" in value:
            raise ValueError("oidc issuer must be an https URL without query or fragment "
                             "(http only on a loopback host)")
        return value

    @field_validator("scopes")
    @classmethod
    def _has_openid(cls, value: list[str]) -> list[str]:
        if "openid" not in value or any(not s or " " in s for s in value):
            raise ValueError("oidc scopes must include openid (one scope per entry)")
        return value

    @field_validator("role_map")
    @classmethod
    def _approver_roles(cls, value: dict[str, list[str]]) -> dict[str, list[str]]:
        for claim_value, roles in value.items():
            if not roles or not all(is_approver_role(r) for r in roles):
                raise ValueError(f"oidc role_map[{claim_value!r}] must list approver roles "
                                 "(not runtime, auditor, admin, operator, barrier, "
                                 "breakglass)")
        return value


class Settings(BaseSettings):
    """Every setting of one Cosigner process.

    Units are in the field names (``_ms``, ``_s``, ``_bytes``); times are UTC.
    """

    model_config = SettingsConfigDict(
        env_prefix="COSIGNER_", env_nested_delimiter="__", extra="forbid", frozen=True
    )

    database_url: str = "sqlite+aiosqlite:///./var/cosigner.db"
    #: Folders scanned for policy bundles (Python-rule and Rego bundles alike).
    bundle_dirs: list[Path] = Field(default_factory=lambda: [Path("policies"), Path("rego")])
    #: Key files of older versions (imported into the database once) and, without
    #: ``key_encryption_key``, the generated key-encryption key file (one process only).
    key_dir: Path = Path("var/keys")
    #: Key-encryption key of the signing keys stored in the database: 32 random bytes,
    #: base64url (``python -c "import secrets; print(secrets.token_urlsafe(32))"``).
    #: Every replica needs the same one.
    key_encryption_key: SecretStr | None = None
    #: How often each replica reads the shared state generations (signing keys, disabled
    #: credentials) from the database; a change is followed within this plus one query.
    replica_poll_s: float = Field(default=0.5, gt=0, le=10)
    #: A rotated-in key is published at once and signs only this long after the rotation,
    #: so every replica publishes it first (must exceed ``replica_poll_s``).
    key_activation_delay_s: float = Field(default=2.0, ge=0, le=3600)
    #: JWS ``alg`` of signing keys created from now on (the first key, each rotation):
    #: ``Ed25519`` (RFC 9864) or ``EdDSA`` (RFC 8037, for executors whose JOSE library
    #: lacks ``Ed25519``, e.g. PyJWT). Each key keeps the alg it was created with; the JWKS
    #: publishes it, and a token is accepted only under its key's own alg.
    signing_alg: Literal["Ed25519", "EdDSA"] = "Ed25519"
    max_body_bytes: int = Field(default=256 * 1024, ge=1024, le=64 * 1024 * 1024)
    issuer: str = "cosigner"
    audience: str = "cosigner-executor"
    #: Lifetime of a permit minted for a plain ``allow`` decision.
    permit_ttl_s: int = Field(default=300, ge=1, le=86_400)
    #: Longest a permit may live; old public keys stay in the JWKS this long after rotation.
    max_permit_ttl_s: int = Field(default=30 * 86_400, ge=60)
    #: Base URL used to build review links (``review_url``) in responses and webhooks.
    public_url: str = "http://127.0.0.1:8080"
    #: Remote OPA (engine = "opa" bundles): base URL and timeout.
    opa_url: str = "http://127.0.0.1:8181"
    opa_timeout_ms: int = Field(default=500, ge=1, le=60_000)
    #: Signed audit checkpoint every N events or T seconds, whichever first.
    checkpoint_every_events: int = Field(default=1000, ge=1)
    checkpoint_every_s: int = Field(default=300, ge=1)
    #: Sweep interval for expiring approvals and permits.
    sweep_every_s: float = Field(default=5.0, gt=0)
    #: Shortest reason (characters, after trimming) a break-glass authorisation accepts.
    break_glass_min_reason_chars: int = Field(default=20, ge=1, le=2000)
    #: Group commit of decisions: at most this many per transaction, and the longest a
    #: first decision waits for others to join its batch (ms) — only while other writes
    #: are in flight; a lone decision commits at once (cosigner.db.group_commit).
    log_batch_max: int = Field(default=64, ge=1, le=1000)
    log_batch_wait_ms: float = Field(default=1.0, ge=0, le=100)
    #: SQLite: how long a write waits for the database lock before it fails (503, deny).
    db_busy_timeout_ms: int = Field(default=10_000, ge=100, le=600_000)
    #: How often each replica polls the stored policy state (active/shadow versions); an
    #: activation on one replica decides on the others within about this long.
    policy_poll_interval_ms: int = Field(default=1000, ge=50, le=60_000)
    session_idle_timeout_s: int = Field(default=1800, ge=60)
    #: An approver web session ends this long after its sign-in, however active: the
    #: roles a single sign-on gave are confirmed again at the provider.
    session_max_age_s: int = Field(default=43_200, ge=60)
    #: Locale of the approver pages' amounts and numbers (a CLDR identifier: ``en_US``,
    #: ``de_DE``, ``en-GB``); with ``ui_locale_from_browser`` the browser's
    #: ``Accept-Language`` wins when CLDR knows the locale it names.
    ui_locale: str = "en_US"
    ui_locale_from_browser: bool = True
    #: Peers whose ``X-Forwarded-For/-Proto/-Host`` count (IP addresses or CIDR networks,
    #: comma-separated in the environment). Default: none, not even loopback; then the
    #: client address is the TCP peer. ``cosigner serve --forwarded-allow-ips`` overrides it.
    forwarded_allow_ips: Annotated[list[str], NoDecode] = Field(default_factory=list)
    #: Sign-in limits (:class:`cosigner.identity.accounts.SigninLimits`): failures of one
    #: account name (any address) before its back-off lock, failures from one address (any names)
    #: before its lock, the counting window, the longest lock, and the first back-off.
    signin_account_limit: int = Field(default=5, ge=1, le=1000)
    signin_address_limit: int = Field(default=50, ge=2, le=100_000)
    signin_window_s: int = Field(default=15 * 60, ge=1)
    signin_lockout_s: int = Field(default=15 * 60, ge=1)
    signin_backoff_s: int = Field(default=30, ge=1)
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    #: ``cosigner serve`` log lines: JSON objects (default) or plain text.
    log_format: Literal["json", "plain"] = "json"
    #: One ``cosigner.access`` line per HTTP request (method, path, status, ms).
    access_log: bool = False
    #: Bearer token of ``GET /metrics``; unset, the route is off (404).
    metrics_token: SecretStr | None = Field(default=None, min_length=16)
    #: Serve ``GET /metrics`` without a token on this separate port instead (bind it to an
    #: address only the scraper reaches: ``metrics_host``). Workers share it (SO_REUSEPORT).
    metrics_port: int | None = Field(default=None, ge=1, le=65535)
    metrics_host: str = "127.0.0.1"
    #: Outgoing approval webhooks per tenant (``"*"``: every tenant), e.g.
    #: ``COSIGNER_WEBHOOKS='{"acme": [{"url": "https://hooks.example/x", "secret": "..."}]}'``.
    webhooks: dict[str, list[WebhookTarget]] = Field(default_factory=dict)
    #: Slack approvals per tenant (:class:`SlackWorkspace`), e.g. ``COSIGNER_SLACK='{"acme":
    #: {"bot_token": "xoxb-...", "signing_secret": "...", "team_id": "T0123",
    #: "channel": "C0456"}}'``. A workspace serves one tenant.
    slack: dict[str, SlackWorkspace] = Field(default_factory=dict)
    #: Base URL of the Slack Web API (the SDK's ``base_url``; tests point it at a stand-in).
    slack_api_url: str = Field(default="https://slack.com/api/", pattern=r"^https?://\S+/$")
    #: Lifetime of a one-time Slack link URL (s), and how often Slack messages are synced.
    slack_link_ttl_s: int = Field(default=600, ge=60, le=86_400)
    slack_poll_s: float = Field(default=2.0, gt=0, le=60)
    #: A Slack click acts only for a person whose last web sign-in (single sign-on or
    #: password) is younger than this (s); older, they are sent to sign in again, which
    #: confirms their roles at the provider. Default: ``session_max_age_s``.
    slack_signin_max_age_s: int | None = Field(default=None, ge=60)

    #: Single sign-on per tenant (:class:`OidcProvider`), e.g.
    #: ``COSIGNER_OIDC='{"acme": {"issuer": "https://idp.example", "client_id": "cosigner",
    #: "client_secret": "...", "role_map": {"finance-approvers": ["finance"]}}}'``.
    oidc: dict[str, OidcProvider] = Field(default_factory=dict)
    #: How long a started single sign-on may take before its callback is refused (s).
    oidc_login_ttl_s: int = Field(default=600, ge=30, le=3600)
    #: Unfinished single sign-ons one client address (an IPv6 address by its /64) may have
    #: within ``oidc_login_ttl_s``; past it ``/ui/oidc/start`` answers 429.
    oidc_pending_per_address_max: int = Field(default=30, ge=1, le=100_000)

    #: Rate limits and quotas per tenant (``"*"``: every tenant without its own entry),
    #: e.g. ``COSIGNER_RATE_LIMITS='{"*": {"tenant_per_s": 200}, "acme": {...}}'``.
    rate_limits: dict[str, RateLimits] = Field(default_factory=lambda: {"*": RateLimits()})
    #: Refusals by a rate limit are logged aggregated: per credential and limit, at most
    #: the first refusal of each window of this length plus one count for the window.
    rate_limit_log_window_s: int = Field(default=60, ge=1, le=3600)
    #: Bounds of the queues (past them: 503 ``overloaded`` with ``Retry-After``, at once).
    #: Decision-log writer: items queued in all, and per tenant (default: half of it).
    log_queue_max: int = Field(default=4096, ge=1, le=1_000_000)
    log_queue_per_tenant_max: int | None = Field(default=None, ge=1)
    #: Refused-redeem writer: items queued in all.
    refusal_queue_max: int = Field(default=4096, ge=1, le=1_000_000)
    #: Long-polls (``GET /v1/approvals/{id}?wait=``) open at once per credential.
    long_polls_per_credential: int = Field(default=16, ge=1, le=10_000)
    #: Undelivered webhook deliveries per tenant; past it no approval request opens.
    webhook_backlog_max: int = Field(default=10_000, ge=1)
    #: ``/readyz`` answers 503 for this long after any queue shed work; ``Retry-After`` (s).
    overload_hold_s: float = Field(default=2.0, ge=0, le=60)
    overload_retry_after_s: int = Field(default=1, ge=1, le=300)

    @field_validator("forwarded_allow_ips", mode="before")
    @classmethod
    def _trusted_proxies(cls, value: Any) -> list[str]:
        return parse_forwarded_allow_ips(value)

    @field_validator("signin_address_limit")
    @classmethod
    def _address_above_account(cls, value: int, info: Any) -> int:
        account = info.data.get("signin_account_limit")
        if account is not None and value <= account:
            raise ValueError("signin_address_limit must exceed signin_account_limit, so a "
                             "flood on one name never locks its address")
        return value

    @field_validator("slack")
    @classmethod
    def _one_tenant_per_workspace(cls, value: dict[str, SlackWorkspace]
                                  ) -> dict[str, SlackWorkspace]:
        teams = [workspace.team_id for workspace in value.values()]
        if len(teams) != len(set(teams)):
            raise ValueError("slack: a Slack workspace (team_id) serves one tenant only")
        return value

    @field_validator("key_encryption_key")
    @classmethod
    def _kek_is_32_bytes(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None:
            decode_kek(value.get_secret_value())
        return value

    @property
    def slack_signin_max_age(self) -> int:
        """``slack_signin_max_age_s``, or ``session_max_age_s`` when unset (s)."""
        return self.slack_signin_max_age_s or self.session_max_age_s

    @model_validator(mode="after")
    def _activation_after_poll(self) -> Settings:
        if 0 < self.key_activation_delay_s <= self.replica_poll_s:
            raise ValueError("key_activation_delay_s must exceed replica_poll_s (or be 0 "
                             "for a single process)")
        return self

    @field_validator("ui_locale")
    @classmethod
    def _known_locale(cls, value: str) -> str:
        from babel import Locale, UnknownLocaleError

        try:
            return str(Locale.parse(value.replace("-", "_")))
        except (UnknownLocaleError, ValueError) as exc:
            raise ValueError(f"unknown locale {value!r} (a CLDR id such as en_US)") from exc

    @field_validator("database_url")
    @classmethod
    def _supported_database(cls, value: str) -> str:
        if not value.startswith(("sqlite+aiosqlite://", "postgresql+asyncpg://")):
            raise ValueError("database_url must be sqlite+aiosqlite:// or postgresql+asyncpg://")
        return value


def parse_forwarded_allow_ips(value: Any) -> list[str]:
    """Trusted proxies as normalised networks (``"10.0.0.1, 10.1.0.0/16"`` or a list).

    Raises:
        ValueError: an entry that is not an IP address or network (``"*"`` included:
            trusting every peer would let anyone choose their address).
    """
    if value is None:
        return []
    items = value.split(",") if isinstance(value, str) else list(value)
    networks: list[str] = []
    for item in items:
        text = str(item).strip()
        if not text:
            continue
        try:
            networks.append(str(ipaddress.ip_network(text, strict=False)))
        except ValueError:
            raise ValueError(f"forwarded_allow_ips: {text!r} is not an IP address or "
                             "network") from None
    return networks


def decode_kek(text: str) -> bytes:
    """The 32 bytes of a base64url key-encryption key (padding optional); ValueError
    otherwise (the message never contains the value)."""
    stripped = text.strip()
    try:
        raw = base64.urlsafe_b64decode(stripped + "=" * (-len(stripped) % 4))
    except (binascii.Error, ValueError):
        raw = b""
    if len(raw) != 32 or not re.fullmatch(r"[A-Za-z0-9_-]+=*", stripped):
        raise ValueError("key_encryption_key must be 32 bytes, base64url-encoded")
    return raw


def get_settings() -> Settings:
    """Build settings from the environment (``COSIGNER_*``); raises on invalid values."""
    return Settings()
