#!/bin/bash
# One CoNLL-2003 fine-tuning epoch, then the best features-search trial (BiLSTM over a scalar mix of
# the last 4 layers, lr 3e-3, 3 epochs, on the search's warm feature cache), back to back on one
# thread, each timed as a whole command. Usage: bench/conll_side.sh [CACHE_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
D=../shared/data/conll2003
CACHE=${1:-bench/out/tune-conll-features-work/cache}
OUT=$(mktemp -d)
export OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1
timed() {
    local name=$1; shift
    local s e; s=$(date +%s.%N)
    "$@" > "$OUT/$name.log" 2>&1
    e=$(date +%s.%N)
    echo "$name $(echo "$e - $s" | bc) s; load $(cut -d' ' -f1-3 /proc/loadavg); dev f1 $(python3 -c \
        "import json; print(json.load(open('$OUT/$name/metrics.json'))['dev']['tag']['f1'])")"
}
timed finetune-1-epoch .venv/bin/bertheads train tag --train $D/train.txt --dev $D/dev.txt --out "$OUT/finetune-1-epoch" \
    --epochs 1 --batch-size 32 --no-progress
timed features-bilstm-3-epochs .venv/bin/bertheads train tag --train $D/train.txt --dev $D/dev.txt \
    --out "$OUT/features-bilstm-3-epochs" --mode features --layers=-1,-2,-3,-4 --combine scalar-mix --head bilstm \
    --lr 3e-3 --batch-size 32 --epochs 3 --cache-dir "$CACHE" --no-progress
rm -rf "$OUT"
