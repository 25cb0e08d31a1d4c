"""Split-KV attention for a top-1 draft chain that reads each request's keys once.

`triton_chain_verify.py` verifies N draft tokens per request as N decode rows, each
over its own copy of the request's key list. The decode kernel groups query heads
that share a KV head, but not rows: every draft row walks the whole context again,
so the verify reads each request's K/V N times. At 31B's shape that is what makes a
FROZEN_KV_MTP step grow with context: at batch 8 with 4 draft tokens the split-KV
verify grows close to N times what a decode step's attention grows
(`benchmark/frozen_kv_mtp/verify_kernel_bench.py` measures both).

Here one program takes one request, one KV head (or a slice of its query heads) and
one split of the request's keys, and computes all N x G query rows against each key
tile it loads (G = query heads per KV head). Row t of a request sees list positions
[lo_t, hi_t): hi_t = L - (N - 1 - t) over the request's list of L keys, and
lo_t = max(0, hi_t - window) with a sliding window (0: all keys). For a full layer
the list is the request's prefix and draft tokens; for a sliding layer it is the
union of the rows' windows, `window + N - 1` keys ending at the last draft token.

Stage 1 writes each split's normalized partial output and log-sum-exp in the decode
kernel's layout ([rows, heads, splits, Dv] / [rows, heads, splits]); stage 2
combines the splits. A row with no key in a split gets lse -inf there.
"""

import triton
import triton.language as tl

# Query rows (draft rows x heads of one KV head) one program computes at most:
# beyond these, sm_90 code spills registers (ptxas -v, BLOCK_N 32, 8 warps).
_MAX_ROWS = 64
_MAX_ROWS_WIDE = 32  # head dim 512


@triton.jit
def _span(kv_indptr, num_kv_splits, b, s, N: tl.constexpr, WINDOW: tl.constexpr):
    """Request b's list start and length, and split s's key range [s_lo, s_hi)."""
    start = tl.load(kv_indptr + b)
    L = tl.load(kv_indptr + b + 1) - start
    splits = tl.load(num_kv_splits + b)
    lo0 = 0
    if WINDOW > 0:
        lo0 = tl.maximum(L - (N - 1) - WINDOW, 0)  # row 0's first key
    per = tl.cdiv(L - lo0, splits)
    s_lo = lo0 + s * per
    s_hi = tl.minimum(s_lo + per, L)
    s_hi = tl.where(s < splits, s_hi, s_lo)  # splits past the request's count: empty
    return start, L, s_lo, s_hi


