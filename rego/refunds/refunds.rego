# Reference support-refund policy (Rego v1), the twin of policies/refunds/rules.py.
#
# Reads are allowed; issue_refund is allowed up to 100000 minor units, needs one
# finance approval above that, and is denied above 200000 or without a positive
# integer amount and a known currency. Every other tool is denied. The golden cases in
# cases.yaml must give the same effects on both engines.
#
# The logic is a function of the tool name and the arguments, `decide(name, args)`, so
# that tests call it directly: rego-cpp 1.5.2 aborts on `with input as ...` when the
# rule under test depends on other rules (tests in refunds_test.rego therefore avoid
# `with`). A missing tool, tool name or args leaves `decide` undefined: the default.
#
# Written for rego-cpp's evaluator (its cost per decision went from ~100 to ~50 µs,
# decisions unchanged; tests/policy/test_rego_policy_equivalence.py proves it against
# the earlier text on random inputs):
# - a rule's or else-branch's value that does not depend on its body is built before the
#   body is tested, so every `else := {...} if {...}` that is tried and fails still pays
#   for its object. Bind the object in the body after the test (`:= d if { test; d := {...} }`);
#   only the final `else :=` may be a plain literal.
# - a set literal (or a rule holding one) is rebuilt, hashing each member, on every
#   query: membership in a small constant list is cheaper with `x in [...]`.
# - reading `input.tool.name` once and passing plain values to the function is cheaper
#   than building `{"tool": input.tool, "args": input.args}` and reading paths of it.
# - only `input.tool` and `input.args` are read, so the engine passes only those (the
#   input conversion is a large part of an evaluation's cost).
package cosigner.refunds

default decision := {"effect": "deny", "reasons": [{"code": "tool_not_allowed", "message": "tool is not allowed"}]}

decision := decide(input.tool.name, input.args)

decide(name, args) := d if {
	name in ["get_order", "get_payment_events", "get_refund_status", "search_policy"]
	d := {"effect": "allow", "reasons": [{"code": "read_only", "message": "read tool"}]}
} else := refund(args) if {
	name == "issue_refund"
} else := {"effect": "deny", "reasons": [{"code": "tool_not_allowed", "message": "tool is not allowed"}]}

# A positive integer amount: true, "100000", 5.5 and a missing amount are not (K03, K25).
valid_amount(amount) if {
	is_number(amount)
	amount == floor(amount)
	amount >= 1
}

# Limits: 100000 (automatic) and 200000 (hard), in minor units.
refund(args) := d if {
	not valid_amount(args.amount_minor)
	d := {"effect": "deny", "reasons": [{"code": "invalid_amount", "message": "amount_minor must be a positive integer"}]}
} else := d if {
	not args.currency in ["USD", "EUR", "GBP"]
	d := {"effect": "deny", "reasons": [{"code": "invalid_currency", "message": "currency must be USD, EUR or GBP"}]}
} else := d if {
	args.amount_minor > 200000
	d := {"effect": "deny", "reasons": [{"code": "over_hard_limit", "message": "refunds above 200000 are not allowed"}]}
} else := d if {
	args.amount_minor > 100000
	d := {
		"effect": "require_approval",
		"reasons": [{"code": "over_auto_limit", "message": "refunds above 100000 need finance approval"}],
		"approval": {
			"require": [{"role": "finance", "count": 1}],
			"timeout_ms": 1800000,
			"distinct_from": "initiator_and_previous",
		},
	}
} else := {"effect": "allow", "reasons": [{"code": "within_auto_limit", "message": "refund within the automatic limit"}]}
