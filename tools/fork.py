#!/usr/bin/env python3
"""Build tool for the SGLang Gemma-4 fork: a pinned upstream wheel + PR stacks of patches.

The fork is not a copy of SGLang.  It is:
  * tools/upstream.json   the pinned upstream release: one wheel per interpreter, with sha256
  * patches/series        the steps in order, one `NN-stack/NNNN-slug.patch` a line ('#'
                          comments and blank lines ignored).  A stack is a folder of
                          patches/ that a reviewer takes as one pull request; stacks are
                          listed in dependency order, and each depends only on those above.
  * patches/NN-stack/     `git format-patch` mails, one concern each, plus cover-letter.md
                          (the pull request's description).  A patch carries the step's
                          edits to upstream files only; the new files it adds it names, one
                          header line each (`X-Fork-Adds: python/sglang/...`), and what it
                          changes in a module an earlier step added is kept beside it
                          (NNNN-name.replaced.json: only the lines it replaced).
  * python/...            the new modules, once, at their final content, as plain files to
                          read and edit.  A step writes a module at the content it has
                          there: the final one with the later steps' records undone.

Patches are applied with git's own `git am` onto a git repository of the wheel's files in
upstream's layout (python/sglang/...): exact context, line offsets tolerated, no fuzz, as a
reviewer applies them; the files a step adds are committed with it.  Nothing here
re-implements patching.  Every step is a working tree, and an export carries each step
whole (its new files and tests inside it).

Another upstream release is a base of its own, bases/VERSION/ (`--base VERSION`, before
the command), kept as a delta: its pinned wheel, requirements, series and cover letters,
and only the steps (patches/NN-stack/...) and new modules (python/...) whose content
differs there; a step its series lists that it does not hold is the default base's
patch, applied unchanged. Its series may not have every stack yet: tests of the
missing stacks are left out of its check and counted, as are tests marked for other
releases only (`bases=`: they test upstream code this release does not have). A stack
ported in part names each step it does not have yet in its series as a comment,
`# not yet ported: NN-stack/NNNN-name.patch` (the default series' line): that step's
tests, and its stack's tests without a step, are left out and counted. A step of a
ported stack that is neither listed nor declared so is one upstream already has (or that
this release does not need): its tests run with its stack's, as a regression check.

Commands (python3 tools/fork.py [--base VERSION] CMD --help):
  materialize DIR      the wheel's sglang/ as a git repo in DIR, one commit per step
  install              materialize into build/tree, build build/dist/sglang-V+local-*.whl,
                       pip install it into the venv (default .venv)
  check [--each]       materialize and verify the mirror; --each also checks every step:
                       byte-compile and import what it touches, run its tests (see below);
                       --jobs N checks N steps at once, each in a git worktree of its own
  export OUTDIR        one folder per stack: git-am-able patches + cover-letter.md; each
                       patch also adds its step's tests (test/srt/) and what they need
  import DIR           write DIR's commits back into the series (authoring, below)
  overlay DIR          only changed/new files as DIR/sglang/..., to copy over site-packages
  diffstat             files and +/- lines per step
  compare REV          export at REV (REV's own tool) and here; every step's tree is the same

Tests name the step they belong to with a marker that `check --each` reads statically:
    pytestmark = pytest.mark.stack("yoco-model")                    # the stack's last step
    @pytest.mark.stack("yoco-model", step="back-half-cuda-graphs")  # that step
    @pytest.mark.stack(..., fails_before=True)   # must fail before it (see below)
    @pytest.mark.stack("yoco-model", suite_only=True)  # a soak: in the suite only
    @pytest.mark.stack(..., bases=("0.5.23",))   # tests code only that release has
A stack's name is its folder without the number; a step's name is its patch file's
name without number and suffix.  Step tests run right after their step, stack tests
after the stack's last step.  `fails_before` ones also run on the tree just before
their step (a stack test: just before the stack's first step), where they must fail:
a test that passes before its feature exists tests nothing.  `suite_only` marks a soak
of the whole fork (minutes of mixed load): no step's check runs it, the suite does, and
its stack says on which bases it runs.  Every test file of
test/srt carries a marker, so no product test goes unowned.
An exported test file has the helpers its carried tests reach (a helper enters with the
first test that uses it), and of code written for one release only, `if RELEASE >=
(0, 5, 23):` (test/srt/release.py), the branch of the release exported; export and
`check --each` resolve every sglang name those files import in the step's tree.

Authoring: a change inside a new module is an edit of its file under python/ (it lands in
the step that adds the module, unless it falls in a later step's change to it). Anything
else (reworking any step, or adding one):
    python3 tools/fork.py materialize build/edit       # one commit per step
    cd build/edit
    git rebase -i fork-base     # edit/reword/insert commits; new files go in the commit
                                # of the step that adds them
    cd ../..
    # a new step: add its line to patches/series at its place first
    python3 tools/fork.py import build/edit            # rewrites patches + python/
    python3 tools/fork.py check --each
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from forklib.check import StepReport, check_each  # noqa: E402,F401
from forklib.cli import main  # noqa: E402
from forklib.compare import compare_exports, exported_trees  # noqa: E402,F401
from forklib.core import (BASE_TAG, FALLBACK_KEY, ROOT, TEST_DIRS, Fork, ForkError,  # noqa: E402,F401
                          fetch_wheel, git, interpreter_key, pick_key, sha256_file)
from forklib.export import (EXPORT_CUT, export, exported_test_source, exported_tests,  # noqa: E402,F401
                            release_source, test_file_deps)
from forklib.names import step_name_problems  # noqa: E402,F401
from forklib.marks import (MarkedTest, collect_marked_tests, known_bases, left_out_why,  # noqa: E402,F401
                           not_yet_ported, tests_of_base, validate_marks)
from forklib.probes import _Interpreter, _tree_env, preload_names, python_modules  # noqa: E402,F401
from forklib.series import ADDS_HEADER, SHARED_HEADER, Step, lint_series, patch_message, read_series, stacks_of  # noqa: E402,F401
from forklib.tree import (Materialized, step_contents, apply_step, changed_files,  # noqa: E402,F401
                          create_base, import_tree, materialize, module_files, verify_modules)
from forklib.wheel import base_requirements, build_wheel, diffstat, install, overlay  # noqa: E402,F401

if __name__ == "__main__":
    sys.exit(main())
