"""Training that survives: checkpoints and exact resume, kills at any step and at each point of
a save, refusals, no silent overwrite, the training log, early stopping, gradient accumulation,
class weights and training on from a saved model (tiny BERT)."""

import json
import os
import random
import signal
import time
from pathlib import Path

import pytest
import torch
from forkserver import ForkServer
from safetensors.torch import load_file

import bertheads
from bertheads.base.errors import UserError
from bertheads.cli.main import main
from bertheads.saved import bundle
from bertheads.training import checkpoint

SRC = str(Path(__file__).resolve().parents[1] / "src")
STEPS = 12  # 48 examples, batches of 8, 2 epochs


def rows(n=24):
    good = ["great", "wonderful", "superb", "lovely"]
    bad = ["awful", "boring", "terrible", "dreadful"]
    return [(f"a {good[i % 4]} movie {i}", 1) for i in range(n)] + [(f"an {bad[i % 4]} film {i}", 0) for i in range(n)]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("resume")
    (d / "train.tsv").write_text("sentence\tlabel\n" + "".join(f"{t}\t{y}\n" for t, y in rows()))
    return d


def argv(tiny_bert, data, out, *extra):
    return ["train", "classify", "--train", str(data / "train.tsv"), "--dev", str(data / "train.tsv"), "--out",
            str(out), "--model", tiny_bert, "--epochs", "2", "--batch-size", "8", "--lr", "1e-3", "--no-progress",
            "--log-every", "1", "--save-every", "3", *extra]


@pytest.fixture(scope="module")
def forks(tmp_path_factory):
    """Children forked from one process that imported everything (tests/forkserver.py)."""
    server = ForkServer(tmp_path_factory.mktemp("forks"))
    yield server
    server.close()


def run_cli(forks, args, crash_at=None, cwd=None):
    """`python -m bertheads *args` in a child of its own (killed at `crash_at`, a crash point)."""
    return forks.run(args, env={checkpoint_env(): crash_at} if crash_at else {}, unset=(checkpoint_env(),), cwd=cwd)


def checkpoint_env():
    from bertheads.store.crash import CRASH_ENV

    return CRASH_ENV


def train_losses(out):
    return [r for r in map(json.loads, (Path(out) / "log.jsonl").read_text().splitlines()) if r["type"] == "train"]


def same_weights(a, b):
    for name in ("heads/classify.safetensors", "encoder/model.safetensors"):
        x, y = load_file(str(Path(a) / name)), load_file(str(Path(b) / name))
        assert x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x), name


@pytest.fixture(scope="module")
def whole_run(tiny_bert, data, forks):
    out = data / "whole"
    proc = run_cli(forks, argv(tiny_bert, data, out))
    assert proc.returncode == 0, proc.stderr
    return out


@pytest.mark.slow  # runs extra processes (torchrun, kills, signals)
def test_kill_at_a_random_step_then_resume_equals_the_uninterrupted_run(tiny_bert, data, whole_run, forks):
    step = int(os.environ.get("RESUME_KILL_STEP", 0)) or random.randrange(1, STEPS)  # (a step to reproduce one)
    out = data / f"killed-{step}"
    killed = run_cli(forks, argv(tiny_bert, data, out), crash_at=f"train:step:{step}")
    assert killed.returncode == -signal.SIGKILL, f"step {step}: {killed.stderr}"
    if step > 6:  # the first epoch's model was saved: a kill during training leaves it loadable
        assert bertheads.load(out).predict(["a great movie"])[0]["label"] in (0, 1)
    if step > 3:  # (killed at step 3 before its checkpoint is written)
        assert checkpoint.exists(out)
        resumed = run_cli(forks, argv(tiny_bert, data, out, "--resume"))
    else:  # killed before the first checkpoint: nothing to resume, a fresh start is refused without --overwrite
        assert not checkpoint.exists(out)
        resumed = run_cli(forks, argv(tiny_bert, data, out, "--overwrite"))
    assert resumed.returncode == 0, f"step {step}: {resumed.stderr}"
    same_weights(whole_run, out)
    whole, again = train_losses(whole_run), train_losses(out)
    assert [r["step"] for r in again] == list(range(1, STEPS + 1)) == [r["step"] for r in whole]
    assert max(abs(a["loss"] - b["loss"]) for a, b in zip(whole, again)) <= 1e-6, f"killed at step {step}"
    assert not (out / "checkpoint").exists()  # a finished run removes its checkpoint


