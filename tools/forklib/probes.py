"""How the per-step check runs Python on a step's tree: compile and import probes, and
an interpreter that preloads the third-party modules once and forks a run per test."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path


def python_modules(paths: list[str]) -> list[str]:
    """python/sglang/a/b.py -> sglang.a.b (packages by their __init__)."""
    mods = []
    for p in paths:
        if p.startswith("python/") and p.endswith(".py"):
            parts = p[len("python/"):-3].split("/")
            if parts[-1] == "__init__":
                parts = parts[:-1]
            mods.append(".".join(parts))
    return mods


COMPILE_PROBE = """\
import sys
for path in sys.argv[1:]:
    with open(path, encoding="utf-8") as f:
        compile(f.read(), path, "exec", dont_inherit=True)
"""
# Imports a step's touched modules (argv). With "--" and pytest's arguments after them, it
# does so in the process that runs the step's tests, once the tests' conftest has run, so
# the check starts Python and imports sglang (about 20 s of CPU) once for the step, not
# twice; a failed import then exits with IMPORT_FAILED.
IMPORT_FAILED = 90
IMPORT_PROBE = """\
import importlib, sys, traceback

def import_all(names):
    bad = 0
    for name in names:
        try:
            importlib.import_module(name)
        except Exception:
            bad += 1
            print(f"import {name} failed:", file=sys.stderr)
            traceback.print_exc()
    return bad

if "--" not in sys.argv:
    sys.exit(1 if import_all(sys.argv[1:]) else 0)

import pytest
cut = sys.argv.index("--")
names, args = sys.argv[1:cut], sys.argv[cut + 1:]

class ImportTouched:
    def pytest_sessionstart(self, session):
        if import_all(names):
            pytest.exit("a module the step touches does not import", returncode=%d)

sys.exit(pytest.main(args, plugins=[ImportTouched()]))
""" % IMPORT_FAILED


# A check runs about a hundred short Python processes (one per step, one per proof), and
# each spent about 8 s of CPU importing the same third-party modules (torch, transformers,
# openai, ...) before the step's own code. A preloaded interpreter imports those once and
# forks a child per run; the child imports sglang and the tests from the step's tree as a
# fresh process would (nothing of sglang is loaded before the fork), with the run's
# working directory, environment, sys.path and arguments.
PRELOAD_PROBE = """\
import importlib, json, os, sys
tree = os.path.realpath(sys.argv[1])
for name in ["pytest", *sys.argv[2:]]:
    try:
        importlib.import_module(name)
    except BaseException:
        pass
names = []
for name, mod in list(sys.modules.items()):
    path = getattr(mod, "__file__", None)
    if name != "__main__" and path and not os.path.realpath(path).startswith(tree + os.sep):
        names.append(name)
print("PRELOAD " + json.dumps(names))
"""
# The preloaded interpreter: reads one JSON request a line on stdin, forks, and answers
# each with a JSON line ({"rc": N}) on the descriptor it got as argv[1].
PRELOADED = """\
import atexit, io, json, os, runpy, sys, threading, traceback
sys.dont_write_bytecode = True  # not -B: the runs' new processes (multiprocessing's) inherit it
reply = os.fdopen(int(sys.argv[1]), "w")
base_path = [p for p in sys.path if p]
for name in json.loads(sys.stdin.readline()):
    try:
        __import__(name)
    except BaseException:
        pass
loaded = sorted(n for n in sys.modules if n == "sglang" or n.startswith("sglang."))
reply.write(json.dumps({"ready": not loaded, "loaded": loaded[:5]}) + "\\n")
reply.flush()

