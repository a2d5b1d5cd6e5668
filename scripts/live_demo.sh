#!/usr/bin/env bash
# The live loop of the README in one command (`make live-demo`): a backtest of two checkpoints, `serve` in the
# background with a shadow and the forecast log, the backtest's windows replayed as requests, the service
# stopped, then `score` against the backtest. Whatever happens, the server this script started is stopped
# (trap on EXIT). Outputs under runs/: backtest/, log/, live/ (report.html), serve.log.
# The port is serve's: DISTRIBUTED_ONNX_PORT (default 8000) and DISTRIBUTED_ONNX_GRPC_PORT (default 8001).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
R=distributed_onnx/resources/reference/taylor_chronos2_patchtst
DATA=distributed_onnx/resources/taylor.parquet
WINDOWS=(--n-windows 20 --stride 48)

mkdir -p runs/models
cp $R.onnx runs/models/challenger.onnx
cp $R.metadata.json runs/models/challenger.metadata.json
rm -rf runs/log runs/live  # a fresh log: requests replayed again would be new windows

echo "== 1. backtest of both checkpoints (runs/backtest)"
$BIN/distributed-onnx backtest --checkpoint $R.onnx --checkpoint runs/models/challenger.onnx \
    "${WINDOWS[@]}" --output runs/backtest --no-progress >/dev/null

echo "== 2. serve both, challenger as a shadow, the log in runs/log (output in runs/serve.log)"
$BIN/distributed-onnx serve --checkpoint $R.onnx --checkpoint runs/models/challenger.onnx \
    --shadow challenger --forecast-log runs/log >runs/serve.log 2>&1 &
SERVER=$!
stop_server() {
    if kill -0 "$SERVER" 2>/dev/null; then
        kill -TERM "$SERVER" 2>/dev/null || true
        wait "$SERVER" 2>/dev/null || true
    fi
}
trap stop_server EXIT
for _ in $(seq 1 360); do  # up to 3 minutes for Ray and Serve to start
    if grep -q '^ready:' runs/serve.log; then break; fi
    if ! kill -0 "$SERVER" 2>/dev/null; then
        echo "serve stopped before it was ready:" >&2; tail -5 runs/serve.log >&2; exit 1
    fi
    sleep 0.5
done
grep '^ready:' runs/serve.log || { echo "serve was not ready within 3 minutes (runs/serve.log)" >&2; exit 1; }

echo "== 3. the backtest's windows as requests"
$BIN/python scripts/replay_requests.py --data $DATA "${WINDOWS[@]}"
stop_server  # stopping flushes what the log still holds

echo "== 4. score the log against the actuals and the backtest (runs/live)"
$BIN/distributed-onnx score --forecasts runs/log --actuals $DATA --backtest runs/backtest --output runs/live
echo "== 5. open runs/live/report.html"
