"""after_import(name, patch): run patch(module) once `name` has been imported.

The engine shims below run in every Python process started with their folder on
PYTHONPATH, the engine's resource tracker and detokenizer too. Importing the modules
they patch at start-up cost each such process several seconds of imports it never
needed; this patches a module when (and only if) the process imports it, right after
its body ran, before the importer sees it."""

import importlib.abc
import importlib.util
import sys


def after_import(name, patch):
    if name in sys.modules:
        patch(sys.modules[name])
        return

    class PatchOnImport(importlib.abc.MetaPathFinder):
        def find_spec(self, fullname, path, target=None):
            if fullname != name:
                return None
            sys.meta_path.remove(self)
            spec = importlib.util.find_spec(fullname)
            if spec is None or spec.loader is None:
                return spec
            exec_module = spec.loader.exec_module

            def exec_and_patch(module):
                exec_module(module)
                patch(module)

            spec.loader.exec_module = exec_and_patch
            return spec

    sys.meta_path.insert(0, PatchOnImport())
