-- The peer: POST /api/v1/policy/evaluate on the agentmesh policy-server, the refund
-- call of decide.lua (amount 5000, allowed by bench/peer/refunds.yaml). The peer keeps
-- no per-request state, so one constant body (wrk's pre-built request) is fair.
dofile(os.getenv("BENCH_LUA_DIR") .. "/report.lua")
wrk.method = "POST"
wrk.path = "/api/v1/policy/evaluate"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{"agent_did":"did:mesh:agent-support","action":"issue_refund",' ..
  '"resource":"ord_8472","context":{"order_id":"ord_8472","amount_minor":5000,' ..
  '"currency":"USD","reason_code":"duplicate_charge"}}'
bench_check_hook('"decision"%s*:%s*"([%a_]+)"')
