"""Shared helpers: a tiny Gemma-4 served by the fork on CPU, and its HF reference."""

import os

import torch
from release import RELEASE


class EngineStartFailed(RuntimeError):
    pass


def _engine_start_failed(signum, frame):
    # A scheduler or detokenizer that fails at start-up sends SIGQUIT. Stock's
    # handler then SIGKILLs the whole process tree, pytest included, and the run
    # ends as "Killed" with the child's traceback (in pytest's captured stderr)
    # lost. Kill only the engine's processes and fail the test that started it.
    import gc

    import zmq

    from sglang.srt.utils.common import kill_process_tree

    kill_process_tree(os.getpid(), include_parent=False)
    # One of the half-built engine's ZMQ contexts, collected later, blocked the
    # next test's generate for good (seen once; sockets of a default linger wait
    # on what they hold). No other engine is running: close them all now.
    for obj in gc.get_objects():
        if isinstance(obj, zmq.Context) and not obj.closed:
            obj.destroy(linger=0)
    raise EngineStartFailed("an engine subprocess failed at start-up; its 'hit an "
                            "exception' traceback is in this test's captured stderr")


ENGINE_DEFAULTS = dict(
    device="cpu",
    attention_backend="torch_native",
    dtype="float32",
    skip_tokenizer_init=True,
    disable_cuda_graph=True,
    max_total_tokens=8192,  # caps the KV pool, whatever mem_fraction_static allows
    max_running_requests=64,
    # On CPU the KV budget is system RAM that every process shares: the pool
    # gets what is available after loading minus (1 - this) x what was available
    # before. At 0.05 (about 1 GB here) an MTP drafter's own load (0.5-0.8 GB)
    # plus the detokenizer starting beside it could use it all up, and the
    # scheduler failed at start-up now and then.
    mem_fraction_static=0.5,
    custom_sigquit_handler=_engine_start_failed,
    # An idle scheduler polls without pause otherwise: a whole core each (measured: 10 s of
    # CPU in 10 s idle, 0.1 s with this), taken from the other test process and from the
    # engines a test runs beside it (two engines of one fixture, a PD pair).
    sleep_on_idle=True,
    log_level="error",
    random_seed=0,
)

# The triton backend run by Triton's interpreter (TRITON_INTERPRET=1 in the scheduler
# process), as the FROZEN_KV_MTP engine tests and `closeness.py --tiny` serve: CPU
# streams cannot record, so no overlap scheduling. Two KV splits, not the default 8: the
# interpreter runs each (row, head, split) program of a decode or verify kernel in
# Python, and most of 8 splits over these short prompts are empty. The reduction over
# splits still runs.
TRITON_ENGINE = dict(ENGINE_DEFAULTS, attention_backend="triton", disable_overlap_schedule=True,
                     max_running_requests=8, triton_attention_num_kv_splits=2)

# What a YOCO test adds: the tiny model's prompts are short, so the fast path
# takes every pass (the defaults above pass no YOCO argument: they also start
# the engine at steps of the series before the flag exists).
YOCO = dict(kv_sharing_fast_prefill=True, kv_sharing_fast_prefill_min_tokens=0)


def server_arg_names() -> frozenset:
    """The server arguments this SGLang takes."""
    from sglang.srt.server_args import ServerArgs

    if RELEASE >= (0, 5, 23):
        return frozenset(ServerArgs.__struct_fields__)  # a msgspec struct
    return frozenset(ServerArgs.__dataclass_fields__)


def start_engine(model_path: str, **overrides):
    import sglang as sgl

    from server_process import free_port

    kwargs = dict(ENGINE_DEFAULTS, nccl_port=free_port())
    kwargs.update(overrides)
    return sgl.Engine(model_path=model_path, **kwargs)


def decisive_prompts(hf, candidates, max_new_tokens, min_margin=1e-3):
    """Keep prompts whose greedy continuation has no near-tie, with references."""
    kept = {}
    for p in candidates:
        toks, lps, margin = hf.greedy(p, max_new_tokens)
        if margin >= min_margin:
            kept[tuple(p)] = (toks, lps)
    return kept


# fp32 on CPU, engine against HF eager. Seen on an AVX-512/AMX Xeon (2026-11-30): up to
# 1.02e-4 with the SWA pool under pressure, under 5e-5 in every other test; 1e-4 failed
# there. The decisive tokens are still compared exactly, before the logprobs.
LOGPROB_ATOL = 3e-4


def greedy_of(output):
    """(tokens, logprobs) of one generate() output."""
    lp = output["meta_info"]["output_token_logprobs"]
    return [t for _, t, _ in lp], [v for v, _, _ in lp]


def assert_same_greedy(got, want, prompt, atol=LOGPROB_ATOL):
    """Identical greedy tokens and per-token logprobs within `atol`."""
    toks, lps = got
    ref_toks, ref_lps = want
    assert toks == ref_toks, f"greedy tokens differ for a prompt of {len(prompt)} tokens"
    for a, b in zip(lps, ref_lps):
        assert abs(a - b) <= atol, (len(prompt), lps, ref_lps)


def engine_greedy(engine, prompts, max_new_tokens, **extra):
    """Greedy outputs [(token_ids, logprobs)] for prompts sent as one batch."""
    outs = engine.generate(
        input_ids=prompts,
        sampling_params={"max_new_tokens": max_new_tokens, "temperature": 0.0},
        return_logprob=True,
        **extra,
    )
    return [greedy_of(o) for o in outs]


class HFReference:
    """Hugging Face transformers' causal LM (Gemma4ForCausalLM unless named) on the
    same checkpoint."""

    def __init__(self, model_path: str, causal_lm: str = "Gemma4ForCausalLM"):
        import transformers

        self.model = getattr(transformers, causal_lm).from_pretrained(
            model_path, torch_dtype=torch.float32
        ).eval()

    @torch.no_grad()
    def greedy(self, prompt, max_new_tokens):
        """(tokens, logprobs, margin): margin is the smallest top-1 minus top-2
        logprob gap; below ~1e-3 a greedy pick is a numerical tie."""
        ids = torch.tensor([prompt])
        tokens, logprobs, margin = [], [], float("inf")
        past = None
        for _ in range(max_new_tokens):
            out = self.model(ids if past is None else ids[:, -1:], past_key_values=past, use_cache=True)
            past = out.past_key_values
            lp = torch.log_softmax(out.logits[0, -1].float(), dim=-1)
            top2 = lp.topk(2).values
            margin = min(margin, float(top2[0] - top2[1]))
            t = int(lp.argmax())
            tokens.append(t)
            logprobs.append(float(lp[t]))
            ids = torch.cat([ids, torch.tensor([[t]])], dim=1)
        return tokens, logprobs, margin
