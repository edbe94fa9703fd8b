"""``signature: "webauthn"`` in an approval requirement (issue 22): parsed for the whole
requirement, per group, per escalation stage, and kept by ``stricter``."""

from __future__ import annotations

import pytest

from cosigner.core.errors import PolicyError
from cosigner.policy.result import parse_requirement, stricter


def test_whole_requirement_signs_every_group_and_round_trips() -> None:
    req = parse_requirement({"require": [{"role": "finance", "count": 1},
                                         {"role": "security", "count": 1}],
                             "signature": "webauthn"})
    assert req.signed_roles() == {"finance", "security"}
    assert parse_requirement(req.as_dict()) == req


def test_per_group_and_per_stage() -> None:
    req = parse_requirement({
        "require": [{"role": "finance", "count": 1},
                    {"role": "security", "count": 1, "signature": "webauthn"}],
        "on_expired": {"require": [{"role": "cfo", "count": 1}], "signature": "webauthn"}})
    first, second = req.stages()
    assert first.signed_roles() == {"security"} and second.signed_roles() == {"cfo"}
    assert parse_requirement(req.as_dict()) == req


@pytest.mark.parametrize("raw", [
    {"require": [{"role": "finance", "count": 1}], "signature": "password"},
    {"require": [{"role": "finance", "count": 1}], "signature": True},
    {"require": [{"role": "finance", "count": 1, "signature": "fido"}]},
])
def test_unknown_signature_kind_is_a_policy_error(raw: dict[str, object]) -> None:
    with pytest.raises(PolicyError):
        parse_requirement(raw)


def test_stricter_keeps_a_signature_either_side_asks() -> None:
    program = parse_requirement({"require": [{"role": "finance", "count": 1}]})
    policy = parse_requirement({"require": [{"role": "finance", "count": 2}],
                                "signature": "webauthn"})
    merged = stricter(program, policy)
    assert merged.signed_roles() == {"finance"} and merged.require[0].count == 2
