# Rego tests of the refund policy, run by `cosigner policy test` (and by `opa test`).
# They call `decide` directly instead of `... with input as ...` (see refunds.rego).
package cosigner.refunds_test

import data.cosigner.refunds

refund(args) := refunds.decide("issue_refund", args)

test_read_tool_allowed if {
	refunds.decide("get_order", {"order_id": "ord_1"}).effect == "allow"
}

test_unknown_tool_denied if {
	refunds.decide("delete_customer", {}).effect == "deny"
}

test_non_string_tool_name_denied if {
	every name in [null, 7, ["get_order"], {"name": "get_order"}] {
		refunds.decide(name, {}).reasons[0].code == "tool_not_allowed"
	}
}

test_refund_at_auto_limit_allowed if {
	refund({"order_id": "ord_1", "amount_minor": 100000, "currency": "USD", "reason_code": "goodwill"}).effect == "allow"
}

test_refund_above_auto_limit_needs_finance if {
	d := refund({"order_id": "ord_1", "amount_minor": 100001, "currency": "EUR", "reason_code": "goodwill"})
	d.effect == "require_approval"
	d.approval.require == [{"role": "finance", "count": 1}]
}

test_refund_above_hard_limit_denied if {
	d := refund({"order_id": "ord_1", "amount_minor": 200001, "currency": "USD", "reason_code": "goodwill"})
	d.effect == "deny"
	d.reasons[0].code == "over_hard_limit"
}

test_missing_currency_never_allows if {
	refund({"order_id": "ord_1", "amount_minor": 100}).effect == "deny"
}

test_unknown_currency_denied if {
	refund({"order_id": "ord_1", "amount_minor": 100, "currency": "usd"}).reasons[0].code == "invalid_currency"
}

test_non_integer_amounts_denied if {
	every amount in [true, "100000", 5.5, -5, 0, null] {
		refund({"order_id": "ord_1", "amount_minor": amount, "currency": "USD"}).effect == "deny"
	}
}

test_non_object_args_denied if {
	every args in ["x", 7, [100], null] {
		refund(args).reasons[0].code == "invalid_amount"
	}
}
