"""Public text-classification sets no one here wrote, kept outside the repository (several may not
be redistributed) in `PUBLIC` (`$BERTHEADS_PUBLIC_SETS`, default /work/cache/public-sets).

| name | classes | train / test | source | files here |
|---|---|---|---|---|
| trec | 6 coarse question types (ABBR, DESC, ENTY, HUM, LOC, NUM) | 5,452 / 500 | Li and Roth 2002 (TREC-10 question classification), the original `train_5500.label` and `TREC_10.label` as committed in github.com/FreedomIntelligence/qnn `data/TREC/` (commit in `SETS`) | `trec/train.tsv`, `trec/test.tsv` (header `text<TAB>label`; `fine` labels in `train_fine.tsv`/`test_fine.tsv`) |
| goemotions-ekman | 7 emotions, multi-label (anger, disgust, fear, joy, neutral, sadness, surprise; 8% of rows hold two or more) | 43,410 / 5,426 dev / 5,427 | GoEmotions (Demszky et al. 2020), Reddit comments, in Ekman's grouping as committed in github.com/monologg/GoEmotions-pytorch `data/ekman/` (commit in `SETS`) | `goemotions-ekman/{train,dev,test}.jsonl` (`{"text": ..., "label": [names]}`) |
| sst2 | 2 (sentiment) | 67,349 / 872 | GLUE SST-2, `$BERTHEADS_DATA/sst2` (read in place, not copied) | - |

Each `.label` line is `COARSE:fine question text` (Latin-1; one train line has a byte outside
ASCII). The TSVs are what bertheads reads as is (`--train trec/train.tsv`); the texts hold no tab.

```
python bench/public_sets.py --setup        # re-create PUBLIC/NAME from the mirrors (fetch github:FreedomIntelligence/qnn and github:monologg/GoEmotions-pytorch first)
python bench/public_sets.py --setup --set goemotions-ekman
python bench/public_sets.py                # say what is there: rows and classes per split
```
`--setup` reads the files with `git --git-dir=MIRROR show COMMIT:PATH` (`--mirror` names the git
directory; default /work/.mirror/FreedomIntelligence+qnn/repo), checks their sha256, writes the
TSVs atomically and touches PUBLIC/READY.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import DATA  # noqa: E402

PUBLIC = Path(os.environ.get("BERTHEADS_PUBLIC_SETS", "/work/cache/public-sets"))


@dataclass(frozen=True)
class Source:
    """Where a set's files come from: a public GitHub repository at one commit, each split's path
    in it and the sha256 of that file's bytes."""

    repo: str
    commit: str
    files: dict  # split -> (path in the repository, sha256)
    mirror: str


SETS = {
    "trec": Source(
        repo="FreedomIntelligence/qnn",
        commit="77f549372d4371e7f2d52e77bc18df5096dd4779",
        files={"train": ("data/TREC/train_5500.label",
                         "8bd6e79493f43bbd22c364587366a1dced54e1e31259eaa92721a0f526031116"),
               "test": ("data/TREC/TREC_10.label",
                        "86ad53c8fc9d397ab2f4be7c967d8efb470b260140557d3e57afad69d1b88b76")},
        mirror="/work/.mirror/FreedomIntelligence+qnn/repo"),
    "goemotions-ekman": Source(
        repo="monologg/GoEmotions-pytorch",
        commit="b75f9d3a8b76bc1060687925b04ca98a1b8ea66b",
        files={"labels": ("data/ekman/labels.txt", "5ecd91c315ebf550ac798f06549e35a6ee1fb90866608fd640c24d520dc6aa0c"),
               "train": ("data/ekman/train.tsv", "bb74d10aec0975674c665205741ba9fe644cd70f682214624997f3770fd9e53f"),
               "dev": ("data/ekman/dev.tsv", "011e6579adc4d9bb2ffd908879b99e1594e7647b262cbb2e1c5c9c1c4d7d8bcc"),
               "test": ("data/ekman/test.tsv", "f9f9b91827fe134259469368b93abddc2a52e2e2a87beab661023b06cf490baa")},
        mirror="/work/.mirror/monologg+GoEmotions-pytorch/repo"),
}
MULTI_LABEL = {"goemotions-ekman"}  # written as JSON lines with a list of labels

# The binary set: GLUE SST-2 from the shared data (its dev split is the test split here).
BINARY = {"sst2": {"train": DATA / "sst2" / "train.tsv", "test": DATA / "sst2" / "dev.tsv"}}


