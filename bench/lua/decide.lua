-- POST /v1/decisions with a unique request_id per request.
-- Arguments (after `--`): tag amount_minor mode
--   tag     unique per wrk run, so ids never repeat across cells or rounds
--   mode    "allow": one run id per thread (an agent run making many calls);
--           "approval": a new run id per request, so no two requests join one pending
--           approval request (same tenant, run, tool and args hash would join);
--           "join": one run id per thread, like "allow" (with a require_approval
--           amount, every request after a thread's first joins its open request).
-- Environment: BENCH_KEY (API key); BENCH_MINT_FILE (mint mode: append each permit
-- token of an answer to <file>.<tid>, one per line, for redeem.lua).
dofile(os.getenv("BENCH_LUA_DIR") .. "/report.lua")

local key = os.getenv("BENCH_KEY")
local tag, amount, mode, n = "t", "5000", "allow", 0
local headers = {["Authorization"] = "Bearer " .. key, ["Content-Type"] = "application/json"}

function init(args)
  tag, amount, mode = args[1] or tag, args[2] or amount, args[3] or mode
  local mint = os.getenv("BENCH_MINT_FILE")
  if mint then
    local out = assert(io.open(mint .. "." .. tid, "w"))
    out:setvbuf("line")
    response = function(status, hdrs, body)
      local token = string.match(body or "", '"token"%s*:%s*"([^"]+)"')
      if status == 200 and token then out:write(token, "\n") end
    end
  else
    bench_check_hook('"effect"%s*:%s*"([%a_]+)"')
  end
end

function request()
  n = n + 1
  local id = tag .. "-" .. tid .. "-" .. n
  local run = (mode == "approval") and ("run-" .. id) or ("run-" .. tag .. "-" .. tid)
  local body = '{"request_id":"req-' .. id .. '",' ..
    '"run":{"id":"' .. run .. '","step":' .. n .. '},' ..
    '"principal":{"id":"customer-42","type":"customer"},' ..
    '"initiator":{"id":"agent-support","type":"agent"},' ..
    '"tool":{"name":"issue_refund","side_effect":"financial"},' ..
    '"args":{"order_id":"ord_8472","amount_minor":' .. amount .. ',"currency":"USD",' ..
    '"reason_code":"duplicate_charge"},"context":{}}'
  return wrk.format("POST", "/v1/decisions", headers, body)
end