@pytest.mark.slow  # runs extra processes (torchrun, kills, signals)
def test_resume_refusals_leave_out_untouched(tiny_bert, data, capsys, forks):
    out = data / "refusals"
    killed = run_cli(forks, argv(tiny_bert, data, out), crash_at="train:step:4")
    assert killed.returncode == -signal.SIGKILL

    def snapshot():
        return sorted((str(p.relative_to(out)), p.stat().st_mtime_ns, p.stat().st_size) for p in out.rglob("*"))

    before = snapshot()
    cases = [
        (["--lr", "2e-3", "--resume"], "was made with --lr 0.001, this run has 0.002"),
        (["--limit", "40", "--resume"], "other training or dev data"),
        ([], "holds the checkpoint of an unfinished run; add --overwrite"),
        (["--resume", "--overwrite"], "choose one"),
    ]
    for extra, needle in cases:
        assert main(argv(tiny_bert, data, out, *extra)) == 2
        err = capsys.readouterr().err.splitlines()
        # one error line, the last; before it at most what the run settled (said first, before any stage)
        assert needle in err[-1] and err[-1].startswith("bertheads: error: "), err
        assert all(" training examples " in line for line in err[:-1]) and len(err) <= 2, err
        assert snapshot() == before
    # a damaged checkpoint: one line, nothing touched
    weights = out / "checkpoint" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    before = snapshot()
    assert main(argv(tiny_bert, data, out, "--resume")) == 2
    err = capsys.readouterr().err.splitlines()
    assert "damaged checkpoint" in err[-1] and err[-1].startswith("bertheads: error: "), err
    assert all(" training examples " in line for line in err[:-1]) and len(err) <= 2, err
    assert snapshot() == before
    assert main(argv(tiny_bert, data, data / "nothing-here", "--resume")) == 2
    assert "holds no checkpoint" in capsys.readouterr().err


SAVE_SCRIPT = """
import os, sys
from bertheads.store import atomic
from bertheads.saved import bundle
if sys.argv[3] == "rename":
    atomic.exchange = lambda a, b: False  # the two-rename path of systems without an atomic exchange
model = bundle.load(sys.argv[1])
bundle.save(model, sys.argv[2], {"dev": {"new": True}})
"""


@pytest.mark.parametrize("how,point", [("exchange", "model:written"), ("exchange", "model:synced"),
                                       ("exchange", "model:swapped"), ("rename", "model:set-aside"),
                                       ("rename", "model:swapped")])
@pytest.mark.slow  # runs extra processes (torchrun, kills, signals)
def test_kill_at_each_point_of_a_save_leaves_a_loadable_model(whole_run, tmp_path, how, point, forks):
    out = tmp_path / "model"
    bundle.save(bundle.load(whole_run), out, {"dev": {"new": False}})
    (out / "log.jsonl").write_text("{}\n")
    proc = forks.run_script(SAVE_SCRIPT, [whole_run, out, how], env={checkpoint_env(): point})
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    if how == "exchange":  # at every moment OUT is a whole model, the old one or the new one
        model = bertheads.load(out)
        assert model.predict(["a great movie"])[0]["label"] in (0, 1)
        new = json.loads((out / "metrics.json").read_text())["dev"]["new"]
        assert new is (point == "model:swapped")
        assert (out / "log.jsonl").read_text() == "{}\n"  # the run's files travel with the model
    # the next save (or run) puts an old model set aside back, and removes the leftovers
    bundle.save(bundle.load(whole_run) if not (out / bundle.MANIFEST).is_file() else bundle.load(out), out)
    assert bertheads.load(out).predict(["a great movie"])
    assert [p.name for p in tmp_path.iterdir()] == ["model"]


@pytest.mark.slow  # runs extra processes (torchrun, kills, signals)
def test_kill_while_a_checkpoint_is_written_keeps_one_to_resume(tiny_bert, data, whole_run, forks):
    out = data / "ckpt-kill"
    killed = run_cli(forks, argv(tiny_bert, data, out), crash_at="checkpoint:synced:2")  # writing the second checkpoint
    assert killed.returncode == -signal.SIGKILL
    state = json.loads((out / "checkpoint" / "state.json").read_text())
    assert state["progress"]["step"] == 3  # the first one is whole
    resumed = run_cli(forks, argv(tiny_bert, data, out, "--resume"))
    assert resumed.returncode == 0, resumed.stderr
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # the half-written one is gone
    same_weights(whole_run, out)


@pytest.mark.slow  # runs extra processes (torchrun, kills, signals)
def test_ctrl_c_saves_a_checkpoint_and_says_how_to_resume(tiny_bert, data, forks):
    out = data / "interrupted"
    args = argv(tiny_bert, data, out)
    args[args.index("--epochs") + 1] = "50"
    pid = forks.start(args, unset=(checkpoint_env(),))
    log = out / "log.jsonl"
    deadline = time.time() + 300
    while time.time() < deadline and not (log.is_file() and len(log.read_text().splitlines()) >= 2):
        time.sleep(0.2)
    os.kill(pid, signal.SIGINT)
    done = forks.finish()
    err = done.stderr
    assert done.returncode == 130, err
    assert "--resume" in err and "checkpoint saved" in err
    state = json.loads((out / "checkpoint" / "state.json").read_text())
    assert state["progress"]["step"] == train_losses(out)[-1]["step"]


