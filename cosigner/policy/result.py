"""The policy result contract and its validation.

A rule (Python or Rego) returns a raw value; only the exact documented shape may
act. Anything else becomes ``deny`` with reason ``policy_error`` (fail closed,
DESIGN invariant 1 and case K04/K05)::

    {"effect": "allow" | "deny" | "require_approval",
     "reasons": [{"code": str, "message": str} | str, ...],          # optional
     "approval": {"require": [{"role": str, "count": int >= 1,       # require_approval only
                               "signature": "webauthn"}, ...],         # signature optional
                  "timeout_ms": 1..2_592_000_000,
                  "distinct_from": "initiator" | "previous" | "initiator_and_previous",
                  "signature": "webauthn",                                # optional: every
                                                                          # group signed
                  "assurance": "mfa",                 # optional: step-up (per stage)
                  "min_acr": str,                     # optional: step-up (per stage)
                  "max_auth_age_s": 1..2_592_000,     # optional: step-up (per stage)
                  "on_expired": {"require": [...], "timeout_ms": ...,     # optional: the
                                 "distinct_from": ..., "on_expired": ...}, # next stage
                  "break_glass": bool,                                      # optional, true
                  "standing": {"max_ttl_s": int >= 1, "max_uses": int >= 1}},  # optional
     "mask": ["/json/pointer", ...],                                    # optional
     "permit_ttl_s": int}                                               # optional, allow only
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from cosigner.core import fastjson
from cosigner.core.errors import PolicyError
from cosigner.core.review_statements import SIGNATURE_KINDS
from cosigner.core.roles import is_approver_role

Effect = Literal["allow", "deny", "require_approval"]
DistinctFrom = Literal["initiator", "previous", "initiator_and_previous"]

EFFECTS: frozenset[str] = frozenset({"allow", "deny", "require_approval"})
DISTINCT_FROM: frozenset[str] = frozenset({"initiator", "previous", "initiator_and_previous"})
MAX_TIMEOUT_MS = 2_592_000_000  # 30 days
#: An escalation chain has at most this many stages (the first one included).
MAX_STAGES = 3
_RESULT_KEYS = frozenset({"effect", "reasons", "approval", "mask", "permit_ttl_s"})
_STAGE_KEYS = frozenset({"require", "timeout_ms", "distinct_from", "on_expired", "signature",
                         "assurance", "min_acr", "max_auth_age_s"})
#: ``assurance`` values a requirement may ask for (see :mod:`cosigner.approvals.stepup`).
ASSURANCES = frozenset({"mfa"})
MAX_AUTH_AGE_S = 2_592_000
_APPROVAL_KEYS = _STAGE_KEYS | {"break_glass", "standing"}
MAX_STANDING_TTL_S = 30 * 86_400
MAX_STANDING_USES = 10_000


@dataclass(frozen=True, slots=True)
class StandingRule:
    """How far an approver may extend an approval to later calls of the same tool:
    at most ``max_ttl_s`` seconds and ``max_uses`` calls."""

    max_ttl_s: int
    max_uses: int


@dataclass(frozen=True, slots=True)
class Reason:
    """A machine code with its human text."""

    code: str
    message: str = ""

    def as_dict(self) -> dict[str, str]:
        return {"code": self.code, "message": self.message}


@dataclass(frozen=True, slots=True)
class RoleGroup:
    """``count`` distinct people holding ``role``; ``signature`` ``"webauthn"``: each of
    their approvals must be signed by the approver's own passkey."""

    role: str
    count: int
    signature: str | None = None

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"role": self.role, "count": self.count}
        if self.signature is not None:
            out["signature"] = self.signature
        return out


