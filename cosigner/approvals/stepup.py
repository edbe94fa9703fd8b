"""Step-up: whether a reviewer's sign-in is strong and fresh enough for a stage (pure).

A stage of an approval requirement may ask (:class:`cosigner.policy.result.ApprovalRequirement`):

* ``assurance: "mfa"`` — met by an OpenID Connect sign-in whose ``amr`` (RFC 8176) holds
  one of :data:`MFA_AMR`, or whose ``acr`` is one of the tenant's ``mfa_acr_values``;
* ``min_acr`` — met by an ``acr`` at or after ``min_acr`` in the tenant's ``acr_values``,
  an ordered list (weakest first). An ``acr`` not in the list, or a ``min_acr`` not in it,
  never meets it (fail closed);
* ``max_auth_age_s`` — met when ``auth_time`` is known and ``now - auth_time`` is at most
  that many seconds.

Only a web session signed in through the tenant's OpenID provider (``authn.method ==
"oidc"``) can meet any of them: an API key, a local password or a Slack click never does,
so a stage asking for step-up can be reviewed only in the pages after an OIDC sign-in.
Step-up applies to approvals and rejections alike (a rejection also decides the request).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cosigner.core.settings import OidcProvider
from cosigner.identity.principals import Authn
from cosigner.policy.result import ApprovalRequirement

#: RFC 8176 ``amr`` values that are, or include, a second factor: ``mfa`` (multiple
#: factors), ``mca`` (multiple channels), ``otp`` (one-time password), ``hwk`` (proof of a
#: hardware key), ``sc`` (smart card).
MFA_AMR = frozenset({"mfa", "mca", "otp", "hwk", "sc"})
_METHODS = {"api_key": "an API key", "password": "a password sign-in",
            "slack": "a Slack click"}


@dataclass(frozen=True, slots=True)
class StepUp:
    """What a stage asks for, as sent back to the reviewer (and to the IdP)."""

    assurance: str | None
    min_acr: str | None
    max_auth_age_s: int | None

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in (("assurance", self.assurance), ("min_acr", self.min_acr),
                                  ("max_auth_age_s", self.max_auth_age_s)) if v is not None}

    def acr_values(self, provider: OidcProvider | None) -> str | None:
        """``acr_values`` to ask the provider for (OpenID Connect Core 1.0 §3.1.2.1):
        ``min_acr`` and the stronger values after it, else the tenant's MFA values."""
        if self.min_acr:
            order = provider.acr_values if provider else []
            later = order[order.index(self.min_acr):] if self.min_acr in order else []
            return " ".join(later or [self.min_acr])
        if self.assurance == "mfa" and provider and provider.mfa_acr_values:
            return " ".join(provider.mfa_acr_values)
        return None


def asked(requirement: ApprovalRequirement) -> StepUp | None:
    """The step-up a stage asks for, or ``None``."""
    if not requirement.step_up():
        return None
    return StepUp(requirement.assurance, requirement.min_acr, requirement.max_auth_age_s)


def shortfall(requirement: ApprovalRequirement, authn: Authn, *,
              provider: OidcProvider | None, now_s: float) -> str | None:
    """Why ``authn`` does not meet the stage's step-up (a short sentence), or ``None``.

    ``provider``: the reviewer's tenant's OpenID provider settings (``None``: none
    configured, so nothing can meet a step-up); ``now_s``: seconds since the epoch.
    """
    if not requirement.step_up():
        return None
    if provider is None:
        return ("this tenant has no single sign-on set up, so no sign-in can meet this "
                "request's step-up")
    if authn.method != "oidc":
        who = _METHODS.get(authn.method, f"a {authn.method} sign-in")
        return f"{who} cannot meet this request's step-up; sign in with single sign-on"
    if requirement.assurance == "mfa" and not (
            MFA_AMR & set(authn.amr) or (authn.acr and authn.acr in provider.mfa_acr_values)):
        return "this request needs a multi-factor sign-in"
    if requirement.min_acr:
        order = provider.acr_values
        if (requirement.min_acr not in order or authn.acr not in order
                or order.index(authn.acr) < order.index(requirement.min_acr)):
            return f"this request needs a sign-in at acr {requirement.min_acr!r} or stronger"
    if requirement.max_auth_age_s is not None and (
            authn.auth_time is None or now_s - authn.auth_time > requirement.max_auth_age_s):
        return (f"this request needs a sign-in from the last {requirement.max_auth_age_s} s")
    return None