def test_no_silent_overwrite(tiny_bert, data, whole_run, tmp_path, capsys):
    out = tmp_path / "m"
    bundle.save(bundle.load(whole_run), out)
    stamp = (out / "heads" / "classify.safetensors").read_bytes()
    assert main(argv(tiny_bert, data, out, "--epochs", "1")) == 2
    assert "holds a model from another run; add --overwrite" in capsys.readouterr().err
    assert (out / "heads" / "classify.safetensors").read_bytes() == stamp
    assert main(argv(tiny_bert, data, out, "--epochs", "1", "--overwrite")) == 0
    assert (out / "heads" / "classify.safetensors").read_bytes() != stamp


def test_log_schema_eval_every_and_patience(tiny_bert, data, tmp_path):
    out = tmp_path / "m"
    settings = bertheads.TrainSettings(epochs=4, batch_size=8, lr=1e-3, progress=False, eval_every=2, patience=2,
                                       log_every=2)
    bertheads.train("classify", str(data / "train.tsv"), str(data / "train.tsv"), out, model=tiny_bert,
                    settings=settings)
    records = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    train = [r for r in records if r["type"] == "train"]
    evals = [r for r in records if r["type"] == "eval"]
    assert train and all(set(r) == {"type", "step", "epoch", "loss", "lr", "examples_per_second"} for r in train)
    assert all(isinstance(r["step"], int) and isinstance(r["loss"], float) for r in train)
    assert all(set(r) == {"type", "step", "epoch", "dev", "kept"} for r in evals)
    assert all(set(r["dev"]) == {"classify"} and "loss" in r["dev"]["classify"] for r in evals)
    assert [r["step"] for r in evals] == list(range(2, 2 * len(evals) + 1, 2))  # every 2 steps (epochs end at 6k)
    last_kept = max(i for i, r in enumerate(evals) if r["kept"])
    if evals[-1]["step"] < 24:  # stopped early: the last 2 evaluations did not improve
        assert len(evals) - 1 - last_kept == 2
    else:
        assert len(evals) - 1 - last_kept < 2
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["kept"]["epoch"] == evals[last_kept]["epoch"]


