-- wrk script: renew one lease over and over (keep-alive). BODY comes from the env.
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = os.getenv("BODY")
local token = os.getenv("AUTH_TOKEN")
if token and token ~= "" then
  wrk.headers["Authorization"] = "Bearer " .. token
end
