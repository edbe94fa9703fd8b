"""The step-up rule (pure) and the requirement fields that ask for it."""

from __future__ import annotations

from typing import Any

import pytest

from cosigner.approvals.stepup import StepUp, asked, shortfall
from cosigner.core.errors import PolicyError
from cosigner.core.settings import OidcProvider
from cosigner.identity.principals import API_KEY_AUTHN, PASSWORD_AUTHN, Authn
from cosigner.policy.result import parse_requirement, stricter

BASE: dict[str, Any] = {"require": [{"role": "finance", "count": 1}], "timeout_ms": 60_000,
                        "distinct_from": "initiator"}
IDP = OidcProvider(issuer="https://idp.example", client_id="c", client_secret="s",
                   role_map={"g": ["finance"]}, acr_values=["silver", "gold", "platinum"],
                   mfa_acr_values=["gold", "platinum"])
NOW = 1_900_000_000


def test_step_up_fields_round_trip_per_stage() -> None:
    raw = {**BASE, "assurance": "mfa", "max_auth_age_s": 300,
           "on_expired": {**BASE, "min_acr": "platinum"}}
    parsed = parse_requirement(raw)
    assert (parsed.assurance, parsed.min_acr, parsed.max_auth_age_s) == ("mfa", None, 300)
    assert parsed.on_expired is not None and parsed.on_expired.min_acr == "platinum"
    assert parse_requirement(parsed.as_dict()) == parsed
    assert asked(parse_requirement(BASE)) is None


@pytest.mark.parametrize("bad", [
    {"assurance": "strong"}, {"assurance": True}, {"min_acr": ""}, {"min_acr": 3},
    {"max_auth_age_s": 0}, {"max_auth_age_s": 2_592_001}, {"max_auth_age_s": True},
])
def test_malformed_step_up_is_a_policy_error(bad: dict[str, Any]) -> None:
    with pytest.raises(PolicyError):
        parse_requirement({**BASE, **bad})


def test_a_barrier_and_a_policy_combine_to_the_stricter_step_up() -> None:
    a = parse_requirement({**BASE, "max_auth_age_s": 600})
    b = parse_requirement({**BASE, "assurance": "mfa", "max_auth_age_s": 300,
                           "min_acr": "gold"})
    both = stricter(a, b)
    assert (both.assurance, both.min_acr, both.max_auth_age_s) == ("mfa", "gold", 300)
    with pytest.raises(PolicyError):
        stricter(b, parse_requirement({**BASE, "min_acr": "platinum"}))


@pytest.mark.parametrize("authn", [API_KEY_AUTHN, PASSWORD_AUTHN, Authn("slack")])
def test_only_single_sign_on_can_meet_a_step_up(authn: Authn) -> None:
    for ask in ({"assurance": "mfa"}, {"min_acr": "silver"}, {"max_auth_age_s": 10**6}):
        assert shortfall(parse_requirement({**BASE, **ask}), authn, provider=IDP,
                         now_s=NOW) is not None
    assert shortfall(parse_requirement(BASE), authn, provider=IDP, now_s=NOW) is None


def test_no_provider_configured_meets_nothing() -> None:
    strong = Authn("oidc", acr="platinum", amr=("hwk",), auth_time=NOW)
    assert shortfall(parse_requirement({**BASE, "assurance": "mfa"}), strong, provider=None,
                     now_s=NOW) is not None


def test_acr_values_asked_of_the_provider() -> None:
    assert StepUp(None, "gold", None).acr_values(IDP) == "gold platinum"
    assert StepUp("mfa", None, 60).acr_values(IDP) == "gold platinum"
    assert StepUp(None, "unknown", None).acr_values(IDP) == "unknown"
    assert StepUp(None, None, 60).acr_values(IDP) is None
