"""Gemma-4's KV-shared layers compute no K, and checkpoints carry no k_norm weight for
them: their k_norm is a fixed buffer, so loading a checkpoint reports no missing weight
(it did for every KV-shared layer, a warning that reads as a broken checkpoint)."""

import json
import os
import socket
import subprocess
import sys

import pytest
from safetensors import safe_open

pytestmark = pytest.mark.stack("generic-fixes", step="gemma4-kv-shared-k-norm-not-missing",
                               fails_before=True)

HERE = os.path.dirname(os.path.abspath(__file__))

# Builds each attention layer of the tiny model as the model runner does (one rank) in a
# process of its own, whose process group stays out of the other tests.
LAYERS = r"""
import json, sys, types
from unittest import mock
sys.path.insert(0, sys.argv[1])
from resolved_server_args import build, model_config, published
from sglang.srt.distributed.parallel_state import (
    init_distributed_environment, initialize_model_parallel)
from sglang.srt.models import gemma4_causal

path, port = sys.argv[2], sys.argv[3]
args = build(model_path=path, device="cpu", attention_backend="torch_native",
             skip_tokenizer_init=True)
config = model_config(args).hf_text_config  # as the model gets it
out = {}
with published(args):  # 0.5.23's process groups read their widths from it
    init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                 distributed_init_method=f"tcp://127.0.0.1:{port}")
    initialize_model_parallel()  # one rank (the defaults; 0.5.23 reads the widths)
    for i in range(config.num_hidden_layers):
        layer = gemma4_causal.Gemma4Attention(
            layer_id=i, config=config, head_dim=config.head_dim, max_position_embeddings=64)
        out[i] = [n for n, _ in layer.named_parameters() if n.startswith("k_norm")]
print(json.dumps(out))
"""


def test_kv_shared_layers_have_no_k_norm_weight_to_load(model_dir):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    run = subprocess.run([sys.executable, "-c", LAYERS, HERE, model_dir, str(port)],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    params = {int(k): v for k, v in json.loads(run.stdout.strip().splitlines()[-1]).items()}
    with open(os.path.join(model_dir, "config.json")) as f:
        config = json.load(f)
    config = config.get("text_config", config)
    first_shared = config["num_hidden_layers"] - config["num_kv_shared_layers"]
    keys = set()
    for name in os.listdir(model_dir):
        if name.endswith(".safetensors"):
            with safe_open(os.path.join(model_dir, name), "pt") as f:
                keys |= set(f.keys())
    for i, names in params.items():
        in_checkpoint = any(k.endswith(f"layers.{i}.self_attn.k_norm.weight") for k in keys)
        # a parameter exactly where the checkpoint (Hugging Face's layout) has a weight
        assert in_checkpoint == (i < first_shared), (i, in_checkpoint)
        assert names == (["k_norm.weight"] if in_checkpoint else []), (i, names)
