"""tools/phase.py: each phase's time, and the CI budget warning."""
import os
import subprocess
import sys
import time
from pathlib import Path

TOOLS = Path(__file__).resolve().parents[2] / "tools"
sys.path.insert(0, str(TOOLS))
from phase import budget_warning  # noqa: E402


def test_warns_only_past_the_budget(monkeypatch):
    monkeypatch.delenv("CI_START", raising=False)
    assert budget_warning(time.time()) is None  # not under .ci/run
    monkeypatch.setenv("CI_START", "1000")
    monkeypatch.setenv("CI_BUDGET_S", "2700")
    assert budget_warning(3700) is None
    line = budget_warning(3701)
    assert line.startswith("[phase] WARNING: CI has run 2701 s, past its 2700 s budget")


def test_a_phase_past_the_budget_prints_the_warning_after_its_time():
    env = dict(os.environ, CI_START=str(time.time() - 3000), CI_BUDGET_S="2700")
    out = subprocess.run([sys.executable, str(TOOLS / "phase.py"), "probe", sys.executable, "-c", "pass"],
                         env=env, capture_output=True, text=True, check=True).stdout.splitlines()
    assert out[0] == "[phase] probe: 0 s (exit 0)" and out[1].startswith("[phase] WARNING: CI has run 3000 s")
