"""The package's imports run one way, top to bottom, with no circles (imports inside functions
count too): faces -> library -> model -> tasks -> features, packing, readers -> encoder."""

import ast
import sys
from pathlib import Path

import bertheads

PACKAGE = Path(bertheads.__file__).resolve().parent

# layer of every module, top (faces) to bottom; a new module must be placed here (and in ARCHITECTURE.md)
LAYERS = {
    6: {"bertheads", "bertheads.__main__", "bertheads.cli", "bertheads.serve", "bertheads.serve_guard",
        "bertheads.serve_queue"},
    5: {"bertheads.api", "bertheads.multitask", "bertheads.train", "bertheads.flags", "bertheads.combine",
        "bertheads.analyze", "bertheads.extract", "bertheads.bundle", "bertheads.manifest", "bertheads.checkpoint",
        "bertheads.runlog", "bertheads.report", "bertheads.tune", "bertheads.stream",
        "bertheads.export_hf", "bertheads.export_onnx", "bertheads.runtime_onnx"},
    4: {"bertheads.model"},
    3: {"bertheads.tasks"} | {f"bertheads.tasks.{p.stem}" for p in (PACKAGE / "tasks").glob("*.py")
                              if p.stem != "__init__"},
    2: {"bertheads.cache", "bertheads.layers", "bertheads.packing", "bertheads.readers", "bertheads.rowfiles",
        "bertheads.atomic", "bertheads.encoder_refs"},
    1: {"bertheads.encoder", "bertheads.errors", "bertheads.argtypes"},
}
RANK = {module: rank for rank, modules in LAYERS.items() for module in modules}


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
    assert sorted(set(package_imports()) - set(RANK)) == []


def test_no_module_imports_one_above_it():
    upward = [f"{m} -> {t}" for m, targets in package_imports().items() for t in targets if RANK[t] > RANK[m]]
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
