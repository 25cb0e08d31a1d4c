"""tools/check_env.py refuses, with cause and fix, a disk too full for the venv."""
import importlib.util
import shutil
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tools"))
_spec = importlib.util.spec_from_file_location("check_env", REPO / "tools" / "check_env.py")
check_env = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(check_env)

GIB = 1024**3


def test_enough_space_passes():
    assert check_env.disk_error(Path("/x"), check_env.NEED_BYTES) is None
    assert check_env.disk_error(Path("/x"), 70 * GIB) is None


def test_too_little_space_names_cause_and_fix():
    msg = check_env.disk_error(Path("/x"), int(0.3 * GIB))
    assert msg.startswith("error: 0.3 GiB free on the disk of /x")
    assert "No space left on device" in msg and "Free space" in msg


def test_main_exits_before_pip_on_a_full_disk(monkeypatch, tmp_path):
    usage = shutil.disk_usage(REPO)
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage._replace(free=GIB))
    monkeypatch.chdir(tmp_path)  # a clean clone: no .venv yet
    with pytest.raises(SystemExit) as exc:
        check_env.main([])
    assert "1.0 GiB free" in str(exc.value)
    # updating an existing venv is not refused
    (tmp_path / ".venv").mkdir()
    check_env.main([])
    # ... but another base's new venv beside it is: each needs its own 6 GB
    with pytest.raises(SystemExit) as exc:
        check_env.main([".venv-0.5.23"])
    assert "1.0 GiB free" in str(exc.value)
    (tmp_path / ".venv-0.5.23").mkdir()
    check_env.main([".venv-0.5.23"])
