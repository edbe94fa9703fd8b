-- Shared by every bench script (loaded with dofile): unique ids per thread, the check
-- mode's status/effect tally, and done() writing the run's figures as JSON to
-- $BENCH_OUT. wrk runs setup()/done() in the main Lua state and init()/request()/
-- response() in one Lua state per thread; thread:set/get copy values between them.

local threads = {}
local next_tid = 0

function setup(thread)
  next_tid = next_tid + 1
  thread:set("tid", next_tid)
  table.insert(threads, thread)
end

-- Check mode (BENCH_CHECK=1): tally HTTP statuses and the effect field of each answer,
-- keep one body of an unexpected status. Off during measured runs: a response()
-- callback makes wrk parse every body, which would cost the load generator CPU.
function bench_check_hook(effect_pattern)
  if os.getenv("BENCH_CHECK") ~= "1" then return end
  statuses, effects, bad_body = {}, {}, nil
  response = function(status, headers, body)
    local s = tostring(status)
    statuses[s] = (statuses[s] or 0) + 1
    local e = string.match(body or "", effect_pattern) or "none"
    effects[e] = (effects[e] or 0) + 1
    if status ~= 200 and bad_body == nil then bad_body = string.sub(body or "", 1, 600) end
  end
end

local function json_counts(t)
  local parts = {}
  for k, v in pairs(t) do parts[#parts + 1] = string.format("%q:%d", k, v) end
  return "{" .. table.concat(parts, ",") .. "}"
end

local function json_string(s)
  s = string.gsub(s, '[%c"\\]', function(c) return string.format("\\u%04x", string.byte(c)) end)
  return '"' .. s .. '"'
end

local function merge(into, t)
  for k, v in pairs(t or {}) do into[k] = (into[k] or 0) + v end
end

function done(summary, latency, requests)
  local path = os.getenv("BENCH_OUT")
  if path == nil then return end
  local pct = {}
  -- 0.1 .. 100 in steps of 0.1: enough to merge two wrk runs' distributions.
  for i = 1, 1000 do pct[i] = string.format("%d", latency:percentile(i / 10)) end
  local statuses, effects, bad = {}, {}, nil
  for _, t in ipairs(threads) do
    merge(statuses, t:get("statuses"))
    merge(effects, t:get("effects"))
    bad = bad or t:get("bad_body")
  end
  local e = summary.errors
  local f = assert(io.open(path, "w"))
  f:write(string.format(
    '{"duration_us":%d,"requests":%d,"bytes":%d,' ..
    '"errors":{"connect":%d,"read":%d,"write":%d,"status":%d,"timeout":%d},' ..
    '"latency_us":{"min":%d,"max":%d,"mean":%.1f},"percentiles_us":[%s],' ..
    '"statuses":%s,"effects":%s,"bad_body":%s}\n',
    summary.duration, summary.requests, summary.bytes,
    e.connect, e.read, e.write, e.status, e.timeout,
    latency.min, latency.max, latency.mean, table.concat(pct, ","),
    json_counts(statuses), json_counts(effects),
    bad and json_string(bad) or "null"))
  f:close()
end
