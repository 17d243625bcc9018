#!/usr/bin/env bash
# Packs what bench/gpu.sh needs on a lent GPU machine into .gpu/ (ignored by git, carried by the
# device tool): the default checkpoint with its weights rounded to bf16 (the fp32 file is 91 MB,
# over the 64 MiB a call carries; bench/gpu_device.sh widens it back to fp32 there, and every side
# starts from those same weights), the benchmark data (xz), and wheels of what that machine lacks
# (seqeval). Then, with the device tool: run `bash bench/gpu_device.sh` with carry [".gpu"].
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
python="${PYTHON:-$root/.venv/bin/python}"
data="${BERTHEADS_DATA:-$root/../shared/data}"
cd "$root"
mkdir -p .git/info .gpu/whl
grep -qx "/.gpu/" .git/info/exclude 2>/dev/null || echo "/.gpu/" >> .git/info/exclude
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
du -sh .gpu
