"""The fork's own modules (python/ and each base's python/) import each other without a
circle, also under TYPE_CHECKING, and nothing under model_executor/ imports arg_groups/
(the model runner reads what the server-argument hooks decided, never the hooks)."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _imports(path: Path) -> set:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):  # TYPE_CHECKING and lazy ones too
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
    return names


def import_graph(tree: Path) -> dict:
    mods = {".".join(p.relative_to(tree).with_suffix("").parts): p for p in tree.rglob("*.py")}
    return {mod: sorted(n for n in _imports(path) if n in mods and n != mod)
            for mod, path in mods.items()}


def cycles(graph: dict) -> list:
    found, state = [], {}

    def visit(mod, path):
        state[mod] = "open"
        for dep in graph[mod]:
            if state.get(dep) == "open":
                found.append(path[path.index(dep):] + [dep])
            elif dep not in state:
                visit(dep, path + [dep])
        state[mod] = "done"

    for mod in graph:
        if mod not in state:
            visit(mod, [mod])
    return found


def trees():
    yield ROOT / "python"
    yield from sorted(p for p in (ROOT / "bases").glob("*/python") if p.is_dir())


def test_the_fork_modules_import_without_a_circle():
    for tree in trees():
        assert cycles(import_graph(tree)) == [], tree


def test_the_model_executor_does_not_import_the_argument_hooks():
    for tree in trees():
        arrows = [(m, d) for m, deps in import_graph(tree).items() for d in deps
                  if m.startswith("sglang.srt.model_executor") and d.startswith("sglang.srt.arg_groups")]
        assert arrows == [], tree


def test_the_checks_see_a_circle_and_an_arrow(tmp_path):
    pkg = tmp_path / "sglang" / "srt"
    (pkg / "model_executor").mkdir(parents=True)
    (pkg / "arg_groups").mkdir()
    (pkg / "model_executor" / "a.py").write_text("from sglang.srt.arg_groups import b\n")
    (pkg / "arg_groups" / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from sglang.srt.model_executor import a\n")
    graph = import_graph(tmp_path)
    assert graph["sglang.srt.model_executor.a"] == ["sglang.srt.arg_groups.b"]
    assert cycles(graph)


def _installed_sglang():
    import importlib.util

    spec = importlib.util.find_spec("sglang")  # locates the package, runs none of it
    return Path(next(iter(spec.submodule_search_locations))).parent


def through_upstream(site: Path, fork_modules: set) -> dict:
    """{fork module: the fork modules it depends on}: those it imports, and those that
    the upstream modules it imports import (as the series leaves them: model_runner
    imports the planner), which it reaches through them."""
    def module_path(name):
        p = site.joinpath(*name.split("."))
        return next((q for q in (p.with_suffix(".py"), p / "__init__.py") if q.is_file()), None)

    graph = {}
    for mod in fork_modules:
        path = module_path(mod)
        if path is None:
            continue
        deps = set()
        for name in _imports(path):
            if name in fork_modules:
                deps.add(name)
            elif name.startswith("sglang.") and module_path(name) is not None:
                deps |= _imports(module_path(name)) & fork_modules
        graph[mod] = sorted(deps - {mod})
    return graph


def test_no_circle_through_the_upstream_files_the_patches_change():
    site = _installed_sglang()
    fork_modules = set()
    for tree in trees():
        fork_modules |= set(import_graph(tree))
    graph = through_upstream(site, fork_modules)
    assert "sglang.srt.model_executor.kv_sharing_fast_prefill_planner" in graph  # installed
    assert cycles(graph) == []
