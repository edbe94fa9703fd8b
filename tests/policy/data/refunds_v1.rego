# Reference support-refund policy (Rego v1), the twin of policies/refunds/rules.py.
#
# Reads are allowed; issue_refund is allowed up to 100000 minor units, needs one
# finance approval above that, and is denied above 200000 or without a positive
# integer amount and a known currency. Every other tool is denied. The golden cases in
# cases.yaml must give the same effects on both engines.
#
# The logic is a function of the input document, `decide(inp)`, so that tests call it
# directly: rego-cpp 1.5.2 aborts on `with input as ...` when the rule under test
# depends on other rules (tests in refunds_test.rego therefore avoid `with`).
package cosigner.refunds

# Only input.tool and input.args are read, so the engine passes only those (the input
# conversion is a large part of an evaluation's cost).
default decision := {"effect": "deny", "reasons": [{"code": "tool_not_allowed", "message": "tool is not allowed"}]}

decision := decide({"tool": input.tool, "args": input.args})

read_tools := {"get_order", "get_payment_events", "get_refund_status", "search_policy"}

currencies := {"USD", "EUR", "GBP"}

auto_limit_minor := 100000

hard_limit_minor := 200000

finance_approval := {
	"require": [{"role": "finance", "count": 1}],
	"timeout_ms": 1800000,
	"distinct_from": "initiator_and_previous",
}

decide(inp) := {"effect": "allow", "reasons": [{"code": "read_only", "message": "read tool"}]} if {
	inp.tool.name in read_tools
} else := refund(inp.args) if {
	inp.tool.name == "issue_refund"
} else := {"effect": "deny", "reasons": [{"code": "tool_not_allowed", "message": "tool is not allowed"}]}

# A positive integer amount: true, "100000", 5.5 and a missing amount are not (K03, K25).
valid_amount(args) if {
	is_number(args.amount_minor)
	args.amount_minor == floor(args.amount_minor)
	args.amount_minor >= 1
}

refund(args) := {"effect": "deny", "reasons": [{"code": "invalid_amount", "message": "amount_minor must be a positive integer"}]} if {
	not valid_amount(args)
} else := {"effect": "deny", "reasons": [{"code": "invalid_currency", "message": "currency must be USD, EUR or GBP"}]} if {
	not args.currency in currencies
} else := {"effect": "deny", "reasons": [{"code": "over_hard_limit", "message": "refunds above 200000 are not allowed"}]} if {
	args.amount_minor > hard_limit_minor
} else := {
	"effect": "require_approval",
	"reasons": [{"code": "over_auto_limit", "message": "refunds above 100000 need finance approval"}],
	"approval": finance_approval,
} if {
	args.amount_minor > auto_limit_minor
} else := {"effect": "allow", "reasons": [{"code": "within_auto_limit", "message": "refund within the automatic limit"}]}
