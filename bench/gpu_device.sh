#!/usr/bin/env bash
# Runs on the lent GPU machine, from the bundle bench/gpu_bundle.sh made in .gpu/: unpacks the data,
# widens the checkpoint back to fp32, installs the carried wheels, then (DIAG=N) bench/gpu_diag.py
# with N training rows of ours, and bench/gpu.sh for each kind in KINDS (default: all three), each
# kind within PER_KIND seconds; or, with RUN="a command", that command instead (bench/out/*.json and
# *.jsonl copied to $OUT after it; bench/small_data.py --out-dir "$OUT" writes there as it goes)
# (GPU_ARGS go to bench/gpu.sh, e.g. "--limit 64" for a check on the CPU). Everything it finds goes
# to $OUT (log.txt is the caller's tee).
set -u
export PYTHONUNBUFFERED=1 PYTHON=python3 BERTHEADS_DATA=/tmp/data
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
mkdir -p /tmp/data && tar xJf .gpu/data.tar.xz -C /tmp/data || exit 3
python3 - <<'PY' || exit 4
import os, shutil, torch, transformers
from safetensors.torch import load_file, save_file
src, dst = ".gpu/model", "/tmp/model"
shutil.copytree(src, dst, dirs_exist_ok=True, ignore=shutil.ignore_patterns("model.bf16.safetensors"))
weights = load_file(os.path.join(src, "model.bf16.safetensors"))
save_file({k: v.float().contiguous() for k, v in weights.items()}, os.path.join(dst, "model.safetensors"),
          metadata={"format": "pt"})
print("torch", torch.__version__, "transformers", transformers.__version__, "cuda", torch.cuda.is_available())
PY
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .gpu/whl/*.whl && export PYTHONPATH=/tmp/site
if ls .gpu/peers/*.whl >/dev/null 2>&1; then  # PEERS=1 bash bench/gpu_bundle.sh: setfit and its needs, apart
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .gpu/peers/*.whl \
    || echo "the peers' wheels did not install: bench/small_data.py skips its setfit runs"
fi
if [ -n "${RUN:-}" ]; then  # another benchmark instead (its own command, on this same setup)
  PYTHONPATH=/tmp/site:src bash -c "$RUN"
  code=$?
  cp bench/out/*.json bench/out/*.jsonl "$OUT"/ 2>/dev/null
  exit $code
fi
if [ -n "${DIAG:-}" ]; then
  PYTHONPATH=/tmp/site:src timeout "${DIAG_SECONDS:-240}" python3 bench/gpu_diag.py /tmp/model "$DIAG" 2>&1 \
    | grep -v -E "Loading weights|MISSING|LOAD REPORT|^Key|^---|^Notes|newly initialized|^$" | tee "$OUT/diag.txt"
fi
for k in ${KINDS:-classify tag qa}; do
  echo "=== $k $(date +%T)"
  timeout "${PER_KIND:-200}" bash bench/gpu.sh --kinds "$k" --model /tmp/model --out "$OUT/gpu-$k.json" \
    --results "$OUT/rows.md" ${GPU_ARGS:-} || echo "FAILED $k rc=$?"
done
echo "=== done $(date +%T)"
