-- wrk script: POST /v1/classify with real messages from a labelled JSONL file, in turn.
-- Usage: wrk -t1 -c1 -d20s --latency -s benches/classify.lua http://127.0.0.1:8080/v1/classify
-- Env: TIERGATE_BENCH_DATA (default tests/data/test_sample.jsonl).
local path = os.getenv("TIERGATE_BENCH_DATA") or "tests/data/test_sample.jsonl"
local bodies = {}
for line in io.lines(path) do
  -- drop the "label" field: the API accepts only text, features and tenant
  local body = line:gsub(',%s*"label"%s*:%s*%d+', ''):gsub('"label"%s*:%s*%d+%s*,%s*', '')
  if #body > 2 then bodies[#bodies + 1] = body end
end
local i = 0
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
request = function()
  i = i % #bodies + 1
  return wrk.format(nil, nil, nil, bodies[i])
end
