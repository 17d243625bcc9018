"""The command-line reference, docs/cli.md, built from the parser itself.

    python -m bertheads.cli.reference > docs/cli.md      # regenerate
    python -m bertheads.cli.reference --check            # exit 1 when docs/cli.md is stale

The output is the same on every machine: help is formatted at a fixed width, without colour,
and environment variables that a default may read (`BERTHEADS_*`) are hidden while the parser
is built, so no token, path or machine-specific value reaches the page.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from contextlib import contextmanager
from pathlib import Path

from bertheads.base.schema import add_flags
from bertheads.cli.parser import build_parser
from bertheads.cli.settings import ReferenceSettings

WIDTH = 100
DOC = Path("docs") / "cli.md"
HEADER = """# Command-line reference

Generated from the parser by `python -m bertheads.cli.reference > docs/cli.md`; do not edit by
hand. `bertheads COMMAND --help` prints the same. The conventions every command follows (exit
status, messages, atomic outputs) are in [conventions](conventions.md).
"""


@contextmanager
def _stable_environment():
    """Hide what could make the page differ between machines while the parser is built; put
    back exactly what was changed afterwards."""
    hidden = [n for n in os.environ if n.startswith("BERTHEADS_") or n in ("FORCE_COLOR", "PYTHON_COLORS")]
    changed = {n: os.environ.get(n) for n in [*hidden, "COLUMNS", "NO_COLOR"]}
    try:
        for name in hidden:
            del os.environ[name]
        os.environ["COLUMNS"] = str(WIDTH)
        os.environ["NO_COLOR"] = "1"
        yield
    finally:
        for name, value in changed.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _fix_width(parser: argparse.ArgumentParser) -> None:
    cls = parser.formatter_class
    while isinstance(cls, functools.partial):
        cls = cls.func
    parser.formatter_class = functools.partial(cls, width=WIDTH, max_help_position=32)
    if hasattr(parser, "color"):
        parser.color = False


def _subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, argparse.ArgumentParser]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return list(action.choices.items())
    return []


def _stable_text(text: str) -> str:
    """No machine-specific paths in the page."""
    home = str(Path.home())
    if home and home != "/":
        text = text.replace(home, "~")
    return text


def _cell(text: str) -> str:
    return _stable_text(" ".join(str(text).split())).replace("|", "\\|")


def _default(action: argparse.Action) -> str:
    default = action.default
    if default is argparse.SUPPRESS or default is None or default is False or default == ():
        return ""
    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
        return ""
    if isinstance(default, (list, tuple)):
        default = ",".join(str(v) for v in default)
    return f"`{_cell(default)}`"


def _flag(action: argparse.Action) -> str:
    if not action.option_strings:
        return f"`{action.metavar or action.dest}`"
    if action.nargs == 0:
        names = action.option_strings
    else:
        metavar = action.metavar
        if metavar is None:
            metavar = "{" + ",".join(map(str, action.choices)) + "}" if action.choices else action.dest.upper()
        names = [f"{o} {metavar}" if action.nargs in (None, 1, "?") else f"{o} {metavar} ..."
                 for o in action.option_strings]
    return ", ".join(f"`{n}`" for n in names)


def _help(action: argparse.Action) -> str:
    text = action.help or ""
    if "%(" in text:
        params = dict(vars(action), prog="bertheads")
        for name in list(params):
            if params[name] is argparse.SUPPRESS:
                del params[name]
        text = text % params
    parts = [text]
    if action.choices and action.option_strings and action.metavar is not None:
        parts.append("(one of: " + ", ".join(map(str, action.choices)) + ")")
    if action.required and action.option_strings:
        parts.append("(required)")
    return _cell(" ".join(p for p in parts if p))


def _section(name: str, parser: argparse.ArgumentParser, level: int) -> list[str]:
    _fix_width(parser)
    out = [f"{'#' * level} `{name}`", ""]
    description = parser.description
    if description:
        out += [_stable_text(" ".join(description.split())), ""]
    usage = parser.format_usage().strip()
    out += ["```", _stable_text(usage), "```", ""]
    subs = _subcommands(parser)
    for group in parser._action_groups:
        actions = [a for a in group._group_actions
                   if not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction))
                   and a.help is not argparse.SUPPRESS]
        if not actions:
            continue
        title = group.title or "options"
        out += [f"**{title}**", "", "| flag | default | |", "|---|---|---|"]
        out += [f"| {_flag(a)} | {_default(a)} | {_help(a)} |" for a in actions]
        out.append("")
    if subs:
        out += ["| command | |", "|---|---|"]
        helps = {}
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                helps = {c.dest: c.help for c in action._choices_actions}
        out += [f"| [`{name} {sub}`](#{_anchor(f'{name} {sub}')}) | {_cell(helps.get(sub) or '')} |"
                for sub, _ in subs]
        out.append("")
        for sub, child in subs:
            out += _section(f"{name} {sub}", child, level + 1)
    return out


def _anchor(title: str) -> str:
    """GitHub's anchor for a heading `` `title` ``."""
    return "".join(c for c in title.lower() if c.isalnum() or c in " -_").replace(" ", "-")


def render() -> str:
    """docs/cli.md: every command and subcommand, its usage and flags, as argparse groups them."""
    with _stable_environment():
        parser = build_parser()
        parser.prog = "bertheads"
        lines = [HEADER] + _section("bertheads", parser, 2)
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bertheads.cli.reference",
                                description="Print the command-line reference (docs/cli.md) built from the parser.")
    add_flags(p, ReferenceSettings)
    args = p.parse_args(argv)
    text = render()
    if args.check:
        path = Path(args.file or DOC)
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            print(f"{path} is stale: run python -m bertheads.cli.reference > docs/cli.md", file=sys.stderr)
            return 1
        return 0
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
