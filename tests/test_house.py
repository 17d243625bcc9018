"""The house rules that keep the code readable, as tests: `predict` reaches the encoder in a few
calls through the one inference path, each module entered once; one name per meaning; a task
holds its parts, and every object a caller holds fits on a screen."""

from __future__ import annotations

import ast
import inspect
import traceback
from pathlib import Path

import bertheads
from bertheads.cli.main import main
from bertheads.encoder.pretrained import Encoder
from bertheads.tasks import TASKS
from bertheads.tasks.base import Task
from bertheads.tasks.options import Options
from bertheads.tasks.parts import Exporting, Judging, Modeling, Publishing, Reading, Scoring

PACKAGE = str(Path(bertheads.__file__).parent)


def test_predict_reaches_the_encoder_in_seven_calls_from_the_console_script_entering_each_module_once(tiny_bert, write, tmp_path,
                                                                           monkeypatch):
    data = write("t.tsv", "sentence\tlabel\n" + "".join(f"a fine film {i}\t{i % 2}\n" for i in range(8)))
    out = tmp_path / "m"
    bertheads.train("classify", data, out=out, model=tiny_bert, epochs=1, progress=False)
    stacks = []
    real = Encoder.forward

    def spy(self, *args, **kwargs):
        stacks.append(traceback.extract_stack())
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Encoder, "forward", spy)
    assert main(["predict", str(out), "--input", write("in.txt", "a fine film\n"), "--runtime", "torch",
                 "--precision", "fp32", "-q"]) == 0
    stack = stacks[0]
    start = next(i for i, f in enumerate(stack) if f.name == "main")
    ours = [f for f in stack[start:] if f.filename.startswith(PACKAGE)]  # (torch's and the stdlib's left out)
    calls = [f"{Path(f.filename).relative_to(PACKAGE)}:{f.name}" for f in ours]
    assert len(calls) - 1 <= 7, " -> ".join(calls)  # the calls made after the console script, the encoder's forward the last
    modules = [Path(f.filename) for f in ours]
    entered = [m for i, m in enumerate(modules) if i == 0 or modules[i - 1] != m]
    assert len(entered) == len(set(entered)), calls  # no module entered twice on the way


PARTS = ("reading", "modeling", "judging", "scoring", "publishing", "exporting")


def public(obj) -> list[str]:
    """What a caller of `obj` can reach: its public names, inherited ones counted."""
    return [name for name in dir(obj) if not name.startswith("_")]


def test_the_task_interface_and_each_kinds_parts_fit_on_a_screen():
    for part in (Task, Options, Reading, Modeling, Judging, Scoring, Publishing, Exporting):
        lines = len(inspect.getsource(part).splitlines())
        members = [k for k in vars(part) if not k.startswith("__")]
        assert lines <= 80 and len(members) <= 16, (part.__name__, lines, len(members))
    for kind, cls in TASKS.items():
        own = [getattr(cls.parts, name) for name in PARTS]
        own = [c for c in own if c.__module__.startswith(f"bertheads.tasks.{kind}.")]
        assert len(own) == len(PARTS), (kind, own)  # each part written in the kind's folder
        for part in [cls, *own]:
            assert len(inspect.getsource(part).splitlines()) <= 140, (kind, part.__name__)


def test_a_task_holds_its_parts_and_no_object_a_caller_holds_has_over_fifteen_members():
    """A task is made of parts it holds, not parts it is: the task, its options and each part
    show at most 15 public members, inherited ones counted."""
    for kind, cls in TASKS.items():
        task = cls(cls.spec_type(), None)
        assert not any(issubclass(cls, base) for base in (Reading, Modeling, Judging, Scoring, Publishing, Exporting))
        held = {"task": task, "options": task.options, **{name: getattr(task, name) for name in PARTS}}
        for name, obj in held.items():
            assert len(public(obj)) <= 15, (kind, name, public(obj))
        assert all(getattr(task, name).task is task for name in PARTS)


def test_one_name_means_one_contract_run_batch_is_the_runners():
    """Every function called `run_batch` is a `compute.runner.Runner`'s: a batch of features (by
    row) through the named heads (or cached positions), with the loss when asked."""
    found = []
    for path in Path(PACKAGE).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef) and node.name == "run_batch":
                found.append((path.name, [a.arg for a in node.args.args]))
    assert len(found) >= 5 and all(args[:3] == ["self", "features", "rows"] and args[4:] == ["with_loss"]
                                   for _, args in found), found
