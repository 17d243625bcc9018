"""The settings schema: flags, config values and keyword arguments from one dataclass."""

import argparse
from dataclasses import dataclass

import pytest

from bertheads.base.errors import UserError
from bertheads.base.schema import add_flags, check_names, from_mapping, setting, vars_for
from bertheads.base.values import positive_int


@dataclass
class Example:
    max_length: int = setting(128, "tokens per input", type=positive_int)
    mode: str = setting("finetune", "how", choices=("finetune", "features"))
    progress: bool = setting(True, "progress bars", negate=True)
    tensorboard: bool = setting(False, "events")
    hidden: str = setting("x", "python only", cli=False)


def test_flags_come_from_the_fields():
    parser = argparse.ArgumentParser()
    add_flags(parser, Example, defaults={"max_length": 384})
    args = parser.parse_args(["--mode", "features", "--no-progress", "--tensorboard"])
    assert vars_for(Example, args) == {"max_length": 384, "mode": "features", "progress": False, "tensorboard": True}
    assert "--hidden" not in parser.format_help()
    with pytest.raises(SystemExit):
        parser.parse_args(["--max-length", "0"])


def test_unknown_names_are_refused_with_the_closest_known_one():
    with pytest.raises(UserError, match=r"f.yaml: unknown setting 'max_lenght' \(did you mean 'max_length'\?\)"):
        from_mapping(Example, {"max_lenght": 8}, "f.yaml")
    with pytest.raises(UserError, match=r"unknown option 'zzz'$"):
        check_names(["zzz"], ["max_length"], what="option")


def test_config_values_are_converted_like_their_flags():
    assert from_mapping(Example, {"max_length": "64", "mode": "features"}) == Example(max_length=64, mode="features")
    with pytest.raises(UserError, match="max_length: expected a positive integer"):
        from_mapping(Example, {"max_length": -1})
    with pytest.raises(UserError, match="mode: expected one of finetune, features"):
        from_mapping(Example, {"mode": "fine"})
    with pytest.raises(UserError, match="progress: expected true or false"):
        from_mapping(Example, {"progress": "yes"})


@dataclass
class Grouped:
    first: int = setting(1, "the first", type=positive_int, group="main", tags=("searched",))
    combine: str = setting("concat", "how", choices=("concat", "mean"), flag="--layer-combine",
                           aliases=("--combine",), group="main")
    hosts: list = setting(help="repeatable", factory=list, flag="--host", append=True)
    later: int = setting(2, "listed after first", type=int, after="first", group="main")


def test_aliases_groups_tags_append_and_order(capsys):
    from bertheads.base.schema import renamed, tagged

    parser = argparse.ArgumentParser()
    add_flags(parser, Grouped)
    assert [a.dest for a in parser._action_groups[-1]._group_actions] == ["first", "later", "combine", "combine"]
    args = parser.parse_args(["--combine", "mean", "--host", "a", "--host", "b"])
    assert vars_for(Grouped, args) == {"first": 1, "combine": "mean", "hosts": ["a", "b"], "later": 2}
    assert capsys.readouterr().err == "bertheads: warning: --combine is deprecated; use --layer-combine\n"
    assert vars_for(Grouped, parser.parse_args([]))["hosts"] == []
    assert "--combine" not in parser.format_help() and tagged(Grouped, "searched") == ("first",)
    assert renamed(Grouped) == {"combine": "combine"}
    # suppress: only the flags given have a value
    quiet = argparse.ArgumentParser()
    add_flags(quiet, Grouped, suppress=True)
    assert vars(quiet.parse_args(["--first", "3"])) == {"first": 3}
    assert from_mapping(Grouped, {"hosts": "x"}).hosts == ["x"]


# -- the whole command line comes from settings ------------------------------------------------
def every_parser(parser: argparse.ArgumentParser, path: str = "bertheads"):
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from every_parser(sub, f"{path} {name}")


def test_no_flag_of_the_command_line_is_written_by_hand():
    """Each flag and argument of every command is a field of a settings dataclass."""
    from bertheads.cli.parser import build_parser

    by_hand = []
    for path, parser in every_parser(build_parser()):
        for action in parser._actions:
            if isinstance(action, (argparse._HelpAction, argparse._VersionAction, argparse._SubParsersAction)):
                continue
            if getattr(action, "setting", None) is None:
                by_hand.append(f"{path} {'/'.join(action.option_strings) or action.dest}")
    assert by_hand == []


def test_a_source_adds_no_argparse_argument_outside_the_schema():
    from pathlib import Path

    import bertheads

    root = Path(bertheads.__file__).parent
    calls = [f"{p.relative_to(root)}:{n}" for p in sorted(root.rglob("*.py")) if p.name != "schema.py"
             for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
             if ".add_argument(" in line and '"--version"' not in line]
    assert calls == []
