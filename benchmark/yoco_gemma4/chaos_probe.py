"""How chaotic is a dummy-weight Gemma-4? (CPU, Hugging Face Gemma4ForCausalLM)

    python chaos_probe.py [--variants "old;chosen"] [--prompts 40] [--fp32]

Builds an E4B-*structured* text model (42 layers, E4B's layer_types, 18 KV-shared
layers, PLE, sliding window 512, E4B rope and softcap) at reduced width, fills it
with a dummy-weight variant (rules: sglang's scaled_dummy_weights.fill_scaled_dummy
applied to HF state-dict names) and, per random prompt, compares the final-token
log-softmax of:
  (b) clean vs the hidden state entering layer 24 (first KV-shared layer) at the
      last token multiplied by (1 + 2^-8 * N(0,1)) (bf16-ulp-sized noise);
  (d) prefill of the whole prompt vs prefill of prompt[:-1] + one decode step
      (same maths, other GEMM shapes: what batch mix / chunking / YOCO change);
  (c) with --fp32: the whole-prompt forward in fp32 vs bf16 (same bf16 weights).
Reports the top-1 change rate, |delta logprob| of the reference top-1, the top1-top2
margin, distinct top-1 tokens across prompts and 8-token greedy continuations.
"""

import argparse
import copy
import importlib.util
import json
import math
import os
import random
import statistics
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
SDW_PATH = os.path.join(
    HERE, "..", "..", "python", "sglang", "srt", "model_loader", "scaled_dummy_weights.py"
)

# Knob sets for fill_scaled_dummy; "chosen" = the defaults (the shipped init).
VARIANTS = {
    # The previous shipped init: norms ~1, layer_scalar U(0.5, 1), embedding RMS 1.
    "old": dict(embed_rms=1.0, layer_scalar=(0.5, 1.0), qk_unit=False),
    # One change at a time, from "old".
    "old+ls1": dict(embed_rms=1.0, qk_unit=False),
    "old+qk": dict(embed_rms=1.0, layer_scalar=(0.5, 1.0)),
    "old+emb": dict(layer_scalar=(0.5, 1.0), qk_unit=False),
    # Two of three.
    "ls1+qk": dict(embed_rms=1.0),
    "ls1+emb": dict(qk_unit=False),
    # All three: the shipped defaults.
    "chosen": dict(),
    # Neighbours of the chosen init.
    "chosen,emb0.5": dict(embed_rms=0.5),
    "chosen,emb0.125": dict(embed_rms=0.125),
    "chosen,branch0.3": dict(branch_norm=0.3),
}


