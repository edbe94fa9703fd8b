"""Role names: the built-in API roles and the rule for approver roles.

Built-in roles grant API access: ``runtime`` (decide, redeem, report), ``auditor`` (read
the decision log), ``admin`` (policies, keys, principals), ``breakglass`` (authorise a
pending approval request alone, with a reason; reviewed afterwards), ``operator`` (system operator:
only in the system tenant ``_system``, the only role there; administers shared policy
bundles and reloads), ``barrier`` (trusted runtime code that opens program barriers,
``POST /v1/approvals`` with a context; separate from ``runtime`` so an agent holding a
runtime key cannot open approvals of its own choosing). Any other valid role name
(``finance``, ``security`` ...) makes a principal an approver for that role, and is what an
approval requirement may name.
"""

from __future__ import annotations

import re

from cosigner.core.errors import InvalidRequest

#: The role that opens program barriers.
BARRIER_ROLE = "barrier"
#: The tool name of a program barrier in policy input, permits and the log (reserved:
#: a decision request naming it is refused, so no decide path can mint its permits).
BARRIER_TOOL = "cosigner.barrier"
#: Break-glass: may authorise a pending request alone, with a reason, in an emergency
#: (:mod:`cosigner.approvals.breakglass`); never an approver role a requirement may name.
BREAKGLASS_ROLE = "breakglass"
BUILTIN_ROLES = frozenset({"runtime", "auditor", "admin", "operator", BARRIER_ROLE,
                           BREAKGLASS_ROLE})
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
