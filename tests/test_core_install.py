"""A core-only install (no extra) trains, predicts and evaluates, and a command that needs an
extra names it. pip resolves the core install from the project's files (no extra among what it
would install); the package is built as a wheel and installed into a fresh virtualenv, whose
other packages are this environment's copies of exactly those, linked in, so it is the core
install's environment without downloading it again."""

import importlib.metadata
import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXTRAS = ("fastapi", "uvicorn", "optuna", "onnxruntime", "openvino", "matplotlib", "mlflow-skinny", "tensorboard",
          "ray", "pyspark", "dask")

def normal(name: str) -> str:
    return name.lower().replace("_", "-")


@pytest.mark.slow
def test_core_install_trains_predicts_evaluates(tmp_path):
    wheel = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path / "dist"),
                            str(ROOT)], capture_output=True, text=True, timeout=600)
    assert wheel.returncode == 0, wheel.stderr[-2000:]
    built = next((tmp_path / "dist").glob("bertheads-*.whl"))
    report = tmp_path / "report.json"  # what pip would install for the wheel (its metadata is the project's)
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "-q",
                          "--report", str(report), "-c", str(ROOT / "constraints.txt"), str(built)],
                         capture_output=True, text=True, timeout=600)
    if pip.returncode != 0 and ("No matching distribution" in pip.stderr or "connection" in pip.stderr.lower()):
        pytest.skip(f"no package index reachable: {pip.stderr.strip().splitlines()[-1]}")
    assert pip.returncode == 0, pip.stderr[-2000:]
    core = {normal(item["metadata"]["name"]) for item in json.loads(report.read_text())["install"]}
    assert {"torch", "transformers", "safetensors", "accelerate"} <= core and not core & set(EXTRAS), core

    venv = tmp_path / "core"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)  # this pip installs into it
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": ""}
    installed = subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin/python"), "install", "-q",
                                "--no-deps", "--no-index", "--force-reinstall", str(built)],
                               capture_output=True, text=True, env=env)
    assert installed.returncode == 0, installed.stderr[-2000:]
    # the core's packages are this environment's, linked into a folder of their own: the rest is absent
    here, deps = Path(sysconfig.get_paths()["purelib"]), tmp_path / "deps"
    deps.mkdir()
    for dist in importlib.metadata.distributions():
        if normal(dist.metadata["Name"]) in core - {"bertheads"}:
            for top in {Path(f).parts[0] for f in dist.files or [] if not str(f).startswith("..")}:
                if (here / top).exists() and not (deps / top).exists():
                    (deps / top).symlink_to(here / top)
    site = Path(subprocess.run([str(venv / "bin/python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True, env=env).stdout.strip())
    (site / "core_deps.pth").write_text(f"{deps}\n")
    examples, model = ROOT / "examples/sentiment", tmp_path / "m"

    assert "from bertheads.cli.main import command" in (venv / "bin/bertheads").read_text()  # the console script
    # every command in one process (each would pay the start-up again)
    script = (f"import importlib.util, json, sys, bertheads; from bertheads.cli.main import main\n"
              f"print(bertheads.__file__, importlib.util.find_spec('fastapi') is None, flush=True)\n"
              f"codes = [main(['train', 'classify', '--train', {str(examples / 'train.tsv')!r}, '--dev',\n"
              f"               {str(examples / 'dev.tsv')!r}, '--out', {str(model)!r}, '--epochs', '1', '--no-progress'])]\n"
              f"sys.stdin = __import__('io').StringIO('A warm film.\\n')\n"
              f"codes += [main(['predict', {str(model)!r}]),\n"
              f"          main(['evaluate', {str(model)!r}, '--data', {str(examples / 'dev.tsv')!r}, '--json']),\n"
              f"          main(['train', 'classify', '--train', {str(examples / 'train.tsv')!r}, '--out',\n"
              f"                {str(tmp_path / 't')!r}, '--track', 'mlflow']),\n"
              f"          main(['serve', {str(model)!r}])]\n"
              f"print(json.dumps(codes))\n")
    ran = subprocess.run([str(venv / "bin/python"), "-c", script], capture_output=True, text=True, env=env,
                         timeout=600)
    where, trained, *answers, codes = ran.stdout.strip().splitlines()
    assert where.split() == [str(site / "bertheads/__init__.py"), "True"], ran.stdout + ran.stderr
    assert json.loads(codes) == [0, 0, 0, 2, 2], ran.stdout + ran.stderr
    assert (model / "bertheads.json").is_file() and '"dev"' in trained
    assert '"label"' in answers[0] and '"accuracy"' in answers[1], ran.stdout
    assert "pip install 'bertheads[track]'" in ran.stderr and "pip install 'bertheads[serve]'" in ran.stderr, ran.stderr
