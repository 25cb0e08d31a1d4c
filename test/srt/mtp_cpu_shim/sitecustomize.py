"""Test-only: lets FROZEN_KV_MTP run on this CPU machine (run by every Python process
started with this folder on PYTHONPATH, the engine's scheduler included).

The CPU test machine is neither CUDA nor SGLang's CPU backend (no sgl_kernel), so
stock modules (two on 0.5.17, three on 0.5.23) pick no implementation for the
speculative tree build, the greedy tree verify and the verify's cache slots. Stock ships Triton versions of all three
(the XPU path); this routes those gates there, and Triton's interpreter runs them.
On a GPU the CUDA sgl_kernel ops run instead. Each patch applies when the process
imports its module (after_import.py), so processes that never do pay nothing.
"""

import os

from after_import import after_import


def _route_to_triton(module):
    module._is_xpu = True


if os.environ.get("SGLANG_TEST_MTP_CPU_SHIM") == "1":
    after_import("sglang.srt.speculative.eagle_utils", _route_to_triton)
    after_import("sglang.kernels.ops.speculative.cache_locs", _route_to_triton)
    # SGLang 0.5.23 moved the tree build's and greedy verify's gates here (absent on 0.5.17)
    after_import("sglang.kernels.ops.speculative.spec_tree", _route_to_triton)

if os.environ.get("SGLANG_TEST_CHAIN_VERIFY_ON_CPU") == "1":
    # SGLang 0.5.23 selects the chain verify on CUDA only (it is tuned for sm_90);
    # let the selection see this CPU as CUDA, for that call alone, so the engine
    # tests exercise it through Triton's interpreter.
    def _select_chain_verify_on_cpu(triton_backend):
        _select_verify_splitkv = triton_backend._select_verify_splitkv

        def _select_on_cpu(*args, **kwargs):
            was, triton_backend._is_cuda = triton_backend._is_cuda, True
            try:
                return _select_verify_splitkv(*args, **kwargs)
            finally:
                triton_backend._is_cuda = was

        triton_backend._select_verify_splitkv = _select_on_cpu

    after_import("sglang.srt.layers.attention.triton_backend", _select_chain_verify_on_cpu)

if os.environ.get("SGLANG_TEST_ONE_NODE_TAIL_LOG"):
    # Record each round the one-node greedy verify tail (step one-node-greedy-verify-tail) answered,
    # so an engine test can tell it ran.
    def _log_tail_rounds(one_node_greedy_verify):
        _tail_call = one_node_greedy_verify.OneNodeGreedyVerifyTail.__call__

        def _logged_tail_call(self, batch, *args, **kwargs):
            result = _tail_call(self, batch, *args, **kwargs)
            if result is not None:
                with open(os.environ["SGLANG_TEST_ONE_NODE_TAIL_LOG"], "a") as f:
                    f.write(f"{len(batch.seq_lens)}\n")
            return result

        one_node_greedy_verify.OneNodeGreedyVerifyTail.__call__ = _logged_tail_call

    after_import("sglang.srt.speculative.one_node_greedy_verify", _log_tail_rounds)

if os.environ.get("SGLANG_TEST_MTP_ORACLE_DRAFTS"):
    # An oracle drafter: the drafter's chain is replaced by the target's own greedy
    # continuation (the file: [[prompt, no-speculation greedy output, offset], ...]),
    # right for the first d tokens of a round and wrong after, d = (round + offset) mod
    # (steps + 2), at most every draft token, so verify accepts every length, the full
    # chain included. A drafter with random weights is accepted almost never; then each
    # round keeps one token and frees the KV of the others unread.
    def _oracle_drafts(worker_module):
        import json

        worker = worker_module.FrozenKVMTPDraftWorker
        draft, draft_forward = worker.draft, worker.draft_forward
        with open(os.environ["SGLANG_TEST_MTP_ORACLE_DRAFTS"]) as f:
            reference = {tuple(p): (p + out, offset) for p, out, offset in json.load(f)}

        rounds = {}

        def _draft(self, batch):
            self._oracle_batch = batch
            return draft(self, batch)

        def _draft_forward(self, forward_batch):
            parents, index, tokens = draft_forward(self, forward_batch)
            batch, steps = self._oracle_batch, tokens.shape[1]
            for i, req in enumerate(batch.reqs):
                if tuple(req.origin_input_ids) not in reference:
                    continue
                full, offset = reference[tuple(req.origin_input_ids)]
                # the bonus token (the last verified one) sits at position seq_len
                start = int(batch.seq_lens[i]) + 1
                rounds[req.rid] = rounds.get(req.rid, -1) + 1
                right = (rounds[req.rid] + offset) % (steps + 2)
                for k in range(steps):
                    t = full[start + k] if start + k < len(full) else 3
                    tokens[i, k] = t if k < right else (t + 1) % 500 + 5
            return parents, index, tokens

        worker.draft, worker.draft_forward = _draft, _draft_forward

    after_import("sglang.srt.speculative.frozen_kv_mtp_worker_v2", _oracle_drafts)

if os.environ.get("SGLANG_TEST_MTP_HOST_SYNC_LOG"):
    # Each decode round (draft, verify, the next seed) under host_sync_probe: one
    # "round" line, then one line per read that would block the host on a GPU.
    def _probe_rounds(worker_module):
        # by its path: the engine's processes may run with another sys.path by then
        import importlib.util

        spec = importlib.util.spec_from_file_location(
            "host_sync_probe", os.path.join(os.path.dirname(__file__), "host_sync_probe.py"))
        probe_module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(probe_module)
        HostSyncProbe = probe_module.HostSyncProbe

        worker = worker_module.FrozenKVMTPWorkerV2
        forward = worker.forward_batch_generation

        def _host_mirrors(*objs):
            return [v for o in objs if o is not None for k, v in vars(o).items()
                    if k.endswith("_cpu")]

        rounds = [0]

        def _probed(self, batch, *args, **kwargs):
            if batch.forward_mode.is_extend() or batch.is_extend_in_batch or batch.forward_mode.is_idle():
                return forward(self, batch, *args, **kwargs)
            # Every other round without the lengths' host mirror, as a GPU's overlap
            # scheduler runs the triton backend (it publishes none that no backend reads).
            rounds[0] += 1
            mirror = batch.seq_lens_cpu
            dropped = mirror is not None and rounds[0] % 2 == 0
            if dropped:
                batch.seq_lens_cpu = None
            try:
                with HostSyncProbe(host=_host_mirrors(batch, batch.spec_info)) as probe:
                    result = forward(self, batch, *args, **kwargs)
            finally:
                batch.seq_lens_cpu = mirror
            with open(os.environ["SGLANG_TEST_MTP_HOST_SYNC_LOG"], "a") as f:
                head = "round without mirror\n" if dropped else "round\n"
                f.write("".join([head] + [r + "\n" for r in probe.reads]))
            return result

        worker.forward_batch_generation = _probed

    after_import("sglang.srt.speculative.frozen_kv_mtp_worker_v2", _probe_rounds)
