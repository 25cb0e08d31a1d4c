"""layers/attention/triton_chain_verify_grouped.py: a top-1 draft chain's attention,
all N draft rows of a request computed per key tile (keys read once a request), under
Triton's interpreter on CPU (a fresh process: this file runs itself as a script).

Against a torch reference: draft row t of a request with L keys sees list positions
[max(0, hi - window), hi), hi = L - (N - 1 - t). Cases: full and sliding layers, head
chunks, a tanh logit cap, attention sinks, fp16, uneven split counts. Control: the
reference with a window one key wider is far off, so an off-by-one in the bounds shows.
"""

import pytest
from triton_interpret import print_result, run_as_script

pytestmark = pytest.mark.stack("frozen-kv-mtp-speed", step="chain-verify-grouped-kernel")


def _reference(q, kb, vb, indptr, idx, N, window, scale, cap=0.0, sinks=None):
    import torch

    T, H, _ = q.shape
    G = H // kb.shape[1]
    out = torch.zeros(T, H, vb.shape[-1])
    for b in range(T // N):
        s, e = int(indptr[b]), int(indptr[b + 1])
        for t in range(N):
            hi = (e - s) - (N - 1 - t)
            keys = idx[s:e][max(hi - window, 0) if window else 0 : hi]
            for h in range(H):
                sc = (q[b * N + t, h].float() @ kb[keys, h // G].float().T) * scale
                if cap:
                    sc = cap * torch.tanh(sc / cap)
                if sinks is None:
                    p = torch.softmax(sc, 0)
                else:  # one more logit in the denominator, with no value
                    p = torch.softmax(torch.cat([sc, sinks[h].float().view(1)]), 0)[:-1]
                out[b * N + t, h] = p @ vb[keys, h // G].float()
    return out


def _case(B, N, H, Hkv, D, Dv, lens, window, splits, dtype="float32", cap=0.0, control=False, sinks=False):
    import torch

    from sglang.srt.layers.attention.triton_chain_verify_grouped import chain_verify_grouped_fwd

    dtype = getattr(torch, dtype)
    g = torch.Generator().manual_seed(sum(lens) + N)
    pool, S = 1024, 8
    kb = torch.randn(pool, Hkv, D, generator=g).to(dtype)
    vb = torch.randn(pool, Hkv, Dv, generator=g).to(dtype)
    q = torch.randn(B * N, H, D, generator=g).to(dtype)
    indptr = torch.zeros(B + 1, dtype=torch.int32)
    indptr[1:] = torch.cumsum(torch.tensor(lens), 0)
    idx = torch.randperm(pool, generator=g)[: sum(lens)].to(torch.int64)
    o = torch.empty(B * N, H, Dv, dtype=dtype)
    # sinks about as large as the scores, so that they move the output
    sink = torch.randn(H, generator=g) * 2 if sinks else None
    # NaN scratch: a split must never read what stage 1 did not write
    logits = torch.full((B * N, H, S, Dv), float("nan"))
    lse = torch.full((B * N, H, S), float("nan"))
    chain_verify_grouped_fwd(q, kb, vb, o, indptr, idx, N, window, logits, lse,
                             torch.tensor(splits, dtype=torch.int32), S, D**-0.5, cap, sink)
    ref_window = window + 1 if control else window
    ref = _reference(q, kb, vb, indptr, idx, N, ref_window, D**-0.5, cap, sink)
    out = (o.float() - ref).abs().max().item()
    if sinks:  # and the control: the same without the sinks is far off
        return out, (o.float() - _reference(q, kb, vb, indptr, idx, N, ref_window, D**-0.5, cap)).abs().max().item()
    return out


def _check():
    return {
        "full": _case(3, 4, 8, 2, 32, 32, [5, 70, 130], 0, [1, 3, 8]),
        "sliding": _case(4, 4, 4, 2, 16, 16, [4, 40, 43, 43], 40, [2, 8, 5, 1]),
        "head_chunks": _case(2, 8, 16, 1, 16, 16, [20, 50], 0, [4, 2]),
        "logit_cap": _case(2, 3, 4, 4, 16, 32, [9, 33], 0, [3, 2], cap=5.0),
        "sinks": _case(3, 4, 8, 2, 16, 16, [3, 40, 43], 40, [1, 4, 8], sinks=True),
        "fp16": _case(2, 4, 8, 2, 32, 32, [17, 66], 0, [2, 4], dtype="float16"),
        "control_window_plus_1": _case(2, 4, 4, 2, 16, 16, [43, 43], 40, [2, 3], control=True),
    }


@pytest.mark.stack("frozen-kv-mtp-speed", step="chain-verify-grouped-kernel", fails_before=True)
def test_grouped_chain_verify_matches_reference():
    out = run_as_script(__file__)
    for name in ("full", "sliding", "head_chunks", "logit_cap"):
        assert out[name] < 1e-5, (name, out[name])
    assert out["fp16"] < 2e-3
    sinks, without = out["sinks"]
    assert sinks < 1e-5 and without > 1e-2, out["sinks"]
    assert out["control_window_plus_1"] > 1e-2


if __name__ == "__main__":
    print_result(_check)


# ---------------------------------------------------------------- compiled for the H200
# The interpreter checks the arithmetic, not what Triton's compiler accepts; compile the
# kernels for sm_90 here (no GPU needed) at the real shapes, and read ptxas's spills.


def _ptxas_spills(fn, sig, const, num_warps, num_stages):
    """Compile `fn` for sm_90 (no GPU needed) and assert that ptxas -v reports no spills."""
    import glob
    import os
    import subprocess
    import tempfile

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    sig = {**sig, **{k: "constexpr" for k in const}}
    kernel = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=const),
                            target=GPUTarget("cuda", 90, 32),
                            options={"num_warps": num_warps, "num_stages": num_stages})
    ptxas = glob.glob(os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas*"))
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
        f.write(kernel.asm["ptx"])
    out = subprocess.run([sorted(ptxas)[0], "-v", "--gpu-name", "sm_90a", f.name, "-o", os.devnull],
                         capture_output=True, text=True)
    os.unlink(f.name)
    assert out.returncode == 0, out.stderr[-2000:]
    spills = [l for l in out.stderr.splitlines() if "spill stores" in l]
    assert spills and all(l.split(",")[1].strip().startswith("0 bytes spill stores") for l in spills), spills


def _strides(*names):
    return {n: "i32" for n in names}


def _compile_stage1(D, N, G, page_size=1):
    from sglang.srt.layers.attention import triton_chain_verify_grouped as m

    hpp, block_m, block_n, num_warps = m.launch_config(N, G, D, D)  # what the wrapper launches
    const = dict(N=N, G=G, HEADS_PER_PROG=hpp, WINDOW=0, D=D, DV=D, BLOCK_D=D, BLOCK_DV=D,
                 BLOCK_M=block_m, BLOCK_N=block_n, PAGE_SIZE=page_size)
    sig = {"Q": "*bf16", "K": "*bf16", "V": "*bf16", "kv_indptr": "*i32", "kv_indices": "*i64",
           "num_kv_splits": "*i32", "Att_Out": "*fp32", "Att_Lse": "*fp32", "sm_scale": "fp32",
           "logit_cap": "fp32",
           **_strides("stride_qt", "stride_qh", "stride_kt", "stride_kh", "stride_vt", "stride_vh",
                      "stride_kp", "stride_vp", "stride_ot", "stride_oh", "stride_os", "stride_lt", "stride_lh")}
    _ptxas_spills(m._chain_grouped_stage1, sig, const, num_warps, 2)


@pytest.mark.parametrize("has_sink", [False, True])
def test_stage2_compiles_for_sm90(has_sink):
    """The split combine, with and without attention sinks, as the wrapper launches it."""
    from sglang.srt.layers.attention import triton_chain_verify_grouped as m

    const = dict(N=4, WINDOW=1024, DV=512, BLOCK_DV=512, MAX_SPLITS=16, HAS_SINK=has_sink)
    sig = {"Att_Out": "*fp32", "Att_Lse": "*fp32", "O": "*bf16", "kv_indptr": "*i32",
           "num_kv_splits": "*i32", "Sinks": "*bf16" if has_sink else "*fp32",
           **_strides("stride_ot", "stride_oh", "stride_os", "stride_lt", "stride_lh",
                      "stride_out_t", "stride_out_h")}
    _ptxas_spills(m._chain_grouped_stage2, sig, const, 4, 3)


@pytest.mark.parametrize("D, N, G, page_size", [(512, 4, 8, 1), (512, 8, 8, 1), (256, 4, 4, 1), (256, 4, 2, 1),
                                                (512, 4, 8, 64)])
def test_stage1_compiles_for_sm90_without_spills(D, N, G, page_size):
    """31B full (512, 8 heads a KV head), adaptive 8 draft tokens, E4B / 31B sliding;
    31B full on a page-major KV layout (4-D views, page address math)."""
    _compile_stage1(D, N, G, page_size)


@pytest.mark.stack("frozen-kv-mtp-speed", step="chain-verify-as-decode")
def test_grouped_is_the_default_except_off_or_fp8(monkeypatch):
    """Split-KV verify groups by default; SGLANG_CHAIN_VERIFY_GROUPED=0 or an fp8
    KV cache (no KV scales in the grouped kernel) keeps one row per draft token."""
    import types

    import torch

    from sglang.srt.layers.attention.triton_chain_verify import GROUPED_ENV, chain_verify_grouped

    be = lambda dtype: types.SimpleNamespace(token_to_kv_pool=types.SimpleNamespace(dtype=dtype))
    monkeypatch.delenv(GROUPED_ENV, raising=False)
    assert chain_verify_grouped(be(torch.bfloat16))
    assert not chain_verify_grouped(be(torch.float8_e4m3fn))
    assert not chain_verify_grouped(be(torch.float8_e5m2))
    monkeypatch.setenv(GROUPED_ENV, "0")
    assert not chain_verify_grouped(be(torch.bfloat16))
    monkeypatch.setenv(GROUPED_ENV, "1")
    assert chain_verify_grouped(be(torch.bfloat16))


@pytest.mark.stack("frozen-kv-mtp-speed", step="chain-verify-as-decode")
def test_grouped_refuses_in_graph_capture_what_it_does_not_handle(monkeypatch):
    """Captured at start-up, the grouped kernel with a score_mod (or fp8 KV scales, xai
    temperature) fails naming the cause and the fix (eager, it falls back to one row per
    draft token: test_triton_chain_verify.py)."""
    import types

    import torch

    from sglang.srt.layers.attention.triton_chain_verify import GROUPED_ENV, ChainVerify

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)

    cv = object.__new__(ChainVerify)
    cv.backend, cv.grouped = None, True
    layer = types.SimpleNamespace(xai_temperature_len=-1, k_scale=None)
    with pytest.raises(NotImplementedError, match=f"does not handle score_mod; set {GROUPED_ENV}=0"):
        cv.forward(None, None, None, layer, None, score_mod=object())
    layer.k_scale = 1.0
    with pytest.raises(NotImplementedError, match="scaled \\(fp8\\) KV"):
        cv.forward(None, None, None, layer, None)
