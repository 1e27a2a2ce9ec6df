#!/usr/bin/env bash
# GPU check (issue 12), for a task that is lent a GPU: one call, meant to finish in under 8 minutes.
#   1. vLLM annotation of 1,000 NQ questions with k = 20, and its throughput;
#   2. the same through the hf backend, for the ratio (benchmarks/backends.py, same questions, same settings);
#   3. one short EliCal lora run on the vLLM records (1 epoch per stage).
# Writes benchmarks/results/gpu_check.json. Not yet run: no GPU was lent when it was written.
#
#   PYTHON=python VLLM_PYTHON=python DATA=../shared/data/honestybench/nq/test.jsonl bash benchmarks/gpu_check.sh
#
# PYTHON needs candor's dependencies (torch with CUDA); VLLM_PYTHON needs vllm (the same interpreter on a GPU box).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
VLLM_PY=${VLLM_PYTHON:-$PY}
DATA=${DATA:-../shared/data/honestybench/nq/test.jsonl}
QUESTIONS=${QUESTIONS:-1000}
K=${K:-20}
WORK=${WORK:-$(mktemp -d)}
OUT=benchmarks/results/gpu_check.json
export PYTHONPATH=src HF_HUB_OFFLINE=1

nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > "$WORK/gpu.txt" 2>&1 || echo "no nvidia-smi" > "$WORK/gpu.txt"
"$VLLM_PY" -c "import vllm" 2> "$WORK/vllm_import.txt" || { echo "vllm is not importable by $VLLM_PY"; cat "$WORK/vllm_import.txt"; exit 1; }

t0=$(date +%s)
"$PY" -m benchmarks.backends --paths vllm,hf --questions "$QUESTIONS" --k "$K" --batch-size 64 \
  --vllm-python "$VLLM_PY" --data "$DATA" --keep "$WORK" --out "$WORK/throughput.json"
t1=$(date +%s)
"$PY" -m candor.cli train elical -r "$WORK/vllm.jsonl" -o "$WORK/elical-lora" \
  --set mode=lora --set epochs=1 --set dtype=bfloat16 > "$WORK/elical.txt" 2>&1
t2=$(date +%s)

"$PY" - "$WORK" "$OUT" "$t0" "$t1" "$t2" <<'PYEOF'
import json, sys
from pathlib import Path
work, out, t0, t1, t2 = Path(sys.argv[1]), Path(sys.argv[2]), *map(int, sys.argv[3:])
payload = {
    "gpu": (work / "gpu.txt").read_text().strip(),
    "annotation": json.loads((work / "throughput.json").read_text()),
    "annotation_seconds_total": t1 - t0,
    "elical_lora": {"seconds": t2 - t1, "log_tail": (work / "elical.txt").read_text()[-2000:]},
}
out.parent.mkdir(parents=True, exist_ok=True)
out.write_text(json.dumps(payload, indent=2) + "\n")
print(json.dumps({"speed_vs_hf": payload["annotation"]["speed_vs_hf"], "elical_seconds": t2 - t1}))
PYEOF
