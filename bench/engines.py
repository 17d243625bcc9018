"""Engines benchmark: the same model over the same SST-2 sentences (a Parquet file) as a single
process (`Model.predict`), pandas chunks through `BatchPredictor`, `torchrun` 2 ranks (`predict`
sharded by chunk, JSON lines out), Ray Data (`predict --engine ray`, 2 workers) and Spark `local[2]` (`spark_udf`, mapInArrow): rows/s, the job's peak memory
(the summed RSS of the process and everything it started, sampled every 0.2 s), the CPU seconds
of each kind of process it started (by name: the JVM, Python workers, Ray's daemons) and the
core-seconds the machine sat idle, and whether each engine's labels and scores equal
`Model.predict`'s (to 1e-5).

    python bench/engines.py --rows 5000                   # every mode, each in a fresh process
    python bench/engines.py --rows 5000 --modes single,ray
    BENCH_SPARK_SPLIT_KB=16 python bench/engines.py --rows 200000 --modes single,spark   # a row group a Spark task

The model: `--model DIR`, else an untrained two-label classify head on the default checkpoint
(speed does not depend on the head's weights). Each mode runs in its own process, so start-up
(imports, a model load per worker, Ray's or Spark's own start) counts as a user would see it;
`--warm` also gives the rate after start-up where the engine reports it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from common import OUT, cpu_line, require_data, save_json

MODES = ("single", "pandas", "torchrun", "ray", "spark")
# Spark's input split, $BENCH_SPARK_SPLIT_KB (a row group goes to the split holding its middle). By default
# the file's size over max(4, rows / 10,000) tasks: about 10,000 rows a task, as large as the Arrow batches
# Spark hands a worker (what a real archive's 128 MB splits give), and at least two tasks a core. On the
# 200,000-row input (1,000-row groups of ~45 KB) 16 KB gives 200 tasks of one row group and 348 empty ones.
SPARK_SPLIT_KB = os.environ.get("BENCH_SPARK_SPLIT_KB")
SPARK_TASK_ROWS = 10_000
# more of Spark's own settings, "key=value,key=value" (e.g. spark.sql.parquet.compression.codec=none)
SPARK_CONF = dict(kv.split("=", 1) for kv in os.environ.get("BENCH_SPARK_CONF", "").split(",") if kv)
# Ray's rows a task ($BENCH_RAY_ROWS; default: `--rows-per-batch`'s)
RAY_ROWS = os.environ.get("BENCH_RAY_ROWS")


def make_model(out: Path) -> Path:
    """An untrained classify head (two labels) on the default checkpoint."""
    import torch

    from bertheads.encoder.pretrained import Encoder, default_model_path
    from bertheads.model import BertHeads
    from bertheads.saved import bundle

    encoder = Encoder.load(default_model_path())
    cls = bundle.task_class("classify")
    torch.manual_seed(0)
    task = cls.build(cls.spec_type(labels=["negative", "positive"], max_length=128), encoder, encoder.pooler_state)
    bundle.save(BertHeads(encoder, {"sentiment": task}), out)
    return out


def make_input(rows: int, folder: Path) -> Path:
    """The first `rows` SST-2 training sentences (repeated past its end) as one Parquet file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    lines = require_data("sst2", "train.tsv").read_text(encoding="utf-8").splitlines()[1:]
    texts = [line.split("\t")[0] for line in lines]
    texts = [texts[i % len(texts)] for i in range(rows)]
    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"id": list(range(rows)), "text": texts}), folder / "sst2.parquet", row_group_size=1000)
    return folder


