#!/usr/bin/env bash
# GPU check (issues 12, 55 and 63), for a task that is lent a GPU: one call on one GPU, meant to finish in under
# 10 minutes with the vllm tier (step 0) capped at 7. Not yet run: no GPU was lent when it was written (docs/backends.md says so until it has).
#   1. vLLM annotation of QUESTIONS NQ questions with k = 20 against the hf backend on the same questions and
#      settings (benchmarks/backends.py: throughput of each and the ratio);
#   2. the Ray Data pipeline with the vLLM stage on the same questions (`candor annotate --engine ray
#      --backend vllm`): throughput, and whether its greedy answers equal step 1's vLLM records; recorded as
#      "not available" where this checkout's `candor annotate` has no --engine;
#   3. the EliCal head read from vLLM's generation pass (extract_hidden_states) against the classify-server
#      path (the exported head on `vllm serve --runner pooling`): the same confidences to 1e-4
#      (benchmarks/engine_pass_head.py), on a head-mode head trained on step 1's vLLM records;
#   4. one short EliCal lora run on the vLLM records (1 epoch per stage), as issue 12 asked.
#   0. the vllm tier's tests (`make test-vllm`'s: the same steps CI runs on a CPU, here on the GPU), so a lent
#      GPU only adds the speed rows of steps 1 to 4;
# Each step has its own time limit; a step that fails or times out is recorded as such and the others run.
# Writes benchmarks/results/gpu_check.json.
#
#   PYTHON=python VLLM_PYTHON=python DATA=../shared/data/honestybench/nq/test.jsonl bash benchmarks/gpu_check.sh
#
# PYTHON needs candor's dependencies (torch with CUDA, and ray[data] for step 2); VLLM_PYTHON needs vllm
# (the same interpreter on a GPU box).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
PY=${PYTHON:-python}
VLLM_PY=${VLLM_PYTHON:-$PY}
DATA=${DATA:-../shared/data/honestybench/nq/test.jsonl}
QUESTIONS=${QUESTIONS:-200}
K=${K:-20}
HEAD_QUESTIONS=${HEAD_QUESTIONS:-100}
WORK=${WORK:-$(mktemp -d)}
OUT=benchmarks/results/gpu_check.json
export PYTHONPATH=src HF_HUB_OFFLINE=1

status() { # status NAME RC: what a step's exit code means
  case "$2" in
    0) echo ok > "$WORK/$1.status" ;;
    124) echo "timed out" > "$WORK/$1.status" ;;
    *) echo "failed (exit $2)" > "$WORK/$1.status" ;;
  esac
}

nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > "$WORK/gpu.txt" 2>&1 || echo "no nvidia-smi" > "$WORK/gpu.txt"
if ! "$VLLM_PY" -c "import vllm" 2> "$WORK/vllm_import.txt"; then
  echo "vllm is not importable by $VLLM_PY"
  cat "$WORK/vllm_import.txt"
  exit 1
fi

# 0. the vllm tier (the CPU copy shim on PYTHONPATH leaves a CUDA KV cache to vLLM's own path)
VLLM_TESTS=$(make -s -f - p <<'MKEOF'
include Makefile
p: ; @echo $(VLLM_TESTS)
MKEOF
)
tier0=$(date +%s)
PYTHONPATH=src:.:tests/vllm_cpu timeout 420 "$VLLM_PY" -m pytest -q -p no:cacheprovider -m vllm $VLLM_TESTS \
  > "$WORK/vllm_tier.txt" 2>&1
status vllm_tier $?
tier1=$(date +%s)

# 1. vLLM vs hf annotation (k = 20)
t0=$(date +%s)
timeout 240 "$PY" -m benchmarks.backends --paths vllm,hf --questions "$QUESTIONS" --k "$K" --batch-size 64 \
  --vllm-python "$VLLM_PY" --data "$DATA" --keep "$WORK" --out "$WORK/throughput.json" > "$WORK/annotation.txt" 2>&1
status annotation $?
t1=$(date +%s)

# 2. the Ray Data pipeline with the vLLM stage, on the same questions
if "$PY" -m candor.cli annotate --help 2>/dev/null | grep -q -- "--engine"; then
  timeout 150 "$PY" -m candor.cli annotate --data "$DATA" --limit "$QUESTIONS" --k "$K" --backend vllm \
    --engine ray --out "$WORK/ray.jsonl" > "$WORK/ray.txt" 2>&1
  status ray $?
else
  echo "not available" > "$WORK/ray.status"
fi
t2=$(date +%s)