@triton.jit
def _chain_grouped_stage1(
    Q,
    K,
    V,
    kv_indptr,
    kv_indices,
    num_kv_splits,
    Att_Out,
    Att_Lse,
    sm_scale,
    logit_cap,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_kp,
    stride_vp,
    stride_ot,
    stride_oh,
    stride_os,
    stride_lt,
    stride_lh,
    N: tl.constexpr,
    G: tl.constexpr,
    HEADS_PER_PROG: tl.constexpr,
    WINDOW: tl.constexpr,
    D: tl.constexpr,
    DV: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PAGE_SIZE: tl.constexpr = 1,
):
    b = tl.program_id(0)
    chunks: tl.constexpr = G // HEADS_PER_PROG
    kv_head = tl.program_id(1) // chunks
    first_head = kv_head * G + (tl.program_id(1) % chunks) * HEADS_PER_PROG
    s = tl.program_id(2)
    start, L, s_lo, s_hi = _span(kv_indptr, num_kv_splits, b, s, N, WINDOW)

    rows = tl.arange(0, BLOCK_M)
    t = rows // HEADS_PER_PROG  # draft row
    head = first_head + rows % HEADS_PER_PROG
    row_ok = rows < N * HEADS_PER_PROG
    hi = L - (N - 1 - t)
    lo = tl.zeros_like(hi)
    if WINDOW > 0:
        lo = tl.maximum(hi - WINDOW, 0)

    if s_hi > s_lo:
        offs_d = tl.arange(0, BLOCK_D)
        offs_dv = tl.arange(0, BLOCK_DV)
        q = tl.load(
            Q
            + (b * N + t)[:, None] * stride_qt
            + head[:, None] * stride_qh
            + offs_d[None, :],
            mask=row_ok[:, None] & (offs_d[None, :] < D),
            other=0.0,
        )
        m_i = tl.full([BLOCK_M], -1e20, dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)
        for n0 in range(s_lo, s_hi, BLOCK_N):
            offs_n = n0 + tl.arange(0, BLOCK_N)
            key_ok = offs_n < s_hi
            loc = tl.load(kv_indices + start + offs_n, mask=key_ok, other=0)
            if PAGE_SIZE == 1:
                k_row = loc * stride_kt
                v_row = loc * stride_vt
            else:  # a 4-D page-major view: slot `loc` is page loc // PAGE_SIZE, row loc % PAGE_SIZE
                k_row = (loc // PAGE_SIZE) * stride_kp + (loc % PAGE_SIZE) * stride_kt
                v_row = (loc // PAGE_SIZE) * stride_vp + (loc % PAGE_SIZE) * stride_vt
            k = tl.load(
                K + k_row[:, None] + kv_head * stride_kh + offs_d[None, :],
                mask=key_ok[:, None] & (offs_d[None, :] < D),
                other=0.0,
            )
            qk = tl.dot(q, tl.trans(k)) * sm_scale
            if logit_cap > 0:
                qk = logit_cap * (2 * tl.sigmoid(2 * qk / logit_cap) - 1)  # tanh
            seen = (
                (offs_n[None, :] >= lo[:, None])
                & (offs_n[None, :] < hi[:, None])
                & key_ok[None, :]
                & row_ok[:, None]
            )
            qk = tl.where(seen, qk, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(qk, 1))
            p = tl.exp(qk - m_new[:, None])
            alpha = tl.exp(m_i - m_new)
            v = tl.load(
                V + v_row[:, None] + kv_head * stride_vh + offs_dv[None, :],
                mask=key_ok[:, None] & (offs_dv[None, :] < DV),
                other=0.0,
            )
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
            l_i = l_i * alpha + tl.sum(p, 1)
            m_i = m_new
        has = l_i > 0
        out = acc / tl.where(has, l_i, 1.0)[:, None]
        row_base = (b * N + t) * stride_ot + head * stride_oh + s * stride_os
        tl.store(
            Att_Out + row_base[:, None] + offs_dv[None, :],
            out,
            mask=row_ok[:, None] & (offs_dv[None, :] < DV),
        )
        lse = tl.where(has, m_i + tl.log(tl.where(has, l_i, 1.0)), float("-inf"))
        tl.store(
            Att_Lse + (b * N + t) * stride_lt + head * stride_lh + s, lse, mask=row_ok
        )


@triton.jit
def _chain_grouped_stage2(
    Att_Out,
    Att_Lse,
    O,
    kv_indptr,
    num_kv_splits,
    Sinks,
    stride_ot,
    stride_oh,
    stride_os,
    stride_lt,
    stride_lh,
    stride_out_t,
    stride_out_h,
    N: tl.constexpr,
    WINDOW: tl.constexpr,
    DV: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    MAX_SPLITS: tl.constexpr,
    HAS_SINK: tl.constexpr,
):
    r = tl.program_id(0)
    h = tl.program_id(1)
    b = r // N
    offs_dv = tl.arange(0, BLOCK_DV)
    dv_ok = offs_dv < DV
    m = -1e20
    w_sum = 0.0
    acc = tl.zeros([BLOCK_DV], dtype=tl.float32)
    for s in range(MAX_SPLITS):
        _, _, s_lo, s_hi = _span(kv_indptr, num_kv_splits, b, s, N, WINDOW)
        if s_hi > s_lo:
            lse = tl.load(Att_Lse + r * stride_lt + h * stride_lh + s)
            part = tl.load(
                Att_Out + r * stride_ot + h * stride_oh + s * stride_os + offs_dv,
                mask=dv_ok,
                other=0.0,
            )
            m_new = tl.maximum(m, lse)
            scale = tl.exp(m - m_new)
            w = tl.exp(lse - m_new)  # 0 for a split where this row saw no key
            acc = acc * scale + w * part
            w_sum = w_sum * scale + w
            m = m_new
    if HAS_SINK:
        # An attention sink: one more logit per head in the denominator, no value
        # (as triton's decode kernel adds it).
        w_sum += tl.exp(tl.load(Sinks + h).to(tl.float32) - m)
    tl.store(
        O + r * stride_out_t + h * stride_out_h + offs_dv,
        (acc / w_sum).to(O.dtype.element_ty),
        mask=dv_ok,
    )


def launch_config(N: int, G: int, block_d: int, block_dv: int):
    """(query heads a program takes, BLOCK_M, BLOCK_N, num_warps) for stage 1.
    BLOCK_N 32 and 8 warps: no register spills on sm_90 at head dims 256 / 512
    for these row counts (64 keys a tile spill at both; ptxas -v)."""
    wide = max(block_d, block_dv)
    heads_per_prog = G
    while (
        N * heads_per_prog > (_MAX_ROWS_WIDE if wide >= 512 else _MAX_ROWS)
        and heads_per_prog % 2 == 0
    ):
        heads_per_prog //= 2
    block_m = max(16, triton.next_power_of_2(N * heads_per_prog))
    return heads_per_prog, block_m, 32, 8 if wide >= 256 else 4


def _kv_page_size(buf) -> int:
    return buf.shape[1] if buf.ndim == 4 else 1


def _kv_strides(buf):
    """(token stride, KV heads, head stride, page stride) of a KV buffer, as the
    decode kernel reads it (`_extract_kv_strides`): 3-D [slots, heads, dim], or the
    page-major pool's 4-D strided view [pages, page_size, heads, dim]
    (--enable-page-major-kv-layout), whose pages interleave layers, so a slot is
    page * stride(0) + row * stride(1), not slot * stride. Reading the 4-D view as
    3-D took page_size for the head count (a wrong kernel or ZeroDivisionError)."""
    if buf.ndim == 3:
        return buf.stride(0), buf.shape[1], buf.stride(1), 0
    if buf.shape[1] == 1:  # one slot a page: the page stride is the slot stride
        return buf.stride(0), buf.shape[2], buf.stride(2), 0
    return buf.stride(1), buf.shape[2], buf.stride(2), buf.stride(0)


def chain_verify_grouped_fwd(
    q,
    k_buffer,
    v_buffer,
    o,
    kv_indptr,
    kv_indices,
    num_draft_tokens: int,
    window: int,
    attn_logits,
    attn_lse,
    num_kv_splits,
    max_kv_splits: int,
    sm_scale: float,
    logit_cap: float = 0.0,
    sinks=None,
):
    """Attention of B x N chain-verify rows, q [B*N, H, D] -> o [B*N, H, Dv].

    k_buffer / v_buffer: [slots, KV heads, D] or a page-major pool's 4-D view
    [pages, page_size, KV heads, D]; kv_indptr [B + 1] / kv_indices: one key list per request (see the module
    docstring); window: keys a row sees in a sliding layer (0: all of its prefix);
    num_kv_splits [B]: splits per request, at most max_kv_splits; sinks [H] or None:
    one extra logit per query head in each row's softmax denominator; attn_logits
    [B*N, H, >= max_kv_splits, Dv] / attn_lse [B*N, H, >= max_kv_splits]: scratch.
    """
    T, H, D = q.shape
    N = num_draft_tokens
    B = T // N
    (k_tok, kv_heads, k_head, k_page), page_size = _kv_strides(k_buffer), _kv_page_size(
        k_buffer
    )
    v_tok, _, v_head, v_page = _kv_strides(v_buffer)
    dv = v_buffer.shape[-1]
    G = H // kv_heads
    block_d, block_dv = triton.next_power_of_2(D), triton.next_power_of_2(dv)
    heads_per_prog, block_m, block_n, num_warps = launch_config(N, G, block_d, block_dv)
    _chain_grouped_stage1[(B, kv_heads * (G // heads_per_prog), max_kv_splits)](
        q,
        k_buffer,
        v_buffer,
        kv_indptr,
        kv_indices,
        num_kv_splits,
        attn_logits,
        attn_lse,
        sm_scale,
        logit_cap,
        q.stride(0),
        q.stride(1),
        k_tok,
        k_head,
        v_tok,
        v_head,
        k_page,
        v_page,
        attn_logits.stride(0),
        attn_logits.stride(1),
        attn_logits.stride(2),
        attn_lse.stride(0),
        attn_lse.stride(1),
        N=N,
        G=G,
        HEADS_PER_PROG=heads_per_prog,
        WINDOW=window,
        D=D,
        DV=dv,
        BLOCK_D=block_d,
        BLOCK_DV=block_dv,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        PAGE_SIZE=page_size,
        num_warps=num_warps,
        num_stages=2,
    )
    _chain_grouped_stage2[(T, H)](
        attn_logits,
        attn_lse,
        o,
        kv_indptr,
        num_kv_splits,
        attn_lse if sinks is None else sinks,
        attn_logits.stride(0),
        attn_logits.stride(1),
        attn_logits.stride(2),
        attn_lse.stride(0),
        attn_lse.stride(1),
        o.stride(0),
        o.stride(1),
        N=N,
        WINDOW=window,
        DV=dv,
        BLOCK_DV=block_dv,
        MAX_SPLITS=max_kv_splits,
        HAS_SINK=sinks is not None,
        num_warps=4,
    )
