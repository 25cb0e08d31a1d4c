"""Speculative verify of a top-1 draft chain as decode queries (triton backend).

With `speculative_eagle_topk == 1` the draft is a chain: draft token i of a request
sees the request's cached keys and draft tokens 0..i, which is exactly what a decode
query at position `seq_len + i` sees. Stock triton verifies through
`extend_attention_fwd`, whose grid is (request, head, query block) with no split over
the keys: every program walks its request's whole key list alone, and with 4 query
rows in a 32-64 row block. That walk is what makes a FROZEN_KV_MTP step grow with
context (benchmark/frozen_kv_mtp/verify_kernel_bench.py). Here the verify's B x N
queries run through the split-KV decode kernel instead, one decode row per draft
token, over `req_to_token[req, :seq_len + i + 1]` (or its sliding window), which
`prepare_for_v2_verify` has already filled with the draft tokens' slots.

Same keys (a sliding layer's W + 1, as the extend kernel's mask keeps), same chain
mask; the sum is split over the keys, so the result is not bitwise the extend
kernel's. The backend selects it at start-up; what a release reads to select it, and
how it fills the key lists, is in `triton_chain_verify_release.py` (one per release).

By default the metadata holds one key list per request instead (its prefix and
draft tokens; a sliding layer's union of the rows' windows, W + N keys) and
`triton_chain_verify_grouped.py` computes all N draft rows of a request per key
tile, reading the keys once a request instead of once a draft token, so a step
grows with the context about as a decode step does.
SGLANG_CHAIN_VERIFY_GROUPED=0 keeps one decode row per draft token, which an fp8
KV cache also gets (the grouped kernel applies no KV scales). A layer with a
score_mod or xai temperature runs one row per draft token when eager, and stops
CUDA-graph capture (start-up) with an error naming that variable.
"""

import dataclasses

import torch
from sglang.srt.environ import envs
from sglang.srt.layers.attention.triton_chain_verify_grouped import (
    chain_verify_grouped_fwd,
)
from sglang.srt.layers.attention.triton_chain_verify_release import (
    decode_rows,
    fill_key_lists,
    graph_metadata_fields,
    key_list_plan,
    num_draft_tokens,
)

GROUPED_ENV = "SGLANG_CHAIN_VERIFY_GROUPED"
_FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)


def chain_verify_grouped(backend) -> bool:
    """Grouped unless SGLANG_CHAIN_VERIFY_GROUPED=0 or the KV cache is fp8."""
    if not envs.SGLANG_CHAIN_VERIFY_GROUPED.get():
        return False
    return getattr(backend.token_to_kv_pool, "dtype", None) not in _FP8


def chain_query_lens(seq_lens, req_pool_indices, n):
    """Per draft token: its request's pool row and the keys it sees (prefix + i + 1)."""
    steps = torch.arange(1, n + 1, dtype=seq_lens.dtype, device=seq_lens.device)
    q_seq_lens = (seq_lens[:, None] + steps[None, :]).reshape(-1)
    return req_pool_indices.repeat_interleave(n), q_seq_lens


def eager_kv_indices_len(forward_batch, lens, num_rows, row_width) -> int:
    """Entries of the eager index list, from the host's length sum as the
    extend-shaped verify sizes its own (no device sync): a request's list is its
    prefix and its n draft tokens; one list per draft token i is its prefix and
    i + 1 draft tokens. Without a host sum (overlap scheduling keeps none for
    triton), a bound, as triton's decode metadata takes one: no list is longer
    than a req_to_token row of row_width keys, and the lists are filled on the
    device, so the surplus is unwritten memory, not a wait for the device."""
    bs = len(forward_batch.req_pool_indices)
    n = num_rows // bs
    if forward_batch.seq_lens_sum is None:
        return lens.numel() * row_width
    if lens.numel() == bs:
        return forward_batch.seq_lens_sum + bs * n
    return n * forward_batch.seq_lens_sum + bs * n * (n + 1) // 2


