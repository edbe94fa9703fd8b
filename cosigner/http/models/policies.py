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