# 3. the head from vLLM's pass against the classify-server path
HEAD="$WORK/elical-head"
EXPORT="$WORK/elical-head-seqcls"
PORT=$("$PY" -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
{
  timeout 60 "$PY" -m candor.cli train elical -r "$WORK/vllm.jsonl" -o "$HEAD" --set mode=head --set epochs=1 &&
    timeout 30 "$PY" -m candor.cli export "$HEAD" "$EXPORT" --to seq-cls
} > "$WORK/head_train.txt" 2>&1
head_rc=$?
if [ "$head_rc" -eq 0 ]; then
  POOLER=$("$PY" -c "import json, sys; print(json.load(open(sys.argv[1]))['vllm_pooler_config'])" "$EXPORT/candor_export.json")
  "$VLLM_PY" -m vllm.entrypoints.openai.api_server --model "$EXPORT" --runner pooling --dtype float32 \
    --pooler-config "$POOLER" --port "$PORT" --host 127.0.0.1 --gpu-memory-utilization 0.3 --enforce-eager \
    > "$WORK/classify_server.txt" 2>&1 &
  server=$!
  for _ in $(seq 1 90); do
    curl -sf "http://127.0.0.1:$PORT/health" > /dev/null 2>&1 && break
    sleep 2
  done
  timeout 150 "$PY" -m benchmarks.engine_pass_head --head "$HEAD" --export "$EXPORT" \
    --classify-url "http://127.0.0.1:$PORT" --data "$DATA" --questions "$HEAD_QUESTIONS" \
    --out "$WORK/engine_pass_head.json" > "$WORK/engine_pass_head.txt" 2>&1
  status engine_pass_head $?
  kill "$server" 2> /dev/null
  wait "$server" 2> /dev/null
else
  status engine_pass_head "$head_rc"
fi
t3=$(date +%s)

# 4. a short EliCal lora run on the vLLM records
timeout 90 "$PY" -m candor.cli train elical -r "$WORK/vllm.jsonl" -o "$WORK/elical-lora" \
  --set mode=lora --set epochs=1 --set dtype=bfloat16 > "$WORK/elical.txt" 2>&1
status elical_lora $?
t4=$(date +%s)

"$PY" - "$WORK" "$OUT" "$t0" "$t1" "$t2" "$t3" "$t4" "$tier0" "$tier1" <<'PYEOF'
import json, sys
from pathlib import Path
work, out = Path(sys.argv[1]), Path(sys.argv[2])
t0, t1, t2, t3, t4, tier0, tier1 = map(int, sys.argv[3:])

def text(name, tail=2000):
    path = work / name
    return path.read_text()[-tail:] if path.exists() else None

def loaded(name):
    path = work / name
    return json.loads(path.read_text()) if path.exists() else None

def records(name):
    path = work / name
    if not path.exists():
        return None
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {r["item"]["id"]: r for r in rows}

ray = {"status": text("ray.status").strip(), "seconds": t2 - t1}
vllm_records, ray_records = records("vllm.jsonl"), records("ray.jsonl")
if ray["status"] == "ok" and vllm_records and ray_records:
    shared = sorted(set(vllm_records) & set(ray_records))
    same = sum(vllm_records[i]["greedy"]["text"] == ray_records[i]["greedy"]["text"] for i in shared)
    ray.update(records=len(ray_records), records_per_second=round(len(ray_records) / max(t2 - t1, 1), 3),
               greedy_identical_to_vllm=f"{same} of {len(shared)}")
elif ray["status"] != "not available":
    ray["log_tail"] = text("ray.txt")
payload = {
    "gpu": text("gpu.txt").strip(),
    "vllm_tier": {"status": text("vllm_tier.status").strip(), "seconds": tier1 - tier0,
                  "log_tail": text("vllm_tier.txt", 1500)},
    "annotation": {"status": text("annotation.status").strip(), "seconds": t1 - t0,
                   "result": loaded("throughput.json"), "log_tail": text("annotation.txt", 1500)},
    "ray_vllm_stage": ray,
    "engine_pass_head": {"status": text("engine_pass_head.status").strip(), "seconds": t3 - t2,
                         "result": loaded("engine_pass_head.json"),
                         "log_tail": None if loaded("engine_pass_head.json") else
                         (text("engine_pass_head.txt") or text("head_train.txt"))},
    "elical_lora": {"status": text("elical_lora.status").strip(), "seconds": t4 - t3,
                    "log_tail": text("elical.txt")},
    "total_seconds": t4 - tier0,
}
out.parent.mkdir(parents=True, exist_ok=True)
out.write_text(json.dumps(payload, indent=2) + "\n")
print(json.dumps({k: v.get("status") if isinstance(v, dict) else v for k, v in payload.items()}))
PYEOF
