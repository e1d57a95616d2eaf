-- wrk's side of bench/outside.sh: sends the requests that `leasegate bench --emit-requests`
-- wrote, each thread its own share, and stops a thread when its share is sent.
--
--   wrk -t THREADS … -s bench/outside.lua URL -- HEAD BODIES THREADS COUNT
--
-- HEAD is NAME.head (the request line, then header lines). BODIES is NAME.bodies (one body a
-- line, each sent once: thread t of THREADS sends lines t, t + THREADS, …), NAME.body (one body
-- for every request) or `-` (no body); with those two, each thread sends COUNT / THREADS.
-- done() prints one line, `outside {JSON}`, for the script to read.

local threads = {}

function setup(thread)
  thread:set("id", #threads)
  table.insert(threads, thread)
end

-- Globals, so that done() can read them from each thread.
sent, share = 0, 0
local bodies_file, skip, prefix, one, sentinel

-- init() does little, for wrk calls each thread's while the threads before it already send:
-- the bodies are read as they are sent, one line in THREADS per request, through a buffered
-- file, and each request is the request's head, its length and its body put together.
function init(args)
  local head, bodies = args[1], args[2]
  local nthreads, count = tonumber(args[3]), tonumber(args[4])
  local f = assert(io.open(head))
  local method, path = f:read("*l"):match("^(%S+) (%S+)$")
  local headers = {}
  for line in f:lines() do
    local name, value = line:match("^([^:]+):%s*(.*)$")
    if name then
      headers[name] = value
    end
  end
  f:close()
  if bodies:match("%.bodies$") then
    bodies_file = assert(io.open(bodies))
    for _ = 1, id do
      bodies_file:read("*l")
    end
    skip = nthreads - 1
    share = math.huge
    -- wrk.format without a body ends the head with an empty line: the length goes before it.
    prefix = wrk.format(method, path, headers, nil):sub(1, -3) .. "Content-Length: "
  else
    local body = nil
    if bodies ~= "-" then
      local b = assert(io.open(bodies))
      body = b:read("*a")
      b:close()
    end
    one = wrk.format(method, path, headers, body)
    share = math.floor(count / nthreads)
  end
  -- What a connection is handed once its thread is stopped: the loop ends before its answer
  -- is read, so it is never counted, and it spends no attestation.
  sentinel = wrk.format("GET", "/livez", {}, nil)
end

local function next_body()
  local body = bodies_file:read("*l")
  for _ = 1, skip do
    bodies_file:read("*l")
  end
  return body
end

function request()
  sent = sent + 1
  if bodies_file then
    local body = sent <= share and next_body()
    if body and #body > 0 then
      return prefix .. #body .. "\r\n\r\n" .. body
    end
    -- Out of bodies: this thread has sent its share.
    share = sent - 1
  elseif sent <= share then
    return one
  end
  wrk.thread:stop()
  return sentinel
end

function done(summary, latency, requests)
  -- wrk divides by the whole -d even when a thread stopped early: a thread out of requests
  -- makes the rate a lower bound, and the script says so.
  local out = 0
  for _, t in ipairs(threads) do
    if t:get("sent") > t:get("share") then
      out = out + 1
    end
  end
  local e = summary.errors
  io.write(string.format(
    'outside {"requests":%d,"duration_us":%d,"status_errors":%d,"socket_errors":%d,' ..
    '"timeouts":%d,"p50_ms":%.3f,"p90_ms":%.3f,"p99_ms":%.3f,"max_ms":%.3f,' ..
    '"threads_out_of_requests":%d}\n',
    summary.requests, summary.duration, e.status, e.connect + e.read + e.write, e.timeout,
    latency:percentile(50) / 1000, latency:percentile(90) / 1000,
    latency:percentile(99) / 1000, latency.max / 1000, out))
end
