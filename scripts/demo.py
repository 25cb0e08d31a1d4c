#!/usr/bin/env python3
"""`make demo`: serve a tiny Gemma-4 with the fork on CPU and talk to it as an SGLang user does.

    python scripts/demo.py [--no-stream] [SERVER ARGS...]

1. Writes build/demo-model: the tiny seeded Gemma-4 of the CPU tests (8 layers, the last
   4 KV-shared, 512-word vocabulary) and a tokenizer for it (a WordPiece vocabulary of
   letters, word pieces and common English words, with a Gemma-style chat template).
2. Starts `python -m sglang.launch_server ... --kv-sharing-fast-prefill` on it (CPU,
   torch_native attention) and prints the start-up log line that says whether YOCO fast
   prefill is on and from how many new tokens a prefill pass takes it.
3. Sends text through the OpenAI-compatible API: one /v1/completions request, one
   /v1/chat/completions request, and one streamed chat reply, and prints the text.

The weights are random, so the replies are gibberish words: the demo shows the API path
and the server log, not a language model. Extra arguments go to the server (for
instance `--kv-sharing-fast-prefill-min-tokens 4096`, from which a pass takes the fast path;
unset on CPU, every pass does). DEMO_PORT sets the port (30123).
"""

import json
import os
import shlex
import subprocess
import sys
import threading
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "test", "srt"))

PORT = int(os.environ.get("DEMO_PORT", "30123"))
MODEL_NAME = "tiny-gemma4"

# Gemma's special tokens at the ids Gemma tokenizers (and the tiny config) use.
SPECIALS = {"<pad>": 0, "<eos>": 1, "<bos>": 2, "<unk>": 3, "<mask>": 4,
            "<start_of_turn>": 105, "<end_of_turn>": 106}
WORDS = (
    "user model system the a an and or of to in on for with is are was be it this that "
    "you i we they he she what how why when where which who yes no not can will do does "
    "cache prefill decode token tokens layer layers fast slow first last once only kv "
    "shared server request reply model text chat hello world tiny random weights gemma "
    "yoco sglang gpu cpu time speed long short prompt answer question say tell me about "
    "one two three four five six seven eight nine ten all some many more less very "
    "good new old big small make take give run runs see look think know want need use "
    "work day way thing people year back after before over under up down out off here "
    "there now then just so but if as at by from into like than also well still even"
).split()
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<start_of_turn>"
    "{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n{{ m['content'] }}<end_of_turn>\n"
    "{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)


def tokenizer_vocab(size: int) -> dict:
    """token -> id for `size` ids: the specials at their ids, then single characters
    (word-initial and '##' continuations, so any ASCII text tokenizes), then words."""
    import string

    chars = string.ascii_letters + string.digits + string.punctuation
    pieces = list(chars) + ["##" + c for c in string.ascii_lowercase + string.digits]
    pieces += [w for w in dict.fromkeys(WORDS) if w not in pieces]
    pieces += ["##" + a + b for a in "etaoinshrdlucmfpgwyb" for b in "etaoinshrdlucmfpgwyb"]
    free = (i for i in range(size) if i not in SPECIALS.values())
    vocab = dict(SPECIALS)
    for piece, i in zip(pieces, free):
        vocab[piece] = i
    assert len(vocab) == size, f"{len(vocab)} tokens for a {size}-word vocabulary"
    return vocab


