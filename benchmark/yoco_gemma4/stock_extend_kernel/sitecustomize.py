"""Bench-only: a process started with this folder on PYTHONPATH serves with stock's
triton extend kernels, whose sliding-window loops walk every key tile from key 0.

The fork's module (step 02/0023 bounds those loops) is replaced, when the process
first imports it, by a copy with the loops from key 0 (window_tiles.stock_source_file,
the same rewrite window_tiles.py times); nothing else changes. forward_bench.py's
`off-stock-kernel` mode runs bench_one_batch this way beside `off`.
"""

import importlib.abc
import importlib.util
import os
import sys

NAME = "sglang.kernels.ops.attention.extend_attention"
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class StockExtendKernels(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname != NAME:
            return None
        sys.meta_path.remove(self)
        from window_tiles import release_loops, stock_source_file

        fork = importlib.util.find_spec(fullname)
        loops = release_loops()
        if loops is None:
            sys.exit("stock_extend_kernel: this sglang release's loops are unknown")
        print(f"stock_extend_kernel: {NAME} with {', '.join(loops)} loops from key 0",
              file=sys.stderr, flush=True)
        return importlib.util.spec_from_file_location(
            fullname, stock_source_file(fork.origin, loops))


sys.meta_path.insert(0, StockExtendKernels())
