import logging
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
# Helpers shared with the product's tests (tiny_gemma, cpu_engine) live in test/srt.
sys.path.insert(0, os.path.join(HERE, "..", "srt"))
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
os.environ.setdefault("SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN", "1")


def pytest_sessionfinish(session, exitstatus):
    logging.raiseExceptions = False  # engines' atexit logging into closed capture streams