def load_sdw():
    spec = importlib.util.spec_from_file_location("scaled_dummy_weights", SDW_PATH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def e4b_structured_config(args):
    from transformers import Gemma4TextConfig

    with open(os.path.join(HERE, "configs", "gemma-4-E4B-it.text_config.json")) as f:
        cfg = json.load(f)["text_config"]
    cfg.update(
        hidden_size=args.hidden,
        intermediate_size=args.intermediate,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        head_dim=args.head_dim,
        global_head_dim=args.global_head_dim,
        hidden_size_per_layer_input=args.ple,
        vocab_size=args.vocab,
        vocab_size_per_layer_input=args.vocab,
    )
    cfg.pop("model_type", None)
    return Gemma4TextConfig(**cfg)


def build(config, knobs, sdw, seed):
    from transformers import Gemma4ForCausalLM

    config._attn_implementation = "sdpa"
    with torch.device("cpu"):
        model = Gemma4ForCausalLM(config).to(torch.bfloat16).eval()
    sdw.initialize_scaled_dummy_weights(model, seed=seed, **knobs)
    return model


def logprobs(out):
    return torch.log_softmax(out.logits[0, -1].float(), -1)


def compare(ref, other):
    t = int(ref.argmax())
    return dict(flip=int(other.argmax()) != t, dlp=abs(float(ref[t] - other[t])))


class Perturb:
    """Forward pre-hook on layers[24]: relative noise on the last token's input."""

    def __init__(self, rel):
        self.rel, self.gen, self.on = rel, None, False

    def __call__(self, module, args, kwargs):
        if not self.on:
            return None
        h = args[0].clone()
        last = h[:, -1].float()
        noise = torch.randn(last.shape, generator=self.gen)
        h[:, -1] = (last * (1 + self.rel * noise)).to(h.dtype)
        return (h,) + tuple(args[1:]), kwargs


@torch.no_grad()
def probe(model, prompts, args, model32=None):
    layers = model.model.layers
    hook = Perturb(2.0**-8)
    handle = layers[args.perturb_layer].register_forward_pre_hook(hook, with_kwargs=True)
    rows = []
    try:
        for i, p in enumerate(prompts):
            ids = torch.tensor([p])
            pre = model(ids[:, :-1], use_cache=True, logits_to_keep=1)
            cache = pre.past_key_values
            step = ids[:, -1:]
            dec = model(step, past_key_values=copy.deepcopy(cache), use_cache=True)
            a = logprobs(dec)
            hook.on, hook.gen = True, torch.Generator().manual_seed(1000 + i)
            b = logprobs(model(step, past_key_values=copy.deepcopy(cache), use_cache=True))
            hook.on = False
            full = logprobs(model(ids, logits_to_keep=1))
            top2 = torch.topk(a, 2).values
            row = dict(
                n=len(p),
                top1=int(a.argmax()),
                copies_last=int(a.argmax()) == p[-1],
                margin=float(top2[0] - top2[1]),
                b=compare(a, b),
                d=compare(full, a),
            )
            if model32 is not None:
                row["c"] = compare(logprobs(model32(ids, logits_to_keep=1)), full)
            # Greedy continuation from the clean decode step.
            gen, kv, tok = [], dec.past_key_values, int(a.argmax())
            for _ in range(args.gen):
                gen.append(tok)
                o = model(torch.tensor([[tok]]), past_key_values=kv, use_cache=True)
                kv, tok = o.past_key_values, int(o.logits[0, -1].argmax())
            row["gen"] = gen
            rows.append(row)
    finally:
        handle.remove()
    return rows


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def summarize(name, rows):
    s = dict(variant=name, prompts=len(rows))
    for k in ("b", "d", "c"):
        if k not in rows[0]:
            continue
        d = [r[k]["dlp"] for r in rows]
        s[k] = dict(
            top1_change=sum(r[k]["flip"] for r in rows) / len(rows),
            med_dlp=statistics.median(d),
            max_dlp=max(d),
        )
    m = [r["margin"] for r in rows]
    s["margin"] = dict(p10=pct(m, 0.1), p25=pct(m, 0.25), median=statistics.median(m), p90=pct(m, 0.9))
    s["distinct_top1"] = len({r["top1"] for r in rows})
    s["top1_is_last_input"] = sum(r["copies_last"] for r in rows)
    s["gen_one_repeated_token"] = sum(len(set(r["gen"])) == 1 for r in rows)
    s["gen_distinct_tokens"] = len({t for r in rows for t in r["gen"]})
    s["gen_example"] = rows[0]["gen"]
    return s


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--variants", default="old;chosen", help="; separated")
    ap.add_argument("--prompts", type=int, default=40)
    ap.add_argument("--min-len", type=int, default=16)
    ap.add_argument("--max-len", type=int, default=1024)
    ap.add_argument("--gen", type=int, default=8)
    ap.add_argument("--fp32", action="store_true", help="also compare fp32 vs bf16 compute")
    ap.add_argument("--perturb-layer", type=int, default=24)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--intermediate", type=int, default=2048)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=256)
    ap.add_argument("--global-head-dim", type=int, default=512)
    ap.add_argument("--ple", type=int, default=64)
    ap.add_argument("--vocab", type=int, default=32768)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--out", default=None, help="write the summaries as JSON here")
    args = ap.parse_args()

    torch.manual_seed(0)
    sdw = load_sdw()
    config = e4b_structured_config(args)
    rng = random.Random(0)
    prompts = []
    for _ in range(args.prompts):
        n = int(math.exp(rng.uniform(math.log(args.min_len), math.log(args.max_len))))
        prompts.append([rng.randrange(10, args.vocab) for _ in range(n)])
    print(f"config: {args.hidden=} {args.head_dim=} {args.global_head_dim=} {args.vocab=}, "
          f"{config.num_hidden_layers} layers, {config.num_kv_shared_layers} kv-shared; "
          f"{len(prompts)} prompts, {sum(map(len, prompts))} tokens; threads {torch.get_num_threads()}")

    summaries = []
    for name in args.variants.split(";"):
        t0 = time.time()
        model = build(config, VARIANTS[name], sdw, args.seed)
        model32 = copy.deepcopy(model).float() if args.fp32 else None
        if name == "chosen":  # the shipped defaults, called with no knobs
            ref = build(config, {}, sdw, args.seed).state_dict()
            assert all(torch.equal(v, ref[k]) for k, v in model.state_dict().items())
        s = summarize(name, probe(model, prompts, args, model32))
        s["seconds"] = round(time.time() - t0, 1)
        print(json.dumps(s), flush=True)
        summaries.append(s)
        del model, model32

    print("\n| variant | (b) top-1 change | (b) median/max abs dlogprob | (d) top-1 change "
          "| (d) median/max | (c) fp32 top-1 change | margin p10/median | distinct top-1 | top-1 = last input | "
          "gen: all-same / distinct tokens |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for s in summaries:
        c = f"{s['c']['top1_change']:.0%}" if "c" in s else "-"
        print(f"| {s['variant']} | {s['b']['top1_change']:.0%} | {s['b']['med_dlp']:.3g} / {s['b']['max_dlp']:.3g} "
              f"| {s['d']['top1_change']:.0%} | {s['d']['med_dlp']:.3g} / {s['d']['max_dlp']:.3g} | {c} "
              f"| {s['margin']['p10']:.2f} / {s['margin']['median']:.2f} | {s['distinct_top1']}/{s['prompts']} | {s['top1_is_last_input']} "
              f"| {s['gen_one_repeated_token']} / {s['gen_distinct_tokens']} |")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(summaries, f, indent=1)


if __name__ == "__main__":
    main()
