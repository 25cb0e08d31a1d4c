import logging
import os
import sys

import pytest

# Tests import helpers (tiny_gemma4) that live next to them.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# CPU reference path: never pick a GPU, keep CPU threads predictable.
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
os.environ.setdefault("SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN", "1")


def pytest_terminal_summary(terminalreporter):
    # A test's record_property("summary", ...) line (the soak test's counts) shows in
    # the run's log when the test passes, also from pytest-xdist workers, whose own
    # output never reaches the terminal.
    for rep in terminalreporter.stats.get("passed", []):
        for name, value in getattr(rep, "user_properties", ()):
            if name == "summary" and rep.when == "call":
                terminalreporter.write_line(f"{rep.nodeid}: {value}")


def pytest_sessionfinish(session, exitstatus):
    # Every engine shuts down once more at exit (atexit) and logs through the
    # handler SGLang bound to a capfd test's stream, closed by now: a "Logging
    # error" traceback each, printed after the summary line (16 per run).
    logging.raiseExceptions = False


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory):
    """The seeded tiny Gemma-4 (tiny_gemma4.py), written once for every test file."""
    from tiny_gemma4 import make_tiny_gemma4

    return make_tiny_gemma4(str(tmp_path_factory.mktemp("tiny_gemma4")), seed=0)


@pytest.fixture(scope="session")
def hf(model_dir):
    """Hugging Face transformers' reference run of that model."""
    from cpu_engine import HFReference

    return HFReference(model_dir)


def pytest_configure(config):
    # Read statically by tools/fork.py check --each to run each test at its step.
    config.addinivalue_line(
        "markers",
        "stack(name, step=None, fails_before=False): the PR stack (and step) that "
        "introduces what the test covers",
    )
