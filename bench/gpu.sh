#!/usr/bin/env bash
# SST-2 fine-tuning (1 epoch) and dev prediction on a GPU: bertheads under bf16 autocast against
# the Hugging Face Trainer with bf16=True, in one run (bench/gpu.py; results in bench/out/gpu.json).
#   bash bench/gpu.sh                          # full SST-2 train set, on the GPU when there is one
#   bash bench/gpu.sh --limit 64 --model DIR   # a quick check (runs on CPU too)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$here")"
python="${PYTHON:-$root/.venv/bin/python}"
[ -x "$python" ] || python="$(command -v python3)"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export PYTHONPATH="$root/src${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null || echo "no GPU: running on CPU"
exec "$python" "$here/gpu.py" "$@"
