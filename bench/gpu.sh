#!/usr/bin/env bash
# The GPU recipe, in one short run: the machine (bertheads env), then SST-2 fine-tuning (1 epoch)
# and dev prediction with bertheads in bf16 (SDPA attention) against the Hugging Face Trainer
# with bf16=True and the text-classification pipeline with dtype=bfloat16 on the same GPU
# (bench/gpu.py; results in bench/out/gpu.json and a row of bench/RESULTS.md).
#   bash bench/gpu.sh                          # full SST-2 train set, on the GPU when there is one
#   bash bench/gpu.sh --limit 64 --model DIR   # a quick check (runs on CPU too)
#   bash bench/gpu.sh --dry-run                # what would run, the machine, no training
# Extra arguments go to bench/gpu.py; --no-results leaves bench/RESULTS.md alone.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$here")"
python="${PYTHON:-$root/.venv/bin/python}"
[ -x "$python" ] || python="$(command -v python3)"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export PYTHONPATH="$root/src${PYTHONPATH:+:$PYTHONPATH}"
dry=0 results=("--results" "$here/RESULTS.md") args=()
for a in "$@"; do
  case "$a" in
    --dry-run) dry=1 ;;
    --no-results) results=() ;;
    *) args+=("$a") ;;
  esac
done
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null || echo "no GPU: running on CPU"
"$python" -m bertheads env
steps=("classify (SST-2): bertheads train --precision bf16 and predict; Trainer bf16=True; pipeline dtype=bfloat16")
for s in "${steps[@]}"; do echo "step: $s"; done
if [ "$dry" = 1 ]; then
  "$python" -m py_compile "$here/gpu.py"
  echo "dry run: would run $python $here/gpu.py ${args[*]:-} ${results[*]:-}"
  exit 0
fi
exec "$python" "$here/gpu.py" ${results[@]+"${results[@]}"} ${args[@]+"${args[@]}"}  # a --results given wins
