"""The OpenAI-compatible and other text routes on a server without a tokenizer
(--skip-tokenizer-init): token ids served where the route can, else a 400 that
says why, never a 500. Handlers are called with stand-ins for the tokenizer
manager; test_request_validation.py sends the same requests to a real server.
"""

from types import SimpleNamespace as NS

import pytest
from release import RELEASE

from bad_requests import NEEDS_TOKENIZER, error_message  # each route failed inside its handler

pytestmark = pytest.mark.stack("generic-fixes")


def _completion_serving(monkeypatch):
    from sglang.srt.entrypoints.openai import serving_completions

    # the server's settings, as the tokenizer manager holds them
    serving_args = NS(enable_cache_report=False)
    if RELEASE >= (0, 5, 23):  # it reads them from the published "serving" namespace
        monkeypatch.setattr(serving_completions, "get_serving", lambda: serving_args)
    tokenizer_manager = NS(tokenizer=None, server_args=serving_args)
    return serving_completions.OpenAIServingCompletion(
        tokenizer_manager, NS(completion_template_name=None))


def _ret(output_ids):
    # what the tokenizer manager yields without a tokenizer: no "text"
    return {"output_ids": output_ids,
            "meta_info": {"id": "r", "prompt_tokens": 3, "completion_tokens": len(output_ids),
                          "cached_tokens": 0, "finish_reason": {"type": "length"},
                          "weight_version": "default"}}


@pytest.mark.stack("generic-fixes", step="openai-completions-token-ids-without-tokenizer",
                   fails_before=True)
def test_completions_serve_token_ids_or_say_why(monkeypatch):
    """Stock answered every token-id /v1/completions request 500 "'text'"."""
    from sglang.srt.entrypoints.openai.protocol import CompletionRequest

    serving = _completion_serving(monkeypatch)
    plain = CompletionRequest(model="m", prompt=[5, 6, 7], max_tokens=2)
    msg = serving._validate_request(plain)
    assert msg is not None and "needs the tokenizer" in msg and "return_token_ids" in msg
    assert "--skip-tokenizer-init" in msg

    ids = CompletionRequest(model="m", prompt=[5, 6, 7], max_tokens=2, return_token_ids=True)
    assert serving._validate_request(ids) is None
    resp = serving._build_completion_response(ids, [_ret([7, 8])], created=0)
    assert [(c.text, c.token_ids) for c in resp.choices] == [("", [7, 8])]
    assert resp.usage.completion_tokens == 2


@pytest.fixture(scope="module")
def client_without_tokenizer():
    from fastapi.testclient import TestClient

    from sglang.srt.entrypoints import http_server

    saved = http_server._global_state
    http_server._global_state = NS(tokenizer_manager=NS(tokenizer=None))
    try:
        yield TestClient(http_server.app, raise_server_exceptions=False)
    finally:
        http_server._global_state = saved


@pytest.mark.parametrize("path, body", NEEDS_TOKENIZER, ids=[p for p, _ in NEEDS_TOKENIZER])
@pytest.mark.stack("generic-fixes", step="routes-needing-tokenizer-400", fails_before=True)
def test_routes_needing_the_tokenizer_answer_400(client_without_tokenizer, path, body):
    r = client_without_tokenizer.post(path, json=body)
    assert r.status_code == 400, (r.status_code, r.text[:300])
    msg = error_message(r)
    assert f"{path} needs the tokenizer" in msg and "--skip-tokenizer-init" in msg, msg
