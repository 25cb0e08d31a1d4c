"""Re-exports tiny_gemma for conftest.py, test_frozen_kv_mtp_yoco.py and benchmark/ (not yet switched)."""
from tiny_gemma import GEMMA4_TEXT_CONFIG as TINY_TEXT_CONFIG, make_tiny_gemma4  # noqa: F401
