"""The package's imports run one way, top to bottom, with no circles (imports inside functions
count too): faces -> library -> model -> tasks -> features, packing, readers -> encoder."""

import ast
import sys
from pathlib import Path

import bertheads

PACKAGE = Path(bertheads.__file__).resolve().parent

# the layer of each folder (and of the few top-level modules), top (faces) to bottom; the tree
# is the architecture: a new module goes into the folder of its layer (see ARCHITECTURE.md)
LAYERS = {
    7: {"cli", "serve", "__main__", ""},              # faces ("" is the package's own __init__)
    6: {"api", "training", "inference", "export", "saved", "engines"},  # the library
    5: {"model"},                                     # one encoder pass, every head on it
    4: {"tasks"},                                     # one sub-package per task kind
    3: {"store", "text", "compute"},                  # files, text, batches
    2: {"encoder"},                                   # the pretrained checkpoint
    1: {"base"},                                      # errors and value types
}
FOLDER_RANK = {folder: rank for rank, folders in LAYERS.items() for folder in folders}


def layer_of(module: str) -> int:
    """A module's layer: that of its first folder under the package (or its own name at the top)."""
    parts = module.split(".")[1:]
    return FOLDER_RANK[parts[0] if parts else ""]



def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_imports() -> dict[str, set[str]]:
    """module -> the package's modules it imports, anywhere in the file."""
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                wanted = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
                    base = ".".join(here[: len(here) - node.level + 1] + ([node.module] if node.module else []))
                wanted = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            else:
                continue
            for target in wanted:
                if target.split(".")[0] == "bertheads" and (resolved := resolve(target)) and resolved != name:
                    targets.add(resolved)
        graph[name] = targets
    return graph


def test_every_module_has_a_layer():
    top = {m.split(".")[1] if "." in m else "" for m in package_imports()}
    assert sorted(top - set(FOLDER_RANK)) == []


def test_no_module_imports_one_above_it():
    upward = [f"{m} -> {t}" for m, targets in package_imports().items() for t in targets if layer_of(t) > layer_of(m)]
    assert upward == []


def test_no_circles():
    graph = package_imports()
    state: dict[str, int] = {}
    circles = []

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for target in sorted(graph[module]):
            if state.get(target) == 1:
                circles.append(" -> ".join(path[path.index(target):] + [target]))
            elif target not in state:
                visit(target, path + [target])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert circles == []


def test_the_walk_sees_imports_inside_functions(tmp_path, monkeypatch):
    """The checker itself: a function-local upward import is reported."""
    fake = tmp_path / "bertheads"
    (fake / "tasks").mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "tasks" / "__init__.py").write_text("")
    (fake / "encoder.py").write_text("def f():\n    from bertheads.cli import main\n")
    (fake / "cli.py").write_text("from bertheads import encoder\n")
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", fake)
    graph = package_imports()
    assert graph["bertheads.encoder"] == {"bertheads.cli"} and graph["bertheads.cli"] == {"bertheads.encoder"}


# -- no module outside tasks/ names a task kind ----------------------------------------------
KIND_NAMES = {"classify", "tag", "qa"}


def kind_literals(path: Path) -> list[int]:
    """Lines of `path` where a kind name is a string literal of the code (docstrings and
    comments aside), or, in HTML and JavaScript, a quoted kind name."""
    import re

    if path.suffix not in (".py", ".html", ".js"):
        return []  # package data (the docs pages' compressed files, licences)
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".py":
        tree = ast.parse(text)
        docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                      if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                      and node.body and isinstance(node.body[0], ast.Expr)
                      and isinstance(node.body[0].value, ast.Constant)}
        return sorted(node.lineno for node in ast.walk(tree)
                      if isinstance(node, ast.Constant) and node.value in KIND_NAMES and id(node) not in docstrings)
    if path.suffix in (".html", ".js"):
        return [n for n, line in enumerate(text.splitlines(), 1) if re.search(r"""['"](classify|tag|qa)['"]""", line)]
    return []


def test_no_kind_named_outside_tasks():
    hits = [f"{p.relative_to(PACKAGE)}:{n}" for p in sorted(PACKAGE.rglob("*"))
            if p.is_file() and "tasks" not in p.relative_to(PACKAGE).parts for n in kind_literals(p)]
    assert hits == []
