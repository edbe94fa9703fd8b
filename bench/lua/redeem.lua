-- POST /v1/permits/redeem, each pre-minted permit exactly once.
-- Arguments: tokens_file nthreads. Thread i (1-based) takes lines i, i+n, i+2n, ...
-- When a thread runs out it starts over: those repeats are refused (non-2xx), so an
-- exhausted pool shows as errors in the table instead of passing unnoticed.
-- The args are the ones decide.lua minted the permits for (amount 5000).
dofile(os.getenv("BENCH_LUA_DIR") .. "/report.lua")

local key = os.getenv("BENCH_KEY")
local headers = {["Authorization"] = "Bearer " .. key, ["Content-Type"] = "application/json"}
local tokens, i = {}, 0
local ARGS = '{"order_id":"ord_8472","amount_minor":5000,"currency":"USD",' ..
             '"reason_code":"duplicate_charge"}'

function init(args)
  local nthreads = tonumber(args[2])
  local line_no = 0
  for line in io.lines(args[1]) do
    if line_no % nthreads == tid - 1 then tokens[#tokens + 1] = line end
    line_no = line_no + 1
  end
  if #tokens == 0 then error("thread " .. tid .. " got no permits from " .. args[1]) end
  bench_check_hook('"status"%s*:%s*"([%a_]+)"')
end

function request()
  i = i + 1
  if i > #tokens then i = 1 end
  local body = '{"permit":"' .. tokens[i] .. '","tool":"issue_refund","args":' .. ARGS .. '}'
  return wrk.format("POST", "/v1/permits/redeem", headers, body)
end
