"""The sglang names a step's tests import, resolved statically in that step's tree: an
exported step is whole only if its tests name nothing a later step (or another release)
adds."""
from __future__ import annotations

import ast
from pathlib import Path

from .core import ForkError

PACKAGE = "sglang"


class _Modules:
    """The modules of one tree (upstream's layout: python/sglang/...) and the names each
    binds at its top level, read from the files (nothing is imported)."""

    def __init__(self, tree: Path):
        self.tree = Path(tree)
        # a step's files change the next step: a module's names are kept with its bytes
        self._names: dict[Path, tuple[bytes, set[str] | None]] = {}

    def path(self, module: str) -> Path | None:
        base = self.tree / "python" / Path(*module.split("."))
        for cand in (base.with_suffix(".py"), base / "__init__.py"):
            if cand.is_file():
                return cand
        if base.is_dir():  # a namespace package (upstream has folders without __init__)
            return base
        # a compiled extension module (upstream ships a few) exists as a file too
        return next(base.parent.glob(base.name + ".*.so"), None) if base.parent.is_dir() else None

    def names(self, module: str, _seen=None) -> set[str] | None:
        """What ``from module import name`` can take: its top-level bindings (also those
        under a module-level if/try) and its submodules; None where that cannot be known
        statically (a module __getattr__, a star import from outside the package, an
        extension module)."""
        path = self.path(module)
        if path is not None and path.is_dir():
            return _submodules(path)
        if path is None or path.suffix != ".py":
            return None
        data = path.read_bytes()
        if path in self._names and self._names[path][0] == data:
            return self._names[path][1]
        seen = (_seen or set()) | {path}
        names: set[str] | None = set()
        try:
            tree = ast.parse(data, str(path))
        except SyntaxError:  # a step's own check says so; nothing to read here
            self._names[path] = (data, None)
            return None
        if path.name == "__init__.py":
            names.update(_submodules(path.parent))
        pkg = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in _top_level(tree.body):
            if names is None:
                break
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
                if node.name == "__getattr__":
                    names = None
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                    names.update(n.id for n in ast.walk(t) if isinstance(n, ast.Name))
            elif isinstance(node, ast.Import):
                names.update(a.asname or a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                if any(a.name == "*" for a in node.names):
                    src = _absolute(node, pkg)
                    inner = (self.names(src, seen) if src and src.split(".")[0] == PACKAGE
                             and self.path(src) not in seen else None)
                    if inner is None:
                        names = None
                        break
                    names.update(n for n in inner if not n.startswith("_"))
                else:
                    names.update(a.asname or a.name for a in node.names)
            elif isinstance(node, (ast.For, ast.AsyncFor, ast.With, ast.AsyncWith)):
                for t in ([node.target] if isinstance(node, (ast.For, ast.AsyncFor)) else
                          [i.optional_vars for i in node.items if i.optional_vars]):
                    names.update(n.id for n in ast.walk(t) if isinstance(n, ast.Name))
            elif isinstance(node, ast.NamedExpr):
                names.add(node.target.id)
        self._names[path] = (data, names)
        return names


def _submodules(folder: Path) -> set[str]:
    return {p.name.split(".")[0] for p in folder.iterdir() if p.name != "__pycache__" and (
        p.suffix in (".py", ".so") or p.is_dir())}


def _top_level(body):
    """The statements that run at a module's top level, into if/try/with/for blocks."""
    for node in body:
        yield node
        if isinstance(node, (ast.If, ast.For, ast.AsyncFor, ast.While, ast.With,
                             ast.AsyncWith, ast.Try, getattr(ast, "TryStar", ast.Try))):
            yield from _top_level(node.body)
            yield from _top_level(getattr(node, "orelse", []))
            yield from _top_level(getattr(node, "finalbody", []))
            for h in getattr(node, "handlers", []):
                yield from _top_level(h.body)


def _absolute(node: ast.ImportFrom, pkg: str) -> str | None:
    if not node.level:
        return node.module
    parts = pkg.split(".")
    if node.level - 1 > len(parts):
        return None
    base = parts[:len(parts) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def unresolved_names(modules: _Modules, src: str | bytes, rel: str) -> list[tuple[int, str]]:
    """(line, name) of each sglang name file ``rel`` imports (at module level or inside a
    function, ``import m`` and ``from m import name``) that ``modules``' tree does not
    have, and each attribute it reads of a module so imported (``hook.fn`` after
    ``from sglang.x import hook``) that is not there either."""
    tree = ast.parse(src, rel)
    out: list[tuple[int, str]] = []
    aliases: dict[str, str] = {}  # local name -> sglang module it is bound to

    def module_exists(m: str, line: int) -> bool:
        if modules.path(m) is None:
            out.append((line, m))
            return False
        return True

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] != PACKAGE:
                    continue
                if module_exists(a.name, node.lineno) and a.asname:
                    aliases[a.asname] = a.name
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module \
                and node.module.split(".")[0] == PACKAGE:
            if not module_exists(node.module, node.lineno):
                continue
            have = modules.names(node.module)
            for a in node.names:
                if a.name == "*":
                    continue
                sub = f"{node.module}.{a.name}"
                if modules.path(sub) is not None:
                    aliases[a.asname or a.name] = sub
                elif have is not None and a.name not in have:
                    out.append((node.lineno, f"{node.module}.{a.name}"))
    # hook.fn: an attribute of an sglang module bound to a name of this file
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id in aliases and isinstance(node.ctx, ast.Load)):
            m = aliases[node.value.id]
            have = modules.names(m)
            if have is not None and node.attr not in have and not node.attr.startswith("__") \
                    and modules.path(f"{m}.{node.attr}") is None:
                out.append((node.lineno, f"{m}.{node.attr}"))
    return sorted(set(out))


def step_name_problems(tree: Path, files: dict[str, bytes], step: str,
                       modules: _Modules | None = None) -> list[str]:
    """One line per sglang name that a Python file of ``files`` (a step's tests and what
    they need, {path: content}) names and ``tree`` (the step applied) lacks."""
    modules = modules or _Modules(tree)
    problems = []
    for rel in sorted(files):
        if not rel.endswith(".py"):
            continue
        for line, name in unresolved_names(modules, files[rel], rel):
            problems.append(f"{rel}:{line}: {name} is not in the tree of step {step}")
    return problems


def check_step_names(tree: Path, files: dict[str, bytes], step: str,
                     modules: _Modules | None = None) -> None:
    """Raise ForkError naming each sglang name a step's exported tests need that its
    tree lacks (step_name_problems)."""
    problems = step_name_problems(tree, files, step, modules)
    if problems:
        raise ForkError(
            f"step {step}: its exported tests name what its tree does not have (a later "
            "step's or another release's code; lines of the files as it exports them):\n  " + "\n  ".join(problems) + "\n"
            "a helper enters with the first test that uses it: mark the test that needs "
            "it for the step that adds the name; code of one release goes under `if "
            "RELEASE >= (0, 5, 23):` (test/srt/release.py) or in a test marked bases=(...)")