def child(req):
    for fd, path in ((1, req["stdout"]), (2, req["stderr"])):
        out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(out, fd)
        os.close(out)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    reply.close()
    sys.stdin = io.TextIOWrapper(os.fdopen(0, "rb", closefd=False))
    os.chdir(req["cwd"])
    os.environ.clear()
    os.environ.update(req["env"])
    sys.dont_write_bytecode = bool(req["env"].get("PYTHONDONTWRITEBYTECODE"))
    sys.pycache_prefix = req["env"].get("PYTHONPYCACHEPREFIX") or None
    extra = [p for p in req["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = [""] + extra + base_path
    args = req["args"]
    code = 0
    try:
        if args[0] == "-c":
            sys.argv = ["-c", *args[2:]]
            exec(compile(args[1], "<string>", "exec"), {"__name__": "__main__"})
        else:
            sys.argv = [args[1], *args[2:]]
            runpy.run_module(args[1], run_name="__main__", alter_sys=True)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if not isinstance(e.code, (int, type(None))):
            print(e.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
        code = 1
    try:
        threading._shutdown()
        atexit._run_exitfuncs()
    finally:
        for f in (sys.stdout, sys.stderr):
            try:
                f.flush()
            except Exception:
                pass
        os._exit(code)

for line in sys.stdin:
    req = json.loads(line)
    pid = os.fork()
    if pid == 0:
        child(req)
    _, status = os.waitpid(pid, 0)
    reply.write(json.dumps({"rc": os.waitstatus_to_exitcode(status)}) + "\\n")
    reply.flush()
"""


class _Interpreter:
    """Runs ``python ARGS`` for the check: forked from a preloaded interpreter when one
    could start (``preload``: the module names it imports first), else as a subprocess."""

    def __init__(self, python: str, preload: list[str] | None, tmp: Path):
        self.python, self.tmp, self.proc = python, tmp, None
        if not preload:
            return
        r, w = os.pipe()
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        proc = subprocess.Popen([python, "-c", PRELOADED, str(w)], stdin=subprocess.PIPE,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                pass_fds=(w,), env=env, text=True)
        os.close(w)
        self.replies = os.fdopen(r)
        proc.stdin.write(json.dumps(preload) + "\n")
        proc.stdin.flush()
        ready = self.replies.readline()
        if ready and json.loads(ready).get("ready"):
            self.proc = proc
        else:  # sglang got imported with the rest: children would not load the tree's
            self.close(proc)

    def run(self, args: list[str], cwd: Path, env: dict) -> subprocess.CompletedProcess:
        if self.proc is None:
            return subprocess.run([self.python, *args], cwd=cwd, env=env, capture_output=True,
                                  text=True)
        out, err = (tempfile.mkstemp(dir=self.tmp, suffix=s)[1] for s in (".out", ".err"))
        self.proc.stdin.write(json.dumps({"args": args, "cwd": str(cwd), "env": env,
                                          "stdout": out, "stderr": err}) + "\n")
        self.proc.stdin.flush()
        rc = json.loads(self.replies.readline())["rc"]
        texts = [Path(f).read_text(errors="replace") for f in (out, err)]
        for f in (out, err):
            os.unlink(f)
        return subprocess.CompletedProcess([self.python, *args], rc, *texts)

    def close(self, proc=None) -> None:
        proc = proc or self.proc
        self.proc = None
        if proc is not None:
            proc.stdin.close()
            proc.wait()
            self.replies.close()


def preload_names(python: str, tree: Path, modules: list[str]) -> list[str]:
    """The modules outside ``tree`` that importing ``modules`` from it loads (in import
    order): what a preloaded interpreter imports before forking a step's runs."""
    res = subprocess.run([python, "-c", PRELOAD_PROBE, str(tree / "python"), *modules],
                         env=_tree_env(tree), capture_output=True, text=True)
    lines = [l for l in res.stdout.splitlines() if l.startswith("PRELOAD ")]
    return json.loads(lines[-1][len("PRELOAD "):]) if lines else []


def _tree_env(tree: Path, write_bytecode: bool = False) -> dict:
    """The environment of a Python run on ``tree``'s code; ``write_bytecode``: its
    imports cache their bytecode (in __pycache__ folders, the tree's included)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(tree / "python")] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    if write_bytecode:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
    else:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def forget_bytecode(tree: Path, changed: list[str]) -> None:
    """After a checkout of ``tree`` that changed these files (paths in it): drop their
    cached bytecode, since Python checks a cached entry against its source's mtime (in
    whole seconds) and size only, which two versions of a file can share; and the
    folders left holding nothing but __pycache__ (a package the checkout removed would
    still import, as a namespace package)."""
    for rel in changed:
        src = tree / rel
        if src.suffix == ".py":
            for pyc in (src.parent / "__pycache__").glob(f"{src.stem}.*.pyc"):
                pyc.unlink()
    for folder, subdirs, files in os.walk(tree / "python", topdown=False):
        if not files and "__pycache__" in subdirs and os.listdir(folder) == ["__pycache__"]:
            shutil.rmtree(folder)
