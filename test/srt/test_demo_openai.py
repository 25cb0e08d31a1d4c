"""`make demo`'s client path: a CPU server on the tiny Gemma-4 with YOCO on, spoken to through
the OpenAI-compatible API with text (completions, chat, a streamed chat reply); its /metrics
counts the prefill passes that took the fast path.

Starts scripts/demo.py's server (about a minute on two cores) and runs its client."""

import importlib.util
import os

import pytest

from server_process import free_port

# The demo serves with YOCO on and shows its start-up line: it needs the model branch.
pytestmark = pytest.mark.stack("yoco-model")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def load_demo():
    spec = importlib.util.spec_from_file_location("demo", os.path.join(ROOT, "scripts", "demo.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_printed_server_command_can_be_pasted():
    """The demo prints its server command as a user pastes it from the repository's root:
    the venv's interpreter by its path, then the same arguments."""
    import shlex
    import sys

    demo = load_demo()
    cmd = demo.server_command(os.path.join(ROOT, "build", "demo-model"), 30123)
    shown = shlex.split(demo.shown_command(cmd))
    assert shown[0] != "-m" and os.path.samefile(os.path.join(ROOT, shown[0]) if not
                                                 os.path.isabs(shown[0]) else shown[0],
                                                 sys.executable)
    assert shown[1:3] == ["-m", "sglang.launch_server"]
    assert shown[shown.index("--model-path") + 1] == "build/demo-model"
    assert "--attention-backend" not in shown  # the CPU default is the one that runs


def test_tokenizer_round_trip(tmp_path):
    demo = load_demo()
    demo.write_tokenizer(str(tmp_path), 512)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tmp_path))
    assert len(tok) == 512
    ids = tok("hello, what does yoco do?")["input_ids"]
    assert tok.unk_token_id not in ids and max(ids) < 512
    assert tok.decode(ids) == "hello, what does yoco do?"
    chat = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                   add_generation_prompt=True)
    assert chat == "<bos><start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n"


def test_demo_client_path(tmp_path):
    demo = load_demo()
    model = demo.build_model(str(tmp_path / "demo-model"))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = demo.Server(demo.server_command(model, port), echo=lambda line: None)
    try:
        server.wait_healthy(url)
        texts = demo.client(url, stream=True, out=lambda *a, **k: None)
        passes = demo.fast_prefill_passes(url)
    finally:
        server.stop()
    assert set(texts) == {"completion", "chat", "stream"}
    for name, text in texts.items():
        assert isinstance(text, str) and text.strip(), (name, text)
    log = "\n".join(server.lines)
    assert "KV-sharing fast prefill (YOCO) on" in log
    assert "prefill passes of >= 0 new tokens (unset: on CPU" in log
    assert "not initialized from checkpoints" not in log, log  # read as a broken checkpoint
    # the server is the README's CPU command (its own flags after it: port, metrics, ...)
    readme = open(os.path.join(ROOT, "README.md")).read()
    assert ("python -m sglang.launch_server --model-path PATH " + " ".join(demo.CPU_SERVER_ARGS)
            in readme)
    # the three prompts' prefill passes took the fast path, counted in /metrics
    assert passes.get(("fast", ""), 0) >= 3, passes
