"""Reference support-refund policy.

Reads are allowed; ``issue_refund`` (with a known currency) is allowed up to 100000
minor units, needs one ``finance`` approval above that, and is denied above 200000.
Every other tool is denied. ``input`` is the decision input document (see README § Policy input).

Upgrade-test copy of policies/refunds (f23c8d0): an allowed refund's permit lives
PERMIT_TTL_S (about 50 years), so the committed fixture's permits stay redeemable.
"""

READ_TOOLS = frozenset({"get_order", "get_payment_events", "get_refund_status", "search_policy"})
CURRENCIES = frozenset({"USD", "EUR", "GBP"})
AUTO_LIMIT_MINOR = 100_000
HARD_LIMIT_MINOR = 200_000
PERMIT_TTL_S = 1_576_800_000
FINANCE_APPROVAL = {
    "require": [{"role": "finance", "count": 1}],
    "timeout_ms": 1_800_000,
    "distinct_from": "initiator_and_previous",
}


def decide(input):
    tool = input["tool"]["name"]
    if tool in READ_TOOLS:
        return {"effect": "allow", "reasons": [{"code": "read_only", "message": "read tool"}]}
    if tool != "issue_refund":
        return {"effect": "deny", "reasons": [{"code": "tool_not_allowed",
                                               "message": f"{tool} is not allowed"}]}
    amount = input["args"].get("amount_minor")
    # Missing, boolean or non-integer amounts never allow (case K03).
    if type(amount) is not int or amount < 1:
        return {"effect": "deny",
                "reasons": [{"code": "invalid_amount",
                             "message": "amount_minor must be a positive integer"}]}
    # A missing or unknown currency never allows (case K03), catalogue or not.
    if input["args"].get("currency") not in CURRENCIES:
        return {"effect": "deny", "reasons": [{"code": "invalid_currency",
                                               "message": "currency must be USD, EUR or GBP"}]}
    if amount > HARD_LIMIT_MINOR:
        return {"effect": "deny", "reasons": [{"code": "over_hard_limit",
                                               "message": "refunds above 200000 are not allowed"}]}
    if amount > AUTO_LIMIT_MINOR:
        return {"effect": "require_approval",
                "reasons": [{"code": "over_auto_limit",
                             "message": "refunds above 100000 need finance approval"}],
                "approval": FINANCE_APPROVAL}
    return {"effect": "allow", "reasons": [{"code": "within_auto_limit",
                                            "message": "refund within the automatic limit"}],
            "permit_ttl_s": PERMIT_TTL_S}
