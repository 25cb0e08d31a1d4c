import os
import sys

# Tests import helpers (tiny_gemma4) that live next to them.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# CPU reference path: never pick a GPU, keep CPU threads predictable.
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
os.environ.setdefault("SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN", "1")
