#!/usr/bin/env bash
# One SGLang server on a random-weight Llama, measured by this project's load generator and by SGLang's own
# benchmark client, interleaved (benchmarks/server_fidelity.py). Run on a GPU host where SGLang is importable.
#
#   bash benchmarks/sglang_server_fidelity.sh OUT_DIR [ROUNDS]
#
# The server keeps NVLink multicast off, as shared hosts require; it is killed with its process group at the end.
set -euo pipefail
OUT=${1:?usage: sglang_server_fidelity.sh OUT_DIR [ROUNDS]}
ROUNDS=${2:-3}
MODEL=${MODEL:-/root/models/llama-0.85b-dummy}
PORT=${PORT:-30000}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
[ -f "$MODEL/config.json" ] || python3 -m servesweep.dummy_model --arch llama-dense --layers 16 --out "$MODEL"
setsid python3 -m sglang.launch_server --model-path "$MODEL" --load-format dummy --port "$PORT" \
  --mem-fraction-static 0.3 --enable-metrics --cuda-graph-max-bs 64 --disable-piecewise-cuda-graph \
  >"$OUT/server.log" 2>&1 &
server=$!
trap 'kill -TERM -- -$server 2>/dev/null; sleep 5; kill -KILL -- -$server 2>/dev/null || true' EXIT
t0=$(date +%s)
until curl -sf "http://127.0.0.1:$PORT/health" >/dev/null; do
  kill -0 $server 2>/dev/null || { tail -30 "$OUT/server.log"; exit 1; }
  [ $(( $(date +%s) - t0 )) -lt 400 ] || { echo "not ready after 400 s"; tail -30 "$OUT/server.log"; exit 1; }
  sleep 2
done
echo "ready after $(( $(date +%s) - t0 )) s"
python3 benchmarks/server_fidelity.py --url "http://127.0.0.1:$PORT" --model "$MODEL" --served-name "$MODEL" \
  --ctx 512 --output-tokens 256 --concurrency 1 16 64 --rounds "$ROUNDS" --out "$OUT" | tee "$OUT/summary.txt"
curl -s "http://127.0.0.1:$PORT/metrics" >"$OUT/metrics_end.txt" || true
