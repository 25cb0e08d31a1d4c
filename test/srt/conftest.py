import logging
import os
import sys

import pytest

# Tests import helpers (tiny_gemma) that live next to them.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# CPU reference path: never pick a GPU, keep CPU threads predictable.
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
os.environ.setdefault("SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN", "1")


def pytest_sessionfinish(session, exitstatus):
    # Every engine shuts down once more at exit (atexit) and logs through the
    # handler SGLang bound to a capfd test's stream, closed by now: a "Logging
    # error" traceback each, printed after the summary line (16 per run).
    logging.raiseExceptions = False


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory):
    """The seeded tiny Gemma-4 (tiny_gemma.py), written once for every test file."""
    from tiny_gemma import make_tiny_gemma4

    return make_tiny_gemma4(str(tmp_path_factory.mktemp("tiny_gemma4")), seed=0)


@pytest.fixture(scope="session")
def hf(model_dir):
    """Hugging Face transformers' reference run of that model."""
    from cpu_engine import HFReference

    return HFReference(model_dir)


# -------------------- the fork's own test selection (tools/fork.py export leaves it out)
import importlib.metadata  # noqa: E402
import importlib.util  # noqa: E402
from pathlib import Path  # noqa: E402


# The longest files, longest first. pytest-xdist (--dist loadfile --no-loadscope-reorder)
# hands files to its workers in collection order; a long file that starts last would
# leave the other worker idle for its whole length, so these start first and the short
# ones fill in. (With both cores busy to the end, this did not change the suite's time
# on the 2-core CI machine; it keeps a long file from being the last one handed out.)
LONGEST_FIRST = (
    "test/srt/test_frozen_kv_mtp_engine.py",
    "test/srt/test_soak_server.py",
    "test/srt/test_pd_faults.py",
    "test/srt/test_frozen_kv_mtp_yoco.py",
    "test/srt/test_request_validation.py",
    "test/bench/test_closeness.py",
    "test/bench/test_served_benchmark.py",
    "test/bench/test_checkpoint.py",
)


REPO = Path(__file__).resolve().parents[2]


def _not_ported() -> tuple[str, set[str], set[str], str]:
    """(the installed fork's upstream version, the tests its base's series leaves out, the
    files of the tests it runs, why). A base leaves out the tests of stacks it has not
    ported yet (bases/VERSION/ may not have them all) and those marked for other
    releases' code only (bases=); they cannot run there, and are counted."""
    version = importlib.metadata.version("sglang").split("+")[0]
    spec = importlib.util.spec_from_file_location("fork_tool", REPO / "tools" / "fork.py")
    fork = importlib.util.module_from_spec(spec)
    sys.modules["fork_tool"] = fork  # dataclasses look the module up
    spec.loader.exec_module(fork)
    base = fork.Fork(base=version)
    # Porting a stack: SGLANG_FORK_RUN_UNPORTED=1 runs its tests anyway, to see what fails.
    if os.environ.get("SGLANG_FORK_RUN_UNPORTED") == "1":
        return version, set(), set(), ""
    tests, _ = fork.collect_marked_tests(base)
    steps = fork.read_series(base)
    kept, left_out = fork.tests_of_base(base, tests, steps)
    why = fork.left_out_why(base, left_out, steps) if left_out else ""
    return (version, {t.nodeid for t in left_out}, {t.nodeid.split("::")[0] for t in kept},
            why)


VERSION, NOT_PORTED, PORTED_FILES, LEFT_OUT_WHY = _not_ported()
NOT_PORTED_FILES = {n.split("::")[0] for n in NOT_PORTED} - PORTED_FILES


def pytest_ignore_collect(collection_path, config):
    # A file whose every test is of a stack not ported is not even imported (it imports
    # the stack's modules); a file with some ported tests is collected, the rest left out.
    try:
        rel = collection_path.resolve().relative_to(REPO).as_posix()
    except ValueError:
        return None
    return True if rel in NOT_PORTED_FILES else None


def pytest_collection_modifyitems(session, config, items):
    if NOT_PORTED:
        keep, drop = [], []
        for item in items:
            top = "::".join(item.nodeid.split("::")[:2]).split("[")[0]
            (drop if top in NOT_PORTED else keep).append(item)
        if drop:
            config.hook.pytest_deselected(items=drop)
            items[:] = keep
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}
    # stable: a file's tests stay together and in order, the other files keep theirs
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))


def pytest_terminal_summary(terminalreporter):
    if NOT_PORTED:
        files = sorted({n.split("::")[0] for n in NOT_PORTED})
        terminalreporter.write_line(
            f"sglang {VERSION}: {LEFT_OUT_WHY} ({len(files)} files; tools/fork.py "
            "tests_of_base)")
    # A test's record_property("summary", ...) line (the soak test's counts) shows in
    # the run's log when the test passes, also from pytest-xdist workers, whose own
    # output never reaches the terminal.
    for rep in terminalreporter.stats.get("passed", []):
        for name, value in getattr(rep, "user_properties", ()):
            if name == "summary" and rep.when == "call":
                terminalreporter.write_line(f"{rep.nodeid}: {value}")