class PeakMemory:
    """The largest summed RSS of this process and its descendants, and the CPU seconds each kind
    of process used (this one, `java`, the Python workers, Ray's daemons: by process name), sampled
    in a thread; `idle_s` is the time the machine's cores sat idle meanwhile."""

    def __init__(self) -> None:
        import psutil

        self.psutil = psutil
        self.root = psutil.Process()
        self.peak = 0
        self.cpu: dict[int, tuple[str, float]] = {}  # pid -> (kind, CPU seconds at its last sample)
        self.idle_start = psutil.cpu_times().idle
        self.done = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        while not self.done.wait(0.2):
            total = 0
            for p in [self.root, *self.root.children(recursive=True)]:
                try:
                    total += p.memory_info().rss
                    times = p.cpu_times()
                    kind = "driver" if p.pid == self.root.pid else p.name()
                    self.cpu[p.pid] = (kind, times.user + times.system)
                except Exception:  # a process that ended meanwhile
                    pass
            self.peak = max(self.peak, total)

    def stop(self) -> tuple[float, dict[str, float], float]:
        """(peak MiB, CPU seconds and processes by kind of process, idle core-seconds)."""
        self.done.set()
        self.thread.join()
        by_kind: dict[str, float] = {}
        for kind, seconds in self.cpu.values():
            by_kind[kind] = round(by_kind.get(kind, 0.0) + seconds, 1)
            by_kind[f"{kind} processes"] = by_kind.get(f"{kind} processes", 0) + 1
        return self.peak / 2**20, by_kind, self.psutil.cpu_times().idle - self.idle_start


def run_mode(mode: str, model: str, source: Path, out: Path) -> dict:
    """Run one mode in this process; its predictions are written to `out` (Parquet)."""
    import pyarrow.parquet as pq

    memory = PeakMemory()
    start = time.perf_counter()
    extra = {}
    if mode == "single":
        import bertheads

        m = bertheads.load(model, device="cpu", runtime="torch", precision="fp32")
        texts = pq.read_table(source).column("text").to_pylist()
        loaded = time.perf_counter()
        preds = m.predict(texts, head="sentiment")
        extra["after_start_s"] = time.perf_counter() - loaded
        import pyarrow as pa

        pq.write_table(pa.table({"id": list(range(len(texts))), "label": [p["label"] for p in preds],
                                 "pos": [p["scores"]["positive"] for p in preds]}), out / "part.parquet")
    elif mode == "pandas":
        import bertheads

        predictor = bertheads.BatchPredictor(model)
        loaded = time.perf_counter()
        file = pq.ParquetFile(source / "sst2.parquet")
        for g in range(file.num_row_groups):
            chunk = predictor(file.read_row_group(g).to_pandas())
            chunk.to_parquet(out / f"part-{g:05}.parquet")
        extra["after_start_s"] = time.perf_counter() - loaded
    elif mode == "torchrun":  # 2 single-threaded ranks; the input must be a file, the output JSON lines
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                               "-m", "bertheads", "predict", model, "--input", str(source / "sst2.parquet"),
                               "--output", str(out / "torchrun.jsonl"), "--runtime", "torch", "--precision", "fp32",
                               "--device", "cpu", "-q"], env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-3000:]
    elif mode == "ray":
        from bertheads.cli.main import main

        code = main(["predict", model, "--input", str(source), "--output", str(out / "ray"), "--engine", "ray",
                     "--workers", "2", "--runtime", "torch", "--precision", "fp32",
                     "--device", "cpu", "-q", *(["--rows-per-batch", RAY_ROWS] if RAY_ROWS else [])])
        assert code == 0
        extra["job_s"] = json.loads((out / "ray" / "summary.json").read_text())["seconds"]
    elif mode == "spark":
        os.environ["PYSPARK_PYTHON"] = sys.executable
        os.environ["OMP_NUM_THREADS"] = "1"  # a Python worker per core, one thread each
        from pyspark.sql import SparkSession

        import bertheads

        rows = pq.ParquetFile(source / "sst2.parquet").metadata.num_rows
        split = (int(SPARK_SPLIT_KB) * 1024 if SPARK_SPLIT_KB else
                 (source / "sst2.parquet").stat().st_size // max(4, -(-rows // SPARK_TASK_ROWS)) + 1)
        spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
                 .config("spark.sql.files.maxPartitionBytes", str(split)))
        for key, value in SPARK_CONF.items():
            spark = spark.config(key, value)
        spark = spark.getOrCreate()
        df = spark.read.parquet(str(source))
        bertheads.spark_predict(df, model, heads=["sentiment"]).write.parquet(str(out / "spark"))
        spark.stop()
    seconds = time.perf_counter() - start
    peak, cpu, idle = memory.stop()
    return {"mode": mode, "seconds": seconds, "peak_mib": peak, "cpu_s": cpu, "idle_core_s": round(idle, 1), **extra}


