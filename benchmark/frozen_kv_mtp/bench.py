#!/usr/bin/env python3
"""FROZEN_KV_MTP benchmarks: one command per measurement, on any CUDA machine with the fork.

    python benchmark/frozen_kv_mtp/bench.py step   OUT_DIR  [--target 31b|e4b] [--batches 8] [--contexts 220,2460]
    python benchmark/frozen_kv_mtp/bench.py serve  OUT_DIR  [--modes nospec,mtp-splitkv-mrr80-adaptive] [--workloads chat]
    python benchmark/frozen_kv_mtp/bench.py kernel OUT.json [--shape 31b|e4b] [--batches 1,8] [--contexts 220,2460]
    python benchmark/frozen_kv_mtp/bench.py parity OUT.json [--prompts 200] [--extra JSON]
    python benchmark/frozen_kv_mtp/bench.py closeness OUT.json [--target e4b|31b] [--page-size 1] [--tiny]

step    Decode step time and tok/s per request over batch x context, no speculation
        (off), stock FROZEN_KV_MTP (mtp: extend verify) and the fork's split-KV grouped
        verify (mtp-splitkv-grouped), E4B assistant drafter, 3 steps, topk 1, simulated
        accept length 2.1. Writes OUT_DIR/profile_draft-TARGET.json ({"results": [{mode,
        batch, context, step_ms, tok_s_per_req, accept_len}]}) and RESULT lines.
serve   One E4B server per mode, `sglang.benchmark.serving` chat 1000/1000 at 80 prompts
        (and chat-c8); modes nospec, mtp, mtp-splitkv, ...-mrr80 (80 running requests),
        ...-adaptive (--speculative-adaptive). Writes OUT_DIR/serve_mtp.json and ROW lines.
        --workloads mturn: multi-turn chats instead (multiturn.py: 8 users, 4 rounds,
        histories from 2400-3100 tokens growing by each turn and reply, 160 new tokens
        streamed, radix cache on): per-request decode speed and TTFT.
kernel  The verify's attention kernel alone (extend, split-KV, grouped chain verify).
parity  Greedy outputs of FROZEN_KV_MTP with YOCO off and on (mtp_check.py).
closeness  Greedy outputs of no speculation (nospec), FROZEN_KV_MTP with stock's verify
        (mtp) and with the split-KV verify (mtp-splitkv), real acceptance, 200 prompts of
        100-2500 tokens, 64 new tokens, one engine at a time. Writes OUT.json (per mode:
        outputs, wall times; per comparison: identical count, first-divergence histogram,
        largest first-token logprob difference) and RESULT lines. --tiny: the CPU smoke run.

Any other option goes to the script behind the command (its --help lists them):
profile_draft.py, serve_mtp.py, verify_kernel_bench.py, ../yoco_gemma4/mtp_check.py,
closeness.py.
--dry-run prints the command and exits. The 31B target reads
benchmark/yoco_gemma4/configs/gemma-4-31B-it.text_config.json.
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "yoco_gemma4"))
from bench import main  # noqa: E402

COMMANDS = {
    "step": ("profile_draft.py", ["--modes", "off,mtp,mtp-splitkv-grouped", "--batches", "8"], {}),
    "serve": ("serve_mtp.py", ["--modes", "nospec,mtp-splitkv-mrr80-adaptive"], {}),
    "kernel": ("verify_kernel_bench.py", [], {}),
    "parity": (os.path.join("..", "yoco_gemma4", "mtp_check.py"), [], {}),
    "closeness": ("closeness.py", [], {}),
}

if __name__ == "__main__":
    sys.exit(main(COMMANDS, HERE, __doc__))
