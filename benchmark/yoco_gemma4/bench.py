#!/usr/bin/env python3
"""YOCO fast prefill benchmarks: one command per measurement, on any CUDA machine with the fork.

    python benchmark/yoco_gemma4/bench.py prefill OUT.json [--variant e4b|e2b|3n-e4b|3n-e2b] [--points 1024x8,...]
    python benchmark/yoco_gemma4/bench.py forward OUT.json [--variant ...] [--lens 1024,4096] [--batches 1]
    python benchmark/yoco_gemma4/bench.py serve   OUTDIR   [--variant ...] [--workloads summ,chat] [--multimodal]
    python benchmark/yoco_gemma4/bench.py parity  OUT.json [--variant ...] [--deterministic]
    python benchmark/yoco_gemma4/bench.py checkpoint DIR   [--variant ...] [--multimodal]

prefill     One prefill pass per batch through `sglang.Engine` (max_new_tokens=1, radix
            cache off), YOCO off, on-all (the fast path on every pass) and the ceiling (the
            fast path without its back half, the same model). Per point: a discarded
            warm-up pass of its shape, then --repeats (at least 5) timed; median, min and
            spread ((max - min) / median), a point above 10 % flagged unstable. Writes
            OUT.json ({"results": [{mode, len, batch, median_s, min_s, spread, unstable,
            times_s, ...}], "table": [...]}), RESULT and SHARE lines.
forward     One forward alone, timed in process (`sglang.bench_one_batch`), for short,
            host-bound passes. Writes OUT.json ({"table": [{len, batch, off_ms, ...}]}).
serve       One server per mode (off, on), `python -m sglang.benchmark.serving` on random
            ids: summ 8000/1000 and chat 1000/1000, 80 prompts each, each server warmed up.
            Writes OUTDIR/results.{json,md} (output tok/s, median/p99 TTFT, median TPOT).
parity      Greedy outputs YOCO off against on over 240 prompts up to 16k tokens;
            --deterministic serves both under --enable-deterministic-inference. Counts apart
            on vs off, off in another batch mix, and a prefix-cache hit against its cold
            serve (identical outputs, top-5 logprob differences); exits 1 on a first token
            whose top-5 sets do not overlap, on vs off or in the other mix. Writes OUT.json.
checkpoint  The checkpoint the others serve: the real E2B/E4B text config, a synthetic
            tokenizer, weights from `--load-format dummy` at a trained model's scale.

Any other option goes to the script behind the command (its --help lists them):
prefill_bench.py, forward_bench.py, run.py --skip-prefill, parity_check.py, make_checkpoint.py.
--dry-run prints the command and exits. Weights are seeded random at scale, so the timings
are a real model's and the texts are not.
"""

import os
import shlex
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

# command -> (script, arguments it always gets, convenience flags -> what they expand to)
COMMANDS = {
    "prefill": ("prefill_bench.py", ["--modes", "off,on-all,ceiling"], {}),
    "forward": ("forward_bench.py", ["--modes", "off,on-all,ceiling", "--graphs"], {}),
    "serve": ("run.py", ["--skip-prefill"], {}),
    "parity": ("parity_check.py", [], {
        "--deterministic": ["--extra", '{"enable_deterministic_inference": true, "attention_backend": "triton"}'],
    }),
    "checkpoint": ("make_checkpoint.py", [], {}),
}


def build(commands, here, argv):
    """argv -> (the command line to run, dry_run); exits with usage on a bad command."""
    if not argv or argv[0] not in commands:
        sys.exit(f"usage: {os.path.basename(sys.argv[0])} {{{'|'.join(commands)}}} ... [--dry-run] "
                 "(--help after a command lists its options)")
    script, fixed, flags = commands[argv[0]]
    rest = argv[1:]
    dry = "--dry-run" in rest
    rest = [a for a in rest if a != "--dry-run"]
    if "--help" in rest or "-h" in rest:
        return [sys.executable, os.path.join(here, script), "--help"], False
    out = []
    for a in rest:
        out += flags.get(a, [a])
    given = {a.split("=")[0] for a in out if a.startswith("--")}
    fixed = [x for i, x in enumerate(fixed) if not (x in given or (i and fixed[i - 1] in given))]
    return [sys.executable, os.path.join(here, script), *out, *fixed], dry


def main(commands=COMMANDS, here=HERE, doc=__doc__):
    argv = sys.argv[1:]
    if argv[:1] in (["-h"], ["--help"]):
        print(doc)
        return 0
    cmd, dry = build(commands, here, argv)
    print("$", shlex.join([os.path.basename(cmd[0])] + [os.path.relpath(cmd[1])] + cmd[2:]), flush=True)
    if dry:
        return 0
    return subprocess.call(cmd)


if __name__ == "__main__":
    sys.exit(main())