def write_tokenizer(path: str, vocab_size: int) -> None:
    """tokenizer.json, tokenizer_config.json (with the chat template), generation_config.json."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers

    tk = Tokenizer(models.WordPiece(tokenizer_vocab(vocab_size), unk_token="<unk>"))
    tk.normalizer = normalizers.Lowercase()
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    tk.decoder = decoders.WordPiece(prefix="##")
    tk.add_special_tokens(list(SPECIALS))
    tk.save(os.path.join(path, "tokenizer.json"))
    cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>",
        "add_bos_token": False, "model_max_length": 4096, "chat_template": CHAT_TEMPLATE,
    }
    with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    with open(os.path.join(path, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": 2, "eos_token_id": [1, 106], "pad_token_id": 0}, f, indent=1)


def build_model(path: str) -> str:
    """The tiny seeded Gemma-4 of the CPU tests plus its demo tokenizer, at `path`."""
    from tiny_gemma import GEMMA4_TEXT_CONFIG, make_tiny_gemma4

    make_tiny_gemma4(path, seed=0)
    write_tokenizer(path, GEMMA4_TEXT_CONFIG["vocab_size"])
    return path


# The README's command for serving a checkpoint on CPU, after --model-path PATH (on CPU
# the attention backend is torch_native, and an unset min-tokens lets every pass take the
# fast path; the KV cache is bounded, else it takes most of the machine's memory).
CPU_SERVER_ARGS = ("--device", "cpu", "--kv-sharing-fast-prefill", "--max-total-tokens", "32768")


def server_command(model: str, port: int, extra=()) -> list:
    return [
        sys.executable, "-m", "sglang.launch_server", "--model-path", model, *CPU_SERVER_ARGS,
        "--served-model-name", MODEL_NAME, "--dtype", "float32",
        "--port", str(port), "--log-level", "info",
        "--enable-metrics",  # /metrics counts the prefill passes that took the fast path
        *extra,
    ]


def shown_command(cmd) -> str:
    """The server command as a user can paste it from the repository's root: the venv's
    interpreter by its path (not a bare `python`, which may be another one)."""
    py = cmd[0]
    if os.path.abspath(py).startswith(ROOT + os.sep):
        py = os.path.relpath(os.path.abspath(py), ROOT)
    return shlex.join([py, *(os.path.relpath(a, ROOT) if a.startswith(ROOT + os.sep) else a
                             for a in cmd[1:])])


class Server:
    """The server as a child process; its log is kept, and lines about YOCO are echoed."""

    def __init__(self, cmd, echo=print):
        self.lines, self.echo = [], echo
        env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
        self.proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, bufsize=1)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(line.rstrip())
            if "fast prefill" in line.lower():
                self.echo("  [server log] " + line.rstrip().split("] ", 1)[-1])

    def wait_healthy(self, url, timeout=300):
        t0 = time.time()
        while time.time() - t0 < timeout:
            if self.proc.poll() is not None:
                tail = "\n".join(self.lines[-30:])
                raise RuntimeError(f"the server exited with code {self.proc.returncode}:\n{tail}")
            try:
                urllib.request.urlopen(url + "/health", timeout=2)
                return
            except Exception:
                time.sleep(1)
        raise RuntimeError(f"the server did not become healthy in {timeout} s")

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def post(url, payload, timeout=120):
    req = urllib.request.Request(url, json.dumps(payload).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


PASSES = "sglang:kv_sharing_fast_prefill_passes_total"


def fast_prefill_passes(url):
    """The server's prefill pass counters from /metrics: {(path, reason): count}."""
    import re

    with urllib.request.urlopen(url + "/metrics", timeout=30) as r:
        text = r.read().decode()
    counts = {}
    for labels, value in re.findall(PASSES + r"\{([^}]*)\} ([0-9.e+]+)", text):
        fields = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        counts[fields["path"], fields["reason"]] = float(value)
    return counts


def stream_chat(url, messages, max_tokens=16):
    """Yield the text pieces of a streamed /v1/chat/completions reply (server-sent events)."""
    payload = {"model": MODEL_NAME, "messages": messages, "max_tokens": max_tokens,
               "temperature": 0, "stream": True}
    req = urllib.request.Request(url + "/v1/chat/completions", json.dumps(payload).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            for choice in json.loads(line[5:]).get("choices", []):
                piece = (choice.get("delta") or {}).get("content")
                if piece:
                    yield piece


def client(url, stream=True, out=print):
    """What a user of the OpenAI-compatible API sends; returns the replies' texts."""
    texts = {}
    r = post(url + "/v1/completions", {"model": MODEL_NAME, "prompt": "the fast prefill runs",
                                       "max_tokens": 12, "temperature": 0})
    texts["completion"] = r["choices"][0]["text"]
    out(f"POST /v1/completions  prompt 'the fast prefill runs'\n  -> {texts['completion']!r}"
        f"  ({r['usage']['prompt_tokens']} prompt tokens, {r['usage']['completion_tokens']} generated)")
    messages = [{"role": "system", "content": "you are a tiny model"},
                {"role": "user", "content": "hello, what does yoco do?"}]
    r = post(url + "/v1/chat/completions", {"model": MODEL_NAME, "messages": messages,
                                            "max_tokens": 12, "temperature": 0})
    texts["chat"] = r["choices"][0]["message"]["content"]
    out(f"POST /v1/chat/completions  user 'hello, what does yoco do?'\n  -> {texts['chat']!r}"
        f"  ({r['usage']['prompt_tokens']} prompt tokens after the chat template)")
    if stream:
        out("POST /v1/chat/completions  stream=true\n  -> ", end="")
        pieces = []
        for piece in stream_chat(url, messages + [{"role": "assistant", "content": texts["chat"]},
                                                  {"role": "user", "content": "tell me more"}]):
            pieces.append(piece)
            out(piece, end="", flush=True)
        out(f"\n  ({len(pieces)} chunks)")
        texts["stream"] = "".join(pieces)
    return texts


def main():
    args = sys.argv[1:]
    stream = "--no-stream" not in args
    args = [a for a in args if a != "--no-stream"]
    url = f"http://127.0.0.1:{PORT}"
    model = build_model(os.path.join(ROOT, "build", "demo-model"))
    cmd = server_command(model, PORT, args)
    print("$", shown_command(cmd), flush=True)
    server = Server(cmd)
    try:
        server.wait_healthy(url)
        print(f"server up at {url} (OpenAI-compatible API under /v1)\n")
        client(url, stream=stream)
        passes = fast_prefill_passes(url)
        print(f"\nGET /metrics  {PASSES}: " + ", ".join(
            f"{path}{' (' + reason + ')' if reason else ''} {int(n)}"
            for (path, reason), n in sorted(passes.items())))
        print("\nThe weights are random, so the words are gibberish; the tokens went through "
              "the same API, chat template and YOCO fast prefill as a real Gemma-4 E2B/E4B's.")
    except RuntimeError as e:
        sys.exit(f"error: {e}")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
