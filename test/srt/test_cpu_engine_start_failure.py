"""The CPU test engine's start-up failures fail one test, with their cause.

A scheduler that fails at start-up sends SIGQUIT to the process that started
it; stock's handler then SIGKILLs that process, here pytest, which ended whole CI
runs as "Killed" with the child's traceback lost. `cpu_engine.ENGINE_DEFAULTS`
installs a handler that stops the engine's processes and raises instead.
"""

import os
import subprocess
import sys
import textwrap
import pytest

from tiny_gemma import make_tiny_gemma4

pytestmark = pytest.mark.stack("cpu-reference")

HERE = os.path.dirname(os.path.abspath(__file__))

# In a process of its own: without the handler it is SIGKILLed, which must fail
# this test, not end the run.
SCRIPT = textwrap.dedent(
    """
    import gc, os, sys
    sys.path.insert(0, {here!r})
    from cpu_engine import EngineStartFailed, engine_greedy, start_engine

    if __name__ == "__main__":
        model = {model!r}
        weights = os.path.join(model, "model.safetensors")
        os.rename(weights, weights + ".away")  # the scheduler finds no weights to load
        try:
            start_engine(model)
        except EngineStartFailed as e:
            print("raised:", e, flush=True)
        os.rename(weights + ".away", weights)
        gc.collect()  # the failed engine's leftovers must not block
        eng = start_engine(model)
        try:
            ((tokens, _),) = engine_greedy(eng, [[5, 6, 7, 8]], 3)
        finally:
            eng.shutdown()
        print("served", len(tokens), flush=True)
    """
)


def test_scheduler_start_up_failure_raises_in_the_test(tmp_path):
    model = make_tiny_gemma4(str(tmp_path / "model"))
    script = tmp_path / "start_failure.py"
    script.write_text(SCRIPT.format(here=HERE, model=model))
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, (run.returncode, run.stderr[-3000:])
    assert "raised: an engine subprocess failed at start-up" in run.stdout
    assert "Scheduler hit an exception" in run.stderr
    assert "served 3" in run.stdout  # the same process starts the next engine and serves