@dataclass(frozen=True, slots=True)
class ApprovalRequirement:
    """What an approval request needs: every group met (AND), ``count`` distinct people each.

    ``on_expired``: the stage the request escalates to when this one times out (``None``:
    it expires). ``break_glass``: whether one ``breakglass`` principal may authorise the
    call alone (stored on the first stage; a later stage inherits it).

    Step-up (per stage; :mod:`cosigner.approvals.stepup` checks a reviewer against it):
    ``assurance`` ``"mfa"`` (a multi-factor sign-in), ``min_acr`` (at least this ``acr`` in
    the tenant's ordered ``acr_values``), ``max_auth_age_s`` (the reviewer authenticated at
    most this long ago). Any of them makes API keys and passwords unable to review.
    """

    require: tuple[RoleGroup, ...]
    timeout_ms: int
    distinct_from: DistinctFrom
    on_expired: ApprovalRequirement | None = None
    break_glass: bool = True
    standing: StandingRule | None = None
    assurance: str | None = None
    min_acr: str | None = None
    max_auth_age_s: int | None = None

    def step_up(self) -> bool:
        """True when this stage asks for more than who the reviewer is."""
        return bool(self.assurance or self.min_acr or self.max_auth_age_s)

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "require": [g.as_dict() for g in self.require],
            "timeout_ms": self.timeout_ms,
            "distinct_from": self.distinct_from,
        }
        for name in ("assurance", "min_acr", "max_auth_age_s"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        if self.on_expired is not None:
            nxt = self.on_expired.as_dict()
            nxt.pop("break_glass", None)  # the first stage's settings hold for the chain
            nxt.pop("standing", None)
            out["on_expired"] = nxt
        if not self.break_glass:
            out["break_glass"] = False
        if self.standing is not None:
            out["standing"] = {"max_ttl_s": self.standing.max_ttl_s,
                               "max_uses": self.standing.max_uses}
        return out

    def signed_roles(self) -> frozenset[str]:
        """Roles whose approvals must carry a WebAuthn signature (per group; a
        requirement-wide ``signature`` was spread to every group when parsed)."""
        return frozenset(g.role for g in self.require if g.signature is not None)

    def stages(self) -> list[ApprovalRequirement]:
        """This stage and every stage it may escalate to, in order."""
        chain: list[ApprovalRequirement] = [self]
        while chain[-1].on_expired is not None:
            chain.append(chain[-1].on_expired)
        return chain


@dataclass(frozen=True, slots=True)
class PolicyResult:
    effect: Effect
    reasons: tuple[Reason, ...] = ()
    approval: ApprovalRequirement | None = None
    mask: tuple[str, ...] = ()
    permit_ttl_s: int | None = None


def deny(code: str, message: str = "") -> PolicyResult:
    """A fail-closed ``deny`` carrying one reason."""
    return PolicyResult(effect="deny", reasons=(Reason(code, message),))


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def parse_requirement(raw: Any, *, _stage: int = 1,
                      _break_glass: bool | None = None) -> ApprovalRequirement:
    """Validate an approval requirement object; raises :class:`PolicyError`.

    An empty or missing ``require`` list is an error, never "anyone may approve"
    (DESIGN invariant 6, case K15); so is a role that is not an approver role (a built-in
    ``runtime``/``auditor``/``admin`` role, or a name no principal can hold). Each
    ``on_expired`` stage is validated the same way; a chain longer than
    :data:`MAX_STAGES` is an error. ``break_glass`` (a boolean) belongs to the first stage.
    """
    keys = _APPROVAL_KEYS if _stage == 1 else _STAGE_KEYS
    if not isinstance(raw, dict) or not raw.keys() <= keys:
        where = "approval" if _stage == 1 else f"approval stage {_stage} (on_expired)"
        raise PolicyError(f"{where} must be an object with require, timeout_ms, "
                          "distinct_from" + (", on_expired" if _stage < MAX_STAGES else ""))
    groups = raw.get("require")
    if not isinstance(groups, list) or not groups:
        raise PolicyError("approval.require must be a non-empty list of {role, count}")
    parsed: list[RoleGroup] = []
    for group in groups:
        if not isinstance(group, dict) or not group.keys() <= _GROUP_KEYS:
            raise PolicyError("approval.require entries must be {role, count, signature?}")
        role, count = group.get("role"), group.get("count", 1)
        if not isinstance(role, str) or not role.strip() or not _is_int(count) or count < 1:
            raise PolicyError("approval.require entries need a role name and count >= 1")
        if not is_approver_role(role):
            raise PolicyError(f"approval.require names {role[:64]!r}, which is not an "
                              "approver role (built-in roles runtime, auditor and admin "
                              "never approve)")
        parsed.append(RoleGroup(role=role, count=count,
                                signature=_parse_signature(group.get("signature"), "group")))
    if len({g.role for g in parsed}) != len(parsed):
        raise PolicyError("approval.require names a role twice")
    timeout_ms = raw.get("timeout_ms", 1_800_000)
    if not _is_int(timeout_ms) or not 1 <= timeout_ms <= MAX_TIMEOUT_MS:
        raise PolicyError(f"approval.timeout_ms must be an integer in 1..{MAX_TIMEOUT_MS}")
    distinct_from = raw.get("distinct_from", "initiator_and_previous")
    if distinct_from not in DISTINCT_FROM:
        raise PolicyError("approval.distinct_from must be initiator, previous or "
                          "initiator_and_previous")
    break_glass = raw.get("break_glass", True) if _break_glass is None else _break_glass
    if not isinstance(break_glass, bool):
        raise PolicyError("approval.break_glass must be true or false")
    standing = _parse_standing(raw.get("standing"))
    whole = _parse_signature(raw.get("signature"), "approval")
    if whole is not None:  # the whole requirement: every group signed
        parsed = [RoleGroup(g.role, g.count, whole) for g in parsed]
    assurance, min_acr, max_age = _parse_step_up(raw)
    nxt = raw.get("on_expired")
    on_expired = None
    if nxt is not None:
        if _stage >= MAX_STAGES:
            raise PolicyError(f"approval.on_expired chains at most {MAX_STAGES} stages")
        on_expired = parse_requirement(nxt, _stage=_stage + 1, _break_glass=break_glass)
    return ApprovalRequirement(tuple(parsed), timeout_ms, distinct_from, on_expired,
                               break_glass, standing, assurance=assurance, min_acr=min_acr,
                               max_auth_age_s=max_age)


def _parse_step_up(raw: dict[str, Any]) -> tuple[str | None, str | None, int | None]:
    assurance, min_acr, max_age = (raw.get("assurance"), raw.get("min_acr"),
                                   raw.get("max_auth_age_s"))
    if assurance is not None and assurance not in ASSURANCES:
        raise PolicyError('approval.assurance must be "mfa"')
    if min_acr is not None and (not isinstance(min_acr, str) or not min_acr.strip()
                                or len(min_acr) > 256):
        raise PolicyError("approval.min_acr must be a non-empty string (at most 256 chars)")
    if max_age is not None and (not _is_int(max_age) or not 1 <= max_age <= MAX_AUTH_AGE_S):
        raise PolicyError(f"approval.max_auth_age_s must be an integer in 1..{MAX_AUTH_AGE_S}")
    return assurance, min_acr, max_age


def _parse_signature(raw: Any, where: str) -> str | None:
    if raw is None:
        return None
    if raw not in SIGNATURE_KINDS:
        raise PolicyError(f"{where}.signature must be \"webauthn\"")
    return str(raw)


def _parse_standing(raw: Any) -> StandingRule | None:
    if raw is None:
        return None
    if not isinstance(raw, dict) or set(raw) != {"max_ttl_s", "max_uses"}:
        raise PolicyError("approval.standing must be {max_ttl_s, max_uses}")
    ttl, uses = raw["max_ttl_s"], raw["max_uses"]
    if not _is_int(ttl) or not 1 <= ttl <= MAX_STANDING_TTL_S:
        raise PolicyError(f"approval.standing.max_ttl_s must be in 1..{MAX_STANDING_TTL_S}")
    if not _is_int(uses) or not 1 <= uses <= MAX_STANDING_USES:
        raise PolicyError(f"approval.standing.max_uses must be in 1..{MAX_STANDING_USES}")
    return StandingRule(ttl, uses)


#: The separation-of-duties rules each ``distinct_from`` value applies.
DISTINCT_PARTS: dict[str, frozenset[str]] = {
    "initiator": frozenset({"initiator"}), "previous": frozenset({"previous"}),
    "initiator_and_previous": frozenset({"initiator", "previous"})}


def stricter(base: ApprovalRequirement, other: ApprovalRequirement) -> ApprovalRequirement:
    """The requirement meeting both: every group of either (the larger count for a role
    named by both, signed when either asks), the shorter timeout, both ``distinct_from``
    rules, and both step-ups (``mfa`` if either asks, the shorter ``max_auth_age_s``; two
    different ``min_acr`` cannot be ordered without the tenant's settings, so they are a
    :class:`PolicyError`) (program barriers: a policy may only raise the program's
    requirement, never lower it)."""
    counts: dict[str, int] = {}
    signed: dict[str, str] = {}
    for group in base.require + other.require:
        counts[group.role] = max(counts.get(group.role, 0), group.count)
        if group.signature is not None:  # a signature asked by either side stays
            signed[group.role] = group.signature
    parts = DISTINCT_PARTS[base.distinct_from] | DISTINCT_PARTS[other.distinct_from]
    distinct: Any = "initiator_and_previous" if len(parts) == 2 else next(iter(parts))
    if base.min_acr and other.min_acr and base.min_acr != other.min_acr:
        raise PolicyError("two different approval.min_acr values cannot be combined")
    ages = [a for a in (base.max_auth_age_s, other.max_auth_age_s) if a is not None]
    return ApprovalRequirement(tuple(RoleGroup(r, c, signed.get(r)) for r, c in counts.items()),
                               min(base.timeout_ms, other.timeout_ms), distinct,
                               assurance=base.assurance or other.assurance,
                               min_acr=base.min_acr or other.min_acr,
                               max_auth_age_s=min(ages) if ages else None)


_REASON_KEYS = frozenset({"code", "message"})
_GROUP_KEYS = frozenset({"role", "count", "signature"})
#: Reasons already made, by ``(code, message)``: a rule answers with a few fixed reasons,
#: and a :class:`Reason` is an immutable value (bounded; cleared whole when full).
_reasons: dict[tuple[str, str], Reason] = {}
_MAX_REASONS = 1024


#: ``mask`` absent from a result (not ``()``: the empty tuple is one object in CPython,
#: and a rule's ``"mask": ()`` is refused like any mask that is not a list).
_NO_MASK: Any = object()


def _reason(code: str, message: str) -> Reason:
    if type(code) is not str or type(message) is not str:  # a subclass: its own object
        return Reason(code, message)
    key = (code, message)
    reason = _reasons.get(key)
    if reason is None:
        if len(_reasons) >= _MAX_REASONS:
            _reasons.clear()
        reason = _reasons[key] = Reason(code, message)
    return reason


def _parse_reasons(raw: Any) -> tuple[Reason, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise PolicyError("reasons must be a list")
    reasons = []
    for item in raw:
        if isinstance(item, str):
            reasons.append(_reason(item, ""))
            continue
        if isinstance(item, dict) and item.keys() <= _REASON_KEYS:
            code, message = item.get("code"), item.get("message", "")
            if isinstance(code, str) and isinstance(message, str):
                reasons.append(_reason(code, message))
                continue
        raise PolicyError("each reason must be a string or {code, message}")
    return tuple(reasons)


#: Results already made for a plain ``allow``/``deny`` (only ``effect``, ``reasons`` and
#: ``permit_ttl_s``, every value of an exact built-in type), by :func:`_plain_key`: a rule
#: answers with a few fixed results, and a :class:`PolicyResult` is an immutable value
#: (bounded; cleared whole when full). Building one (a frozen dataclass) was about 40 %
#: of :func:`validate_result` (bench/README.md, session 10).
_results: dict[tuple[Any, ...], PolicyResult] = {}
_MAX_RESULTS = 1024
_PLAIN_KEYS = frozenset({"effect", "reasons", "permit_ttl_s"})
_PLAIN_EFFECTS = frozenset({"allow", "deny"})
_GATED_KEYS = frozenset({"effect", "reasons", "permit_ttl_s", "approval"})


def _plain_key(effect: str, reasons: Any, ttl: Any) -> tuple[Any, ...] | None:
    """``(effect, ttl, code, message, code, message…)`` when ``reasons`` is ``None`` or a
    ``list`` of ``str`` and ``{code, message?}`` ``dict`` s of ``str`` and ``ttl`` is
    ``None`` or an ``int`` (exact types: a subclass's equality is its own), else ``None``.
    Every such result :func:`_validate` accepts is determined by this key alone."""
    if ttl is not None and type(ttl) is not int:
        return None
    if reasons is None:
        return (effect, ttl)
    if type(reasons) is not list:
        return None
    key: list[Any] = [effect, ttl]
    for item in reasons:
        if type(item) is str:
            key += (item, "")
        elif type(item) is dict and item.keys() <= _REASON_KEYS:
            code, message = item.get("code"), item.get("message", "")
            if type(code) is not str or type(message) is not str:
                return None
            key += (code, message)
        else:
            return None
    return tuple(key)


def validate_result(raw: Any) -> PolicyResult:
    """Turn a rule's raw return value into a :class:`PolicyResult` (a shared value for a
    plain ``allow``/``deny``, or a ``require_approval`` with a plain JSON ``approval``,
    seen before: it is immutable).

    Raises:
        PolicyError: for anything but the documented shape: non-object, unknown key,
            unknown effect, malformed approval/mask/reasons, ``approval`` missing on
            ``require_approval``.
    """
    if type(raw) is dict:
        effect = raw.get("effect")
        key = None
        if raw.keys() <= _PLAIN_KEYS and type(effect) is str and effect in _PLAIN_EFFECTS:
            key = _plain_key(effect, raw.get("reasons"), raw.get("permit_ttl_s"))
        elif type(effect) is str and effect == "require_approval" and raw.keys() <= _GATED_KEYS:
            key = _gated_key(raw)
        if key is not None:
            result = _results.get(key)
            if result is None:
                result = _validate(raw)  # raises before anything is kept
                if len(_results) >= _MAX_RESULTS:
                    _results.clear()
                _results[key] = result
            return result
    return _validate(raw)


def _gated_key(raw: dict[str, Any]) -> tuple[Any, ...] | None:
    """:func:`_plain_key` of a ``require_approval`` result (no ``mask``) followed by the
    RFC 8785 bytes of its ``approval`` object, when :func:`cosigner.core.fastjson.canonical`
    proves them: every value in it then is exactly a ``dict``, ``list``, ``str``, ``int``,
    ``bool`` or ``None`` (no float, so no ``NaN`` printed as ``null``; no subclass), and
    those bytes name that value up to key order, which :func:`parse_requirement` does not
    read. Else ``None`` (validated each time)."""
    key = _plain_key("require_approval", raw.get("reasons"), raw.get("permit_ttl_s"))
    approval = raw.get("approval")
    if key is None or type(approval) is not dict:
        return None
    text = fastjson.canonical(approval)
    return None if text is None else (*key, text)


def _validate(raw: Any) -> PolicyResult:
    """:func:`validate_result` without the shared results."""
    if not isinstance(raw, dict):
        raise PolicyError(f"policy result must be an object, got {type(raw).__name__}")
    if not raw.keys() <= _RESULT_KEYS:
        unknown = set(raw) - _RESULT_KEYS
        raise PolicyError(f"policy result has unknown keys: {sorted(unknown)}")
    effect = raw.get("effect")
    if not isinstance(effect, str) or effect not in EFFECTS:
        raise PolicyError("policy result effect must be allow, deny or require_approval")
    reasons = _parse_reasons(raw.get("reasons"))
    approval = None
    if effect == "require_approval":
        approval = parse_requirement(raw.get("approval"))
    elif raw.get("approval") is not None:
        raise PolicyError("approval is only valid with effect require_approval")
    mask = raw.get("mask", _NO_MASK)
    if mask is not _NO_MASK and (not isinstance(mask, list) or not all(
        isinstance(p, str) and (p == "" or p.startswith("/")) for p in mask
    )):
        raise PolicyError("mask must be a list of JSON pointers")
    ttl = raw.get("permit_ttl_s")
    if ttl is not None and (not _is_int(ttl) or ttl < 1):
        raise PolicyError("permit_ttl_s must be a positive integer")
    return PolicyResult(effect, reasons, approval,  # type: ignore[arg-type]
                        () if mask is _NO_MASK else tuple(mask), ttl)
