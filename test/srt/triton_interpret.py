"""Run a test's check under Triton's interpreter (TRITON_INTERPRET=1), on CPU.

Triton reads TRITON_INTERPRET when the kernels are defined, so the check runs in a
fresh process: the test file runs itself as a script, which prints one RESULT line.

    def test_x():
        out = run_as_script(__file__)

    if __name__ == "__main__":
        print_result(_check)
"""

import json
import os
import subprocess
import sys

import pytest


def run_as_script(path, timeout=600) -> dict:
    """Run `path` with TRITON_INTERPRET=1; the JSON of its last RESULT line."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, path], env=env, capture_output=True, text=True, timeout=timeout)
    lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT ") :])


def print_result(check) -> None:
    """The script side: run `check()` and print its result as the RESULT line."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.exit("run with TRITON_INTERPRET=1")
    print("RESULT " + json.dumps(check()), flush=True)


def row_invariant_dot() -> None:
    """Make the interpreter's tl.dot compute each output row on its own.

    The interpreter runs tl.dot as numpy's matmul, whose BLAS kernel is picked by
    the block's row count, so on some CPUs a row rounds differently in a 64-row
    block than alone. A GPU kernel's row does not depend on the other rows of its
    block; a test of bit-for-bit batch invariance needs that behaviour."""
    import numpy as np
    from triton.runtime import interpreter

    class RowwiseNumpy:
        def __getattr__(self, name):
            return getattr(np, name)

        @staticmethod
        def matmul(a, b, *args, **kwargs):
            if a.ndim != 2 or a.shape[0] == 1:
                return np.matmul(a, b, *args, **kwargs)
            return np.concatenate(
                [np.matmul(a[i : i + 1], b, *args, **kwargs) for i in range(a.shape[0])]
            )

    interpreter.np = RowwiseNumpy()


def exact_bf16_dot() -> None:
    """Make the interpreter's tl.dot right for bf16 operands (call before the kernels run).

    Triton's interpreter keeps a bf16 tensor as its raw uint16 bits and its
    `create_dot` hands those to np.matmul as integers (3.8: a bf16 dot of 16x16
    N(0, 1) values comes out ~1e10 off, silently). Here bf16 operands widen to fp32
    first (exact), which is what a GPU's bf16 MMA does before its fp32 accumulate.
    Other bf16 arithmetic in the interpreter has the same flaw; the kernels these
    tests run only load, cast and dot bf16 values.
    """
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    if getattr(builder, "_exact_bf16_dot", False):
        return
    create_dot = builder.create_dot

    def widen(t):
        if t.dtype.scalar == tl.bfloat16:
            bits = (t.data.astype(np.uint32) << 16).view(np.float32)
            return interpreter.TensorHandle(bits, tl.float32)
        return t

    def dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        return create_dot(self, widen(a), widen(b), d, input_precision, max_num_imprecise_acc)

    builder.create_dot = dot
    builder._exact_bf16_dot = True
