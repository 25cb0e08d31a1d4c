"""Re-exports tiny_gemma for test_gemma3n_yoco.py and benchmark/ (not yet switched)."""
from tiny_gemma import GEMMA3N_TEXT_CONFIG as TINY_TEXT_CONFIG, make_tiny_gemma3n  # noqa: F401
