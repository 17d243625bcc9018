#!/usr/bin/env bash
# A virtualenv of its own for the question-answering pipeline peer: transformers 5 dropped
# pipeline("question-answering"), so bench/qa.py runs it with transformers 4.57 from here.
# torch comes from the same local wheel as the project's venv. Idempotent.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
venv="$here/.venv-qa-peer"
python="${PYTHON:-python3}"
if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c 'import transformers, torch; assert transformers.__version__.startswith("4.57")' 2>/dev/null; then
    exit 0
fi
"$python" -m venv "$venv"
"$venv/bin/python" -m pip install -q --upgrade pip
"$venv/bin/python" -m pip install -q "torch==2.13.0" "transformers>=4.57,<4.58" numpy
"$venv/bin/python" -c 'import transformers, torch; print("peer venv:", "transformers", transformers.__version__, "torch", torch.__version__)'