def tiny_without_dropout(tiny_bert, tmp_path):
    from transformers import AutoTokenizer, BertConfig, BertModel

    config = BertConfig.from_pretrained(tiny_bert, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    BertModel.from_pretrained(tiny_bert, config=config).save_pretrained(str(tmp_path / "nodrop"))
    AutoTokenizer.from_pretrained(tiny_bert).save_pretrained(str(tmp_path / "nodrop"))
    return str(tmp_path / "nodrop")


def test_grad_accum_matches_the_larger_batch(tiny_bert, data, tmp_path):
    model = tiny_without_dropout(tiny_bert, tmp_path)
    results = {}
    for batch, accum in ((8, 1), (4, 2), (2, 4)):
        settings = bertheads.TrainSettings(epochs=1, batch_size=batch, grad_accum=accum, lr=1e-3, progress=False,
                                           log_every=1)
        out = tmp_path / f"b{batch}"
        bertheads.train("classify", str(data / "train.tsv"), None, out, model=model, settings=settings, dropout=0.0)
        results[batch] = (load_file(str(out / "heads" / "classify.safetensors")), train_losses(out))
    ref_weights, ref_losses = results[8]
    for batch in (4, 2):
        weights, losses = results[batch]
        assert len(losses) == len(ref_losses) == 6  # one step per 8 examples
        assert all(abs(a["loss"] - b["loss"]) < 1e-5 for a, b in zip(losses, ref_losses))
        assert all(torch.allclose(weights[k], ref_weights[k], atol=1e-5) for k in weights)


def test_class_weights_balanced(tiny_bert, write, tmp_path):
    lopsided = write("lop.tsv", "sentence\tlabel\n" + "a good one\tpos\n" * 6 + "a bad one\tneg\n" * 2)
    settings = bertheads.TrainSettings(epochs=1, batch_size=4, progress=False)
    model = bertheads.train("classify", lopsided, None, tmp_path / "w", model=tiny_bert, settings=settings,
                            class_weights="balanced")
    task = model.task()
    assert task.spec.labels == ["neg", "pos"] and task.spec.label_weights == pytest.approx([2.0, 2 / 3])
    logits = torch.tensor([[0.3, -0.2], [1.0, 0.5], [0.0, 2.0]])
    labels = torch.tensor([0, 1, 1])
    expected = torch.nn.functional.cross_entropy(logits, labels, weight=torch.tensor([2.0, 2 / 3]))
    assert torch.allclose(task.modeling.loss(logits, {"labels": labels}), expected)
    assert not torch.allclose(expected, torch.nn.functional.cross_entropy(logits, labels))
    multi = write("multi.jsonl", '{"text": "a", "labels": ["x", "y"]}\n{"text": "b", "labels": ["x"]}\n')
    with pytest.raises(UserError, match="only for single-label"):
        bertheads.train("classify", multi, None, tmp_path / "m", model=tiny_bert, settings=settings,
                        class_weights="balanced")


def test_model_dir_trains_its_head_further_or_a_new_one(whole_run, data, tmp_path, caplog):
    from bertheads.encoder.pretrained import Encoder
    from bertheads.training.joint import continue_heads, prepare_task

    saved = bundle.load(whole_run)
    encoder = Encoder.load(str(whole_run / "encoder"))
    same = prepare_task("classify", str(data / "train.tsv"), None, encoder, {"max_length": 128}, name="classify")
    counts = dict(same.task.spec.trained_counts)
    assert saved.tasks["classify"].spec.trained_counts == counts and sum(counts.values()) == len(rows())
    continue_heads(saved, [same], str(whole_run))
    state, old = same.task.head.state_dict(), saved.heads["classify"].state_dict()
    assert all(torch.equal(state[k], old[k]) for k in old)
    assert same.task.spec.trained_counts == {k: 2 * n for k, n in counts.items()}  # the head has seen both runs' data
    other = tmp_path / "three.tsv"
    other.write_text("sentence\tlabel\n" + "".join(f"text {i}\t{i % 3}\n" for i in range(9)))
    new = prepare_task("classify", str(other), None, encoder, {"max_length": 128}, name="classify")
    continue_heads(saved, [new], str(whole_run))
    assert new.task.head.out.weight.shape[0] == 3  # other labels: a new head
    assert main(["train", "tag", "--train", str(write_conll(tmp_path)), "--out", str(tmp_path / "tagged"),
                 "--model", str(whole_run), "--epochs", "1", "--no-progress"]) == 0
    tagged = bertheads.load(tmp_path / "tagged")
    assert tagged.heads == {"tag": "tag"}
    enc = load_file(str(tmp_path / "tagged" / "encoder" / "model.safetensors"))
    assert enc.keys() == load_file(str(whole_run / "encoder" / "model.safetensors")).keys()


def write_conll(tmp_path):
    path = tmp_path / "t.conll"
    path.write_text("John B-PER\nlives O\nhere O\n\nMary B-PER\nsings O\n\n")
    return path


def test_tensorboard_event_files(tiny_bert, data, tmp_path):
    pytest.importorskip("tensorboard")
    out = tmp_path / "tb"
    settings = bertheads.TrainSettings(epochs=1, batch_size=8, progress=False, tensorboard=True, log_every=2)
    bertheads.train("classify", str(data / "train.tsv"), str(data / "train.tsv"), out, model=tiny_bert,
                    settings=settings)
    assert list((out / "tensorboard").glob("events.out.tfevents.*"))


@pytest.mark.slow  # runs extra processes (two ranks, kills)
def test_torchrun_two_processes_resume_exactly(tiny_bert, data, tmp_path, forks):
    """Two ranks as torchrun starts them (2 CPU processes with its environment, gloo; forked
    from the fork server, as tests/forkserver.py `ranks` says; tests/test_stream.py runs torchrun
    itself): a run trains as one process would (the batches shared, the main process evaluating
    and saving); killed at step 4 and resumed, it ends with the same weights and losses."""

    def launch(out, *extra, crash_at=None):
        args = argv(tiny_bert, data, out, *extra)
        args[args.index("--epochs") + 1] = "1"
        args[args.index("--batch-size") + 1] = "4"  # 6 steps of 2 x 4 examples
        return forks.ranks(args, env={checkpoint_env(): crash_at} if crash_at else {}, unset=(checkpoint_env(),))

    whole = launch(tmp_path / "whole")
    assert whole.returncode == 0, whole.stderr[-2000:]
    # the same command as one process: the two share the batches, only the main one evaluates and saves
    assert '"accuracy"' in (tmp_path / "whole" / "metrics.json").read_text()
    assert whole.stderr.count("epoch 1:") == 1 and whole.stderr.count("bertheads: saved") == 1
    killed = launch(tmp_path / "part", crash_at="train:step:4")
    assert killed.returncode != 0 and checkpoint.exists(tmp_path / "part")
    resumed = launch(tmp_path / "part", "--resume")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    same_weights(tmp_path / "whole", tmp_path / "part")
    a, b = train_losses(tmp_path / "whole"), train_losses(tmp_path / "part")
    assert [r["step"] for r in a] == [r["step"] for r in b] == list(range(1, 7))
    assert max(abs(x["loss"] - y["loss"]) for x, y in zip(a, b)) <= 1e-6
