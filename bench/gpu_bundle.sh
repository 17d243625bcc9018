#!/usr/bin/env bash
# Packs what bench/gpu.sh needs on a lent GPU machine into .gpu/ (ignored by git, carried by the
# device tool): the default checkpoint with its weights rounded to bf16 (the fp32 file is 91 MB,
# over the 64 MiB a call carries; bench/gpu_device.sh widens it back to fp32 there, and every side
# starts from those same weights), the benchmark data (xz), and wheels of what that machine lacks
# (seqeval). With PEERS=1 also .gpu/peers/: wheels of the `setfit` peer (bench/small_data.py) and what
# that machine lacks of its needs (datasets, evaluate, dill, multiprocess; it has sentence-transformers,
# pyarrow, pandas, scikit-learn and accelerate), for its Python 3.12, at this venv's versions (about
# 1 MB); gpu_device.sh installs them apart, so a failed install costs the setfit runs only.
# Then, with the device tool: run `bash bench/gpu_device.sh` with carry [".gpu"].
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
python="${PYTHON:-$root/.venv/bin/python}"
data="${BERTHEADS_DATA:-$root/../shared/data}"
cd "$root"
mkdir -p .gpu/whl
exclude="$(git rev-parse --git-path info/exclude 2>/dev/null || echo .git/info/exclude)"  # (a worktree's too)
mkdir -p "$(dirname "$exclude")"
grep -qx "/.gpu/" "$exclude" 2>/dev/null || echo "/.gpu/" >> "$exclude"
"$python" - <<'PY'
import os, shutil
import torch
from safetensors.torch import load_file, save_file
from bertheads.encoder.pretrained import default_model_path
src, dst = default_model_path(), ".gpu/model"
shutil.rmtree(dst, ignore_errors=True)
shutil.copytree(src, dst, ignore=shutil.ignore_patterns("model.safetensors"))
weights = load_file(os.path.join(src, "model.safetensors"))
save_file({k: v.to(torch.bfloat16).contiguous() for k, v in weights.items()},
          os.path.join(dst, "model.bf16.safetensors"), metadata={"format": "pt"})
PY
(cd "$data" && tar cJf "$root/.gpu/data.tar.xz" sst2/train.tsv sst2/dev.tsv conll2003/train.txt conll2003/dev.txt \
  squad/train-split.json squad/eval-split.json squad2/train-split.json squad2/eval-split.json \
  glue/MRPC/train.tsv glue/MRPC/dev.tsv)
"$python" -m pip wheel -q --no-deps -w .gpu/whl "seqeval==$("$python" -c 'import importlib.metadata as m; print(m.version("seqeval"))')"
rm -rf .gpu/peers
if [ "${PEERS:-0}" = 1 ]; then
  peers=$("$python" -c 'import importlib.metadata as m
print(" ".join(f"{n}=={m.version(n)}" for n in ("setfit", "datasets", "evaluate", "dill", "multiprocess")))')
  # shellcheck disable=SC2086  # one argument per package
  "$python" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d .gpu/peers $peers
fi
du -sh .gpu
