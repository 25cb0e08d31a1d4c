"""One sliding-window layer's extend attention, stock loops vs the window's first tile.

    python benchmark/yoco_gemma4/window_tiles.py [--tokens 4096,8192] [--repeats 20]
        [--warmup 5] [--config configs/gemma-4-E4B-it.text_config.json] [--out OUT.json]
    python benchmark/yoco_gemma4/window_tiles.py --interpret   # CPU dry run, tiny shapes

Times triton's extend kernels (sglang.kernels.ops.attention.extend_attention) on one
Gemma-4 layer's shapes (default E4B: 8 query heads, 2 KV heads, head_dim 256, window
512, i.e. sliding_window_size 511; its full layers: head_dim 512) with CUDA events,
median of --repeats after --warmup, bf16:

- sliding / cold: a fresh prompt of N tokens (_fwd_kernel, no prefix);
- sliding / chunk: N tokens after a chunk (_fwd_kernel with the window's 511 prefix keys);
- sliding / deterministic: a fresh prompt through _fwd_kernel_unified
  (--enable-deterministic-inference);
- full / cold: a full-attention layer of N tokens (no window), for reference.

"patched" is the installed kernel (the fork with step 02/0023
triton-extend-window-start-tile). "stock" is the same module with the loops that step
bounds started at key 0 again, loaded from a rewritten copy of the installed file:
on 0.5.17 the prefix, extend and unified loops (the wheel's code), on 0.5.23 the
prefix loop only (upstream bounds the others). Both run on the same inputs, and the
JSON says whether their outputs are equal bit for bit. "floor_ms" is the window's own
work at the device's peak: 4 * head_dim * q_heads FLOPs per (query, in-window key)
pair, and Q, K, V, O read or written once, max of the two times (H100 SXM by default:
989 TFLOP/s bf16 dense, 3.35 TB/s; --peak-tflops / --peak-tbps for another card).

Needs a CUDA device and the fork installed; --interpret runs the same code on CPU
through Triton's interpreter with tiny shapes, to show the script works (its times
mean nothing).
"""

import argparse
import importlib.metadata
import importlib.util
import json
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
# The loops step 02/0023 bounds, as written after it, and stock's (from key 0).
LOOPS = {
    "prefix": ("range(prefix_start, ", "range(0, "),
    "extend": ("range(extend_start, ", "range(0, "),
    "unified": ("range(start_k, end_k, ", "range(0, cur_seq_kv_len, "),
}
STEP_LOOPS = {"0.5.17": ("prefix", "extend", "unified"), "0.5.23": ("prefix",)}


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", default="4096,8192")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--config", default=os.path.join(HERE, "configs", "gemma-4-E4B-it.text_config.json"))
    ap.add_argument("--stock-loops", default=None,
                    help="loops to start at key 0 for stock (default: the step's on this release)")
    ap.add_argument("--peak-tflops", type=float, default=989.0)
    ap.add_argument("--peak-tbps", type=float, default=3.35)
    ap.add_argument("--interpret", action="store_true", help="CPU, Triton's interpreter, tiny shapes")
    ap.add_argument("--out", default=None)
    return ap.parse_args()


def layer_shapes(path, interpret):
    if interpret:
        return {"q_heads": 2, "kv_heads": 1, "head_dim": 32, "full_head_dim": 64, "window": 64}
    with open(path) as f:
        cfg = json.load(f)
    cfg = cfg.get("text_config", cfg)
    return {
        "q_heads": cfg["num_attention_heads"],
        "kv_heads": cfg["num_key_value_heads"],
        "head_dim": cfg["head_dim"],
        "full_head_dim": cfg.get("global_head_dim") or cfg["head_dim"],
        "window": cfg["sliding_window"],
    }


def stock_loops(src, loops):
    """`src` with `loops` from key 0 (stock's), and how often each bounded loop was found."""
    found = {}
    for name in loops:
        new, old = LOOPS[name]
        found[name] = src.count(new)
        src = src.replace(new, old)
    return src, found


def _source_file(src):
    """`src` in a file of its own: Triton reads a kernel's source from its file."""
    path = os.path.join(tempfile.mkdtemp(), "stock_extend_attention.py")
    with open(path, "w") as f:
        f.write(src)
    return path


