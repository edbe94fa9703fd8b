"""Settings tree (pydantic-settings, env prefix ``COSIGNER_``, nested with ``__``).

Nothing here is created at import time: :func:`get_settings` builds a fresh
:class:`Settings` from the environment, and ``create_app(settings)`` receives it.
Invalid values refuse to start (pydantic validation error), never fall back open.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class WebhookTarget(BaseModel):
    """One receiver of approval notifications; ``secret`` keys the HMAC-SHA256 signature."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: str = Field(pattern=r"^https?://", max_length=2048)
    secret: SecretStr = Field(min_length=16)


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
    key_dir: Path = Path("var/keys")
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
    #: Group commit of decisions: at most this many per transaction, and the longest a
    #: first decision waits for others to join its batch (ms).
    log_batch_max: int = Field(default=64, ge=1, le=1000)
    log_batch_wait_ms: float = Field(default=1.0, ge=0, le=100)
    #: SQLite: how long a write waits for the database lock before it fails (503, deny).
    db_busy_timeout_ms: int = Field(default=10_000, ge=100, le=600_000)
    #: How often each replica polls the stored policy state (active/shadow versions); an
    #: activation on one replica decides on the others within about this long.
    policy_poll_interval_ms: int = Field(default=1000, ge=50, le=60_000)
    session_idle_timeout_s: int = Field(default=1800, ge=60)
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    #: Outgoing approval webhooks per tenant (``"*"``: every tenant), e.g.
    #: ``COSIGNER_WEBHOOKS='{"acme": [{"url": "https://hooks.example/x", "secret": "..."}]}'``.
    webhooks: dict[str, list[WebhookTarget]] = Field(default_factory=dict)

    @field_validator("database_url")
    @classmethod
    def _supported_database(cls, value: str) -> str:
        if not value.startswith(("sqlite+aiosqlite://", "postgresql+asyncpg://")):
            raise ValueError("database_url must be sqlite+aiosqlite:// or postgresql+asyncpg://")
        return value


def get_settings() -> Settings:
    """Build settings from the environment (``COSIGNER_*``); raises on invalid values."""
    return Settings()
