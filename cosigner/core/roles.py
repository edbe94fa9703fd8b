"""Role names: the built-in API roles and the rule for approver roles.

Built-in roles grant API access: ``runtime`` (decide, redeem, report), ``auditor`` (read
the decision log), ``admin`` (policies, keys, principals), ``operator`` (system operator:
only in the system tenant ``_system``, the only role there; administers shared policy
bundles and reloads). Any other valid role name
(``finance``, ``security`` ...) makes a principal an approver for that role, and is what an
approval requirement may name.
"""

from __future__ import annotations

import re

from cosigner.core.errors import InvalidRequest

BUILTIN_ROLES = frozenset({"runtime", "auditor", "admin", "operator"})
#: The system tenant (operators, and the chain of system-wide events).
SYSTEM_TENANT = "_system"
_ROLE_RE = re.compile(r"^[a-z][a-z0-9_.-]{0,63}\Z")  # \Z: "$" allows a trailing \n


def is_approver_role(role: str) -> bool:
    """True when ``role`` is a role an approval requirement may name: a valid role name and
    not a built-in API role (``runtime``, ``auditor``, ``admin`` grant API access, never the
    right to approve; a requirement naming ``runtime`` would let agents approve agents)."""
    return bool(_ROLE_RE.match(role)) and role not in BUILTIN_ROLES


def validate_roles(roles: list[str]) -> list[str]:
    """Normalise and check role names; raises :class:`InvalidRequest`."""
    cleaned = sorted({r.strip() for r in roles})
    if not cleaned:
        raise InvalidRequest("at least one role is required", code="invalid_roles")
    for role in cleaned:
        if not _ROLE_RE.match(role):
            raise InvalidRequest(f"invalid role name: {role!r}", code="invalid_roles")
    return cleaned