def path(name: str, split: str) -> Path:
    """The TSV of a set's split ("train" or "test"): `header text|sentence<TAB>label`."""
    if name in BINARY:
        return BINARY[name][split]
    if name not in SETS:
        raise SystemExit(f"unknown set {name!r} (sets: {', '.join([*BINARY, *SETS])})")
    found = PUBLIC / name / f"{split}.{'jsonl' if name in MULTI_LABEL else 'tsv'}"
    if not found.exists():
        raise SystemExit(f"{found} not found: run python bench/public_sets.py --setup")
    return found


def read(name: str, split: str) -> tuple[list[str], list]:
    """A split's texts and label names (a multi-label set: lists of names), in file order."""
    if name in MULTI_LABEL:
        rows = [json.loads(line) for line in path(name, split).read_text(encoding="utf-8").splitlines() if line.strip()]
        return [r["text"] for r in rows], [r["label"] for r in rows]
    lines = path(name, split).read_text(encoding="utf-8").split("\n")[1:]
    rows = [line.split("\t") for line in lines if line.strip()]
    return [r[0] for r in rows], [r[1] for r in rows]


def parse_label_file(data: bytes) -> list[tuple[str, str, str]]:
    """(coarse, fine, text) of each line of a TREC `.label` file."""
    rows = []
    for line in data.decode("latin-1").splitlines():
        if not line.strip():
            continue
        label, _, text = line.partition(" ")
        coarse, _, fine = label.partition(":")
        rows.append((coarse, fine, " ".join(text.replace("\t", " ").split())))
    return rows


def parse_goemotions(data: bytes, names: list[str]) -> list[tuple[str, list[str]]]:
    """(text, label names) of each line of a GoEmotions TSV (`text<TAB>i,j<TAB>id`)."""
    rows = []
    for line in data.decode("utf-8").splitlines():
        if line.strip():
            text, labels, _ = line.split("\t")
            rows.append((text, [names[int(i)] for i in labels.split(",")]))
    return rows


def write_atomic(target: Path, text: str) -> None:
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(target)


def setup(name: str, mirror: str | None) -> None:
    """Write PUBLIC/name's TSVs from the repository mirror at the set's commit."""
    source = SETS[name]
    git_dir = mirror or source.mirror
    folder = PUBLIC / name
    folder.mkdir(parents=True, exist_ok=True)
    names = None
    for split, (file, sha) in source.files.items():
        try:
            data = subprocess.run(["git", "--git-dir", git_dir, "show", f"{source.commit}:{file}"],
                                  check=True, capture_output=True).stdout
        except (subprocess.CalledProcessError, FileNotFoundError) as exc:
            raise SystemExit(f"cannot read {file} at {source.commit} from {git_dir} "
                             f"(fetch github:{source.repo} first): {exc}") from None
        if data.startswith(b"version https://git-lfs"):
            raise SystemExit(f"{source.repo}:{file} is a Git LFS pointer, not the data")
        got = hashlib.sha256(data).hexdigest()
        if got != sha:
            raise SystemExit(f"{source.repo}:{file}: sha256 {got}, expected {sha}")
        if split == "labels":
            names = data.decode("utf-8").split()
            continue
        if name in MULTI_LABEL:
            write_atomic(folder / f"{split}.jsonl", "".join(json.dumps({"text": t, "label": labels}) + "\n"
                                                            for t, labels in parse_goemotions(data, names)))
            continue
        rows = parse_label_file(data)
        write_atomic(folder / f"{split}.tsv", "text\tlabel\n" + "".join(f"{t}\t{c}\n" for c, _, t in rows))
        write_atomic(folder / f"{split}_fine.tsv",
                     "text\tlabel\n" + "".join(f"{t}\t{c}:{f}\n" for c, f, t in rows))
    write_atomic(folder / "SOURCE", f"github.com/{source.repo} commit {source.commit}\n"
                 + "".join(f"{split}: {file} sha256 {sha}\n" for split, (file, sha) in source.files.items()))
    (PUBLIC / "READY").touch()


def describe() -> None:
    for name in [*BINARY, *SETS]:
        for split in ("train", "dev", "test") if name in MULTI_LABEL else ("train", "test"):
            try:
                _, labels = read(name, split)
            except SystemExit as exc:
                print(f"{name} {split}: {exc}")
                continue
            counts = collections.Counter(x for v in labels for x in (v if isinstance(v, list) else [v]))
            print(f"{name} {split}: {len(labels)} rows, {len(counts)} classes: "
                  + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--setup", action="store_true", help="re-create the sets' folders from the mirrors")
    parser.add_argument("--set", choices=tuple(SETS), help="only this set (default: every one)")
    parser.add_argument("--mirror", help="the git directory of the set's repository (default: SETS' mirror)")
    args = parser.parse_args()
    if args.setup:
        for name in [args.set] if args.set else SETS:
            setup(name, args.mirror)
    describe()


if __name__ == "__main__":
    main()