def _load(path):
    """The extend kernels' module run from the file at `path` (as stock_extend_attention)."""
    spec = importlib.util.spec_from_file_location("stock_extend_attention", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def module_from_source(src):
    """The extend kernels' module run from `src` (as stock_extend_attention)."""
    return _load(_source_file(src))


def stock_source_file(path, loops):
    """A copy of the extend kernels' module at `path` with `loops` from key 0 (each
    must be there once), in a file of its own."""
    with open(path) as f:
        src, found = stock_loops(f.read(), loops)
    missing = [LOOPS[n][0] for n, c in found.items() if c != 1]
    if missing:
        raise ValueError(f"{path}: no single loop {missing} (is step 02/0023 installed?)")
    return _source_file(src)


def release_loops():
    """The loops step 02/0023 bounds on the installed release (None: unknown)."""
    version = importlib.metadata.version("sglang").split("+")[0]
    return STEP_LOOPS.get(".".join(version.split(".")[:3]))


def stock_module(ea, loops):
    """The installed module with `loops` from key 0, loaded from a rewritten copy."""
    return _load(stock_source_file(ea.__file__, loops))


def window_floor(n, prefix, radius, shapes, head_dim, peak_tflops, peak_tbps):
    """ms of the window's own FLOPs and bytes at peak (radius -1: full causal)."""
    pairs = 0
    for i in range(n):
        seen = prefix + i + 1
        pairs += seen if radius < 0 else min(seen, radius + 1)
    flops = 4 * head_dim * shapes["q_heads"] * pairs
    elems = (2 * n * shapes["q_heads"] + 2 * (n + prefix) * shapes["kv_heads"]) * head_dim
    return 1e3 * max(flops / (peak_tflops * 1e12), 2 * elems / (peak_tbps * 1e12))


def main():
    args = parse_args()
    if args.interpret:
        os.environ["TRITON_INTERPRET"] = "1"
        os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
    import torch

    from sglang.kernels.ops.attention import extend_attention as ea

    device = "cpu" if args.interpret else "cuda"
    dtype = torch.float32 if args.interpret else torch.bfloat16
    loops = args.stock_loops.split(",") if args.stock_loops else release_loops()
    if loops is None:
        sys.exit("this sglang release: say which loops stock starts at key 0 (--stock-loops)")
    stock = stock_module(ea, loops)
    shapes = layer_shapes(args.config, args.interpret)
    radius = shapes["window"] - 1  # Gemma: sliding_window_size = config.sliding_window - 1
    tokens = [64 * 5] if args.interpret else [int(t) for t in args.tokens.split(",")]
    repeats, warmup = (2, 1) if args.interpret else (args.repeats, args.warmup)
    g = torch.Generator(device="cpu").manual_seed(0)

    def rand(*shape):
        return torch.randn(*shape, generator=g).to(device=device, dtype=dtype)

    def make(kind, n, prefix, head_dim):
        hq, hkv = shapes["q_heads"], shapes["kv_heads"]
        q, k, v = rand(n, hq, head_dim), rand(n, hkv, head_dim), rand(n, hkv, head_dim)
        # The cache: the prefix's keys, then this pass's (written before attention).
        k_buf = torch.cat([rand(prefix, hkv, head_dim), k])
        v_buf = torch.cat([rand(prefix, hkv, head_dim), v])
        qo = torch.tensor([0, n], dtype=torch.int32, device=device)
        w = radius if kind != "full" else -1

        def run(mod):
            o = torch.empty(n, hq, head_dim, device=device, dtype=dtype)
            if kind == "deterministic":
                kv_indptr = torch.tensor([0, prefix + n], dtype=torch.int32, device=device)
                kv_indices = torch.arange(prefix + n, device=device)
                mod.extend_attention_fwd_unified(
                    q, o, k_buf, v_buf, 1.0, 1.0, qo, kv_indptr, kv_indices,
                    torch.tensor([prefix], dtype=torch.int32, device=device), n,
                    is_causal=True, sliding_window_size=w,
                    window_start_pos=torch.zeros(1, dtype=torch.int32, device=device))
            else:
                kv_indptr = torch.tensor([0, prefix], dtype=torch.int32, device=device)
                kv_indices = torch.arange(max(prefix, 1), device=device)
                mod.extend_attention_fwd(
                    q, k, v, o, k_buf, v_buf, qo, kv_indptr, kv_indices, None, True, None,
                    n, 1.0, 1.0, sliding_window_size=w)
            return o

        return run

    def time_ms(fn):
        for _ in range(warmup):
            fn()
        times = []
        for _ in range(repeats):
            if device == "cuda":
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                torch.cuda.synchronize()
                times.append(start.elapsed_time(end))
            else:
                t0 = time.perf_counter()
                fn()
                times.append(1e3 * (time.perf_counter() - t0))
        return statistics.median(times)

    rows = []
    for n in tokens:
        cases = [("sliding", "cold", 0), ("sliding", "chunk", radius), ("sliding", "deterministic", 0),
                 ("full", "cold", 0)]
        for layer, kind, prefix in cases:
            head_dim = shapes["full_head_dim"] if layer == "full" else shapes["head_dim"]
            run = make("full" if layer == "full" else kind, n, prefix, head_dim)
            row = {"layer": layer, "pass": kind, "tokens": n, "prefix_keys": prefix,
                   "head_dim": head_dim, "window": shapes["window"] if layer == "sliding" else None,
                   "patched_ms": time_ms(lambda: run(ea)),
                   "floor_ms": window_floor(n, prefix, radius if layer == "sliding" else -1,
                                            shapes, head_dim, args.peak_tflops, args.peak_tbps)}
            if layer == "sliding":
                row["stock_ms"] = time_ms(lambda: run(stock))
                row["speedup"] = row["stock_ms"] / row["patched_ms"]
                a, b = run(ea), run(stock)
                row["bit_identical"] = bool(torch.equal(a.view(torch.int16 if dtype == torch.bfloat16
                                                               else torch.int32),
                                                        b.view(torch.int16 if dtype == torch.bfloat16
                                                               else torch.int32)))
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    out = {
        "device": "cpu (triton interpreter)" if args.interpret else torch.cuda.get_device_name(),
        "sglang": importlib.metadata.version("sglang"),
        "stock_loops_from_key_0": list(loops),
        "shapes": shapes, "sliding_window_size": radius, "dtype": str(dtype),
        "repeats": repeats, "warmup": warmup,
        "peak": {"tflops": args.peak_tflops, "tbps": args.peak_tbps},
        "rows": rows,
    }
    text = json.dumps(out, indent=1)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
