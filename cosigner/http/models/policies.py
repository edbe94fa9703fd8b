"""Wire models of policy administration, v1."""

from __future__ import annotations

from pydantic import Field

from cosigner.http.models.decisions import Wire


class ActivateV1(Wire):
    """Make a loaded version of a bundle the active one."""

    version: str = Field(min_length=1, max_length=64)


class ShadowV1(Wire):
    """Evaluate a loaded version beside the active one (``null`` stops shadowing)."""

    version: str | None = Field(max_length=64, description="null stops shadowing")


class ReplayV1(Wire):
    """Evaluate a candidate version on the stored inputs of logged decisions."""

    version: str = Field(min_length=1, max_length=64, description="the candidate: a "
                         "loaded version of this bundle")
    tenant: str | None = Field(default=None, max_length=128,
                               description="whose log (system operators only; a tenant "
                               "admin replays their own)")
    since: str | None = Field(default=None, max_length=64,
                              description="inclusive, RFC 3339 (UTC when no offset)")
    until: str | None = Field(default=None, max_length=64,
                              description="exclusive, RFC 3339 (UTC when no offset)")