def compare(out: Path, mode: str, reference: dict[int, tuple]) -> dict:
    """Rows, label agreement and the largest score difference against the single process."""
    import pyarrow.parquet as pq

    if mode == "torchrun":
        table = [json.loads(line) for line in (out / "torchrun.jsonl").read_text().splitlines()]
    else:
        table = pq.read_table(sorted(str(p) for p in out.rglob("*.parquet"))).to_pylist()
    if mode == "torchrun":
        got = {int(r["id"]): (r["label"], r["scores"]["positive"]) for r in table}
    elif mode == "single":
        got = {r["id"]: (r["label"], r["pos"]) for r in table}
    else:
        got = {r["id"]: (r["sentiment_label"], r["sentiment_scores"]["positive"]) for r in table}
    same = sum(got[i][0] == reference[i][0] for i in reference if i in got)
    diff = max((abs(got[i][1] - reference[i][1]) for i in reference if i in got), default=float("nan"))
    return {"rows_out": len(table), "unique_ids": len(got), "labels_equal": same, "max_score_diff": diff}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=5000, help="SST-2 sentences to predict")
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated: " + ", ".join(MODES))
    parser.add_argument("--model", help="model directory (default: an untrained head on the default checkpoint)")
    parser.add_argument("--one", nargs=3, metavar=("MODE", "SOURCE", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        mode, source, out = args.one
        print(json.dumps(run_mode(mode, args.model, Path(source), Path(out))))
        return
    work = Path(tempfile.mkdtemp(prefix="engines-", dir=OUT if OUT.is_dir() else None))
    model = args.model or str(make_model(work / "model"))
    source = make_input(args.rows, work / "in")
    results, reference = [], None
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": str(Path(__file__).parents[1] / "src")}
    for mode in ["single", *[m for m in args.modes.split(",") if m != "single"]]:
        out = work / mode
        out.mkdir()
        done = subprocess.run([sys.executable, __file__, "--model", model, "--one", mode, str(source), str(out)],
                              env=env, capture_output=True, text=True)
        if done.returncode != 0:
            print(f"{mode}: failed\n{done.stderr[-3000:]}", file=sys.stderr)
            continue
        record = json.loads(done.stdout.strip().splitlines()[-1])
        if reference is None:
            import pyarrow.parquet as pq

            ref = pq.read_table(str(out / "part.parquet")).to_pylist()
            reference = {r["id"]: (r["label"], r["pos"]) for r in ref}
        record.update(compare(out, mode, reference))
        record["rows_per_s"] = args.rows / record["seconds"]
        results.append(record)
        print(json.dumps(record), flush=True)
    base = results[0]["rows_per_s"]
    print(f"\n{args.rows:,} rows; {cpu_line()}\n")
    print("| mode | seconds | rows/s | vs single | CPU seconds by process | idle core-s | peak memory (MiB) | "
          "labels equal | max score diff |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        cpu = ", ".join(f"{k} {v:.1f}" for k, v in r.get("cpu_s", {}).items() if not k.endswith("processes") and v >= 1)
        print(f"| {r['mode']} | {r['seconds']:.1f} | {r['rows_per_s']:.0f} | {r['rows_per_s'] / base:.2f} | {cpu} | "
              f"{r.get('idle_core_s', float('nan')):.1f} | {r['peak_mib']:.0f} | {r['labels_equal']}/{args.rows} | "
              f"{r['max_score_diff']:.1e} |")
    save_json("engines", {"rows": args.rows, "results": results, "machine": cpu_line()})


if __name__ == "__main__":
    main()
