#!/usr/bin/env bash
# The daemon on a GPU, as a user runs it (tools/gpu-check.sh calls this on
# the device machine): `spindle serve --device cuda` on a real model, one
# JSON and one streamed request with curl, then `spindle-bench` over HTTP at
# concurrency 1, 16 and 64, then a clean shutdown.
#
#   tools/gpu-serve-check.sh BIN_DIR MODEL.gguf LOG_FILE
#
# Exit status: 0 when the daemon came up and both requests completed.
set -uo pipefail
bin=$1 model=$2 log=$3 device=${GPU_SERVE_DEVICE:-cuda}
port=18181 key=gpu-check
base=http://127.0.0.1:$port
"$bin/spindle" serve --model "$model" --served-model-name smollm2 --device "$device" --port "$port" \
    --api-key "$key" --store-path /tmp/gpu-serve-check.sqlite3 > "$log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null' EXIT
up=0
for _ in $(seq 1 90); do
    if curl -sf "$base/ready" > /dev/null; then up=1; break; fi
    kill -0 $pid 2>/dev/null || break
    sleep 1
done
if [ "$up" != 1 ]; then
    echo "the daemon did not become ready; its log:"; tail -30 "$log"; exit 1
fi
echo "ready after loading; first log lines:"; head -5 "$log"
post() {
    curl -s --max-time 60 -H "authorization: Bearer $key" -H 'content-type: application/json' "$base/v1/responses" -d "$1"
}
echo; echo "--- POST /v1/responses (JSON)"
json=$(post '{"model":"smollm2","input":"Name three colors.","max_output_tokens":32,"temperature":0}')
echo "$json" | head -c 1500; echo
status=0
echo "$json" | grep -q '"status":"completed"' || { echo "NOT COMPLETED"; status=1; }
echo; echo "--- POST /v1/responses (stream: event types, then the last event)"
stream=$(post '{"model":"smollm2","input":"Count to five.","max_output_tokens":24,"temperature":0,"stream":true}')
echo "$stream" | grep '^event:' | sort | uniq -c
echo "$stream" | grep '^data:' | tail -1 | head -c 600; echo
# A terminal event: completed, or incomplete at max_output_tokens.
echo "$stream" | grep -qE '^event: response.(completed|incomplete)' || { echo "STREAM DID NOT END"; status=1; }
echo; echo "--- spindle-bench (responses API, streaming, 48-token prompts, 64 output tokens)"
"$bin/spindle-bench" --base-url "$base/v1" --model smollm2 --api-key "$key" --api responses \
    --concurrency 1,16,64 --requests 64 --output-len 64 --input-len 48 --tokenizer "$model" --timeout-s 60 2>&1 | tail -25
echo; echo "--- metrics (engine lines)"
curl -s "$base/metrics" -H "authorization: Bearer $key" | grep -E '^spindle_(gpu|kv|prefix|batch)' | head -15
kill -INT $pid; wait $pid; echo "daemon exit status after SIGINT: $?"
trap - EXIT
echo "--- daemon log tail"; tail -8 "$log"
exit $status