class ChainVerify:
    """Decode-shaped verify metadata for one TritonAttnBackend.

    ``window_buffer`` is the backend module's ``update_sliding_window_buffer``,
    handed in by the backend that builds this (its module imports this one)."""

    def __init__(self, backend, window_buffer):
        self.backend = backend
        self.window_buffer = window_buffer
        self.swa = (
            backend.sliding_window_size is not None and backend.sliding_window_size > 0
        )
        # The extend kernel lets a query at position p see keys k >= p - W
        # (W = backend.sliding_window_size): W + 1 keys, as triton's decode
        # metadata keeps. The verify's keys are the extend kernel's.
        self.window = backend.sliding_window_size + 1 if self.swa else None
        self.grouped = chain_verify_grouped(backend)

    # --- CUDA graph: capture-stable buffers, refilled before every replay ---------
    def init_cuda_graph_state(self, max_num_tokens: int):
        """Indptr buffers for max_num_tokens decode rows (the backend's are sized
        for requests) and window indices of W + 1 keys a row (of its own, for as
        many rows); the full-attention index, split and logits buffers are the backend's,
        sized for max_num_tokens rows (the index one made a row wider)."""
        be, dev = self.backend, self.backend.device
        self.kv_indptr = torch.zeros(max_num_tokens + 1, dtype=torch.int32, device=dev)
        # A draft token sees up to seq_len + N keys: a whole req_to_token row
        # (context_len + N + 4 wide), past the context_len a row the backend sized
        # its index buffer for. Only the target verifies, so grow it in place.
        need = max_num_tokens * be.req_to_token.shape[1]
        if be.cuda_graph_kv_indices.numel() < need:
            be.cuda_graph_kv_indices = torch.zeros(need, dtype=torch.int64, device=dev)
        self.window_kv_indptr = self.window_kv_indices = None
        if self.swa:
            self.window_kv_indptr = torch.zeros_like(self.kv_indptr)
            self.window_kv_indices = torch.zeros(
                max_num_tokens * self.window, dtype=torch.int64, device=dev
            )

    def fill_graph_buffers(
        self, bs, seq_lens, req_pool_indices, spec_info, plan=None
    ):
        """`plan`: what the release's index fill reads through (None where it
        reads req_to_token itself)."""
        be = self.backend
        n = num_draft_tokens(be, spec_info)
        rows, lens = self._lists(seq_lens[:bs], req_pool_indices[:bs], n, self.grouped)
        window_lens = self._fill(
            plan,
            rows,
            lens,
            self.kv_indptr,
            be.cuda_graph_kv_indices,
            self.window_kv_indptr,
            self.window_kv_indices,
            n,
            self.grouped,
        )
        m = rows.shape[0]
        be.get_num_kv_splits(be.cuda_graph_num_kv_splits[:m], lens)
        if self.swa:
            be.get_num_kv_splits(be.cuda_graph_window_num_kv_splits[:m], window_lens)

    def graph_metadata(self, bs, spec_info, swa_out_cache_loc, **release_fields):
        """`release_fields`: the ForwardMetadata fields only the release has."""
        from sglang.srt.layers.attention.triton_backend import ForwardMetadata

        be = self.backend
        m = bs if self.grouped else bs * num_draft_tokens(be, spec_info)
        return ForwardMetadata(
            attn_logits=be.cuda_graph_attn_logits,
            attn_lse=be.cuda_graph_attn_lse,
            max_extend_len=None,
            num_kv_splits=be.cuda_graph_num_kv_splits,
            kv_indptr=self.kv_indptr[: m + 1],
            kv_indices=be.cuda_graph_kv_indices,
            qo_indptr=None,
            custom_mask=None,
            mask_indptr=None,
            window_kv_indptr=self.window_kv_indptr[: m + 1] if self.swa else None,
            window_kv_indices=self.window_kv_indices,
            window_num_kv_splits=(
                be.cuda_graph_window_num_kv_splits if self.swa else None
            ),
            window_kv_offsets=None,
            swa_attn_logits=be.cuda_graph_swa_attn_logits,
            swa_out_cache_loc=swa_out_cache_loc,
            **graph_metadata_fields(be, **release_fields),
        )

    # --- eager --------------------------------------------------------------------
    def eager_fields(self, forward_batch, grouped=None):
        """Decode-shaped verify metadata, fresh tensors: (kv_indptr, kv_indices,
        window_kv_indptr, window_kv_indices, num_kv_splits, window_num_kv_splits,
        attn_logits, attn_lse, swa_attn_logits), the window ones None without a
        sliding window. `grouped` (default: this verify's layout) picks a key list
        per request or per draft token."""
        be = self.backend
        grouped = self.grouped if grouped is None else grouped
        n = num_draft_tokens(be, forward_batch.spec_info)
        bs = len(forward_batch.req_pool_indices)
        rows, lens = self._lists(
            forward_batch.seq_lens[:bs], forward_batch.req_pool_indices, n, grouped
        )
        m, q_rows, dev = rows.shape[0], bs * n, be.device
        kv_indices = torch.empty(
            eager_kv_indices_len(forward_batch, lens, bs * n, be.req_to_token.shape[1]),
            dtype=torch.int64,
            device=dev,
        )
        kv_indptr = torch.zeros(m + 1, dtype=torch.int32, device=dev)
        window_kv_indptr = window_kv_indices = None
        if self.swa:
            window_kv_indptr = torch.zeros_like(kv_indptr)
            window_kv_indices = torch.empty(
                m * self._list_window(n, grouped), dtype=torch.int64, device=dev
            )
        window_lens = self._fill(
            key_list_plan(forward_batch),
            rows,
            lens,
            kv_indptr,
            kv_indices,
            window_kv_indptr,
            window_kv_indices,
            n,
            grouped,
        )

        def splits(seq):
            out = torch.empty(m, dtype=torch.int32, device=dev)
            be.get_num_kv_splits(out, seq)
            return out

        def logits(v_dim):
            return torch.empty(
                q_rows,
                be.num_head,
                be.max_kv_splits,
                v_dim,
                dtype=torch.float32,
                device=dev,
            )

        return (
            kv_indptr,
            kv_indices,
            window_kv_indptr,
            window_kv_indices,
            splits(lens),
            splits(window_lens) if self.swa else None,
            logits(be.v_head_dim),
            torch.empty(
                q_rows, be.num_head, be.max_kv_splits, dtype=torch.float32, device=dev
            ),
            logits(be.swa_v_head_dim) if be.swa_v_head_dim is not None else None,
        )

    # --- forward ------------------------------------------------------------------
    def forward(
        self,
        q,
        k,
        v,
        layer,
        forward_batch,
        sinks=None,
        score_mod=None,
        aux_tensors=None,
    ):
        """The verify's attention; K/V of the draft tokens are already saved."""
        be = self.backend
        if not self.grouped:
            # One decode row per draft token.
            return decode_rows(
                be,
                q,
                k,
                v,
                layer,
                forward_batch,
                sinks=sinks,
                score_mod=score_mod,
                aux_tensors=aux_tensors,
            )
        unsupported = [
            name
            for name, on in (
                ("score_mod", score_mod is not None),
                ("xai temperature", (layer.xai_temperature_len or -1) > 0),
                ("scaled (fp8) KV", layer.k_scale is not None),
            )
            if on
        ]
        if unsupported:
            if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
                # At start-up: per-row metadata cannot be built inside a graph.
                raise NotImplementedError(
                    f"the grouped chain verify does not handle {', '.join(unsupported)}; "
                    f"set {GROUPED_ENV}=0 for the per-draft-token kernel, which does"
                )
            return self._forward_per_row(
                q,
                k,
                v,
                layer,
                forward_batch,
                sinks=sinks,
                score_mod=score_mod,
                aux_tensors=aux_tensors,
            )
        md = be.forward_metadata
        sliding = (
            layer.sliding_window_size is not None and layer.sliding_window_size > -1
        )
        attn_logits = md.attn_logits
        if md.swa_attn_logits is not None and layer.v_head_dim == be.swa_v_head_dim:
            attn_logits = md.swa_attn_logits
        q = q.view(-1, layer.tp_q_head_num, layer.qk_head_dim)
        o = q.new_empty((q.shape[0], layer.tp_q_head_num, layer.v_head_dim))
        chain_verify_grouped_fwd(
            q,
            be.token_to_kv_pool.get_key_buffer(layer.layer_id),
            be.token_to_kv_pool.get_value_buffer(layer.layer_id),
            o,
            md.window_kv_indptr if sliding else md.kv_indptr,
            md.window_kv_indices if sliding else md.kv_indices,
            num_draft_tokens(be, forward_batch.spec_info),
            self.window if sliding else 0,
            attn_logits,
            md.attn_lse,
            md.window_num_kv_splits if sliding else md.num_kv_splits,
            be.max_kv_splits,
            layer.scaling,
            layer.logit_cap or 0.0,
            sinks,
        )
        return o.view(-1, layer.tp_q_head_num * layer.v_head_dim)

    _EAGER_FIELDS = (
        "kv_indptr",
        "kv_indices",
        "window_kv_indptr",
        "window_kv_indices",
        "num_kv_splits",
        "window_num_kv_splits",
        "attn_logits",
        "attn_lse",
        "swa_attn_logits",
    )

    def _forward_per_row(self, q, k, v, layer, forward_batch, **kwargs):
        """Eager fallback for a layer the grouped kernel does not handle: this
        layer's verify as one decode row per draft token, on metadata built for it."""
        be = self.backend
        grouped_md = be.forward_metadata
        per_row = dict(
            zip(self._EAGER_FIELDS, self.eager_fields(forward_batch, grouped=False))
        )
        be.forward_metadata = dataclasses.replace(grouped_md, **per_row)
        try:
            return decode_rows(be, q, k, v, layer, forward_batch, **kwargs)
        finally:
            be.forward_metadata = grouped_md

    # --- shared -------------------------------------------------------------------
    def _lists(self, seq_lens, req_pool_indices, n, grouped):
        """(pool row, keys) of each key list: one per draft token, or with
        grouping one per request (its prefix and all n draft tokens)."""
        if grouped:
            return req_pool_indices, seq_lens + n
        return chain_query_lens(seq_lens, req_pool_indices, n)

    def _list_window(self, n, grouped):
        # Grouped: the union of a request's n row windows, which end one key apart.
        return self.window + n - 1 if grouped else self.window

    def _fill(
        self,
        plan,
        rows,
        lens,
        kv_indptr,
        kv_indices,
        window_kv_indptr,
        window_kv_indices,
        n,
        grouped,
    ):
        """The release's decode index builders, run over each key list (see
        `_lists`). Returns the window lengths (None without sliding window)."""
        return fill_key_lists(
            self.backend,
            self.window_buffer,
            plan,
            rows,
            lens,
            kv_indptr,
            kv_indices,
            self._list_window(n, grouped) if self.swa else None,
            window_kv_indptr,
            window_kv_indices,
        )
