#!/usr/bin/env bash
# The GPU recipe, in one short run: the machine (bertheads env), then for each task kind
# (classify: SST-2, tag: CoNLL-2003, qa: SQuAD) fine-tuning (1 epoch) and dev prediction with
# bertheads in bf16 (SDPA attention) against the Hugging Face Trainer with bf16=True and a
# transformers prediction peer in bf16 on the same GPU (bench/gpu.py; results in
# bench/out/gpu.json and one row per kind in bench/RESULTS.md).
#   bash bench/gpu.sh                               # the default sizes, on the GPU when there is one
#   bash bench/gpu.sh --kinds tag,qa                # some kinds only
#   bash bench/gpu.sh --limit 64 --model DIR        # a quick check (runs on CPU too)
#   bash bench/gpu.sh --dry-run                     # the machine and the steps, no training
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
"$python" "$here/gpu.py" --plan ${args[@]+"${args[@]}"}  # one "step:" line per kind, with its data and sizes
if [ "$dry" = 1 ]; then
  echo "dry run: would run $python $here/gpu.py ${args[*]:-} ${results[*]:-}"
  exit 0
fi
exec "$python" "$here/gpu.py" ${results[@]+"${results[@]}"} ${args[@]+"${args[@]}"}  # a --results given wins
