-- wrk script: acquire a new task on every request (each grant is fsync'd before its answer).
local counter = 0
prefix = "t"
function setup(thread)
  counter = counter + 1
  thread:set("prefix", "w" .. counter .. "-")
end
function init(args)
  n = 0
end
function request()
  n = n + 1
  local body = '{"task":"' .. prefix .. n .. '","holder":"wrk","ttl_ms":600000}'
  return wrk.format("POST", "/v1/acquire", {["Content-Type"] = "application/json"}, body)
end
