"""Request validation (stack 02): unit tests of request_validation.py, then a real server of
the tiny Gemma-4: each bad request of bad_requests.py gets a 400 naming its cause and the
server keeps serving; then a seeded fuzz of its HTTP API (http_fuzz.py).
"""

import time
from array import array

import pytest

from bad_requests import BAD_REQUESTS, STOCK_CRASHES, VOCAB, accepted_messages, error_message
from server_process import ServerProcess

pytestmark = pytest.mark.stack("generic-fixes")


def _check(**kw):
    from sglang.srt.managers.io_struct import GenerateReqInput
    from sglang.srt.managers.request_validation import validate_generate_request

    validate_generate_request(GenerateReqInput(**kw), VOCAB)


def _rejects(match, **kw):
    from sglang.srt.managers.request_validation import RequestValidationError

    with pytest.raises(RequestValidationError, match=match) as e:
        _check(**kw)
    assert isinstance(e.value, ValueError) and e.value.status_code == 400


@pytest.mark.stack("generic-fixes", step="validate-requests-before-the-scheduler")
def test_valid_requests_pass():
    _check(input_ids=[0, 511, True])  # bool is an int: True is token 1
    _check(input_ids=[[0], [511, 3]], sampling_params=[{"n": 1}, {"top_k": 5}])
    _check(input_ids=array("q", [1, 2]))
    _check(input_ids=[5], return_logprob=True, top_logprobs_num=VOCAB, logprob_start_len=-1)
    _check(input_ids=[5], sampling_params={"stop_token_ids": [1, 511], "logit_bias": {"7": -2.5},
                                           "temperature": 1, "sampling_seed": -5, "n": 3})
    _check(text="no ids to check", sampling_params={"max_new_tokens": None, "top_p": None})
    _check(input_embeds=[[0.1, 0.2]])  # its ids are placeholders: not checked here


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(input_ids=[5, 512]), r"input_ids\[1\] is 512, outside the vocabulary: token ids must be in \[0, 512\)"),
        (dict(input_ids=[5, -1]), r"input_ids\[1\] is -1"),
        (dict(input_ids=[5, 2**70]), r"input_ids\[1\] is 1180591620717411303424"),
        (dict(input_ids=[5, 6.5]), r"input_ids\[1\] is 6.5 \(float\); token ids must be integers"),
        (dict(input_ids=[5, "a"]), r"input_ids\[1\] is 'a' \(str\)"),
        (dict(input_ids=[[5], [6, 600]]), r"input_ids\[1\]\[1\] is 600"),
        (dict(input_ids=[[5], []]), r"input_ids\[1\] is empty"),
        (dict(input_ids=[[5], 6]), r"input_ids\[1\] is 6; a batch of input_ids must be a list of lists"),
        (dict(return_logprob=True, top_logprobs_num=VOCAB + 1), r"top_logprobs_num is 513; it must be in \[0, 512\]"),
        (dict(return_logprob=True, top_logprobs_num=-1), r"top_logprobs_num is -1"),
        (dict(return_logprob=True, top_logprobs_num=1.5), r"top_logprobs_num must be an integer"),
        (dict(return_logprob=True, logprob_start_len=-2), r"logprob_start_len is -2"),
        (dict(return_logprob=True, token_ids_logprob=[1, 512]), r"token_ids_logprob\[1\] is 512"),
        (dict(sampling_params={"stop_token_ids": [512]}), r"sampling_params.stop_token_ids\[0\] is 512"),
        (dict(sampling_params={"stop_token_ids": 5}), r"stop_token_ids must be a list of token ids"),
        (dict(sampling_params={"logit_bias": {"512": 1}}), r"logit_bias has the key '512', outside"),
        (dict(sampling_params={"logit_bias": {"x": 1}}), r"logit_bias has the key 'x'"),
        (dict(sampling_params={"logit_bias": {"5": float("inf")}}), r"biases must be finite numbers"),
        (dict(sampling_params={"temperature": "hot"}), r"sampling_params.temperature must be a number"),
        (dict(sampling_params={"top_p": True}), r"sampling_params.top_p must be a number"),
        (dict(sampling_params={"max_new_tokens": 2.0}), r"max_new_tokens must be an integer"),
        (dict(sampling_params={"n": 0}), r"sampling_params.n must be at least 1"),
        (dict(sampling_params={"stream_interval": 0}), r"stream_interval must be at least 1"),
        (dict(sampling_params={"sampling_seed": 2**63}), r"sampling_seed is 9223372036854775808"),
        (dict(sampling_params={"bogus": 1}), r"sampling_params has unknown keys \['bogus'\]"),
        (dict(sampling_params=5), r"sampling_params must be an object"),
        # a batch's fields name the item
        (dict(input_ids=[[5], [6]], sampling_params=[{}, {"top_k": 2.5}]),
         r"sampling_params\[1\].top_k must be an integer"),
        (dict(input_ids=[[5], [6]], return_logprob=True, top_logprobs_num=[1, 600]),
         r"top_logprobs_num\[1\] is 600"),
    ],
)
@pytest.mark.stack("generic-fixes", step="validate-requests-before-the-scheduler", fails_before=True)
def test_bad_fields_rejected(kw, match):
    _rejects(match, **{"input_ids": [5, 6], **kw})


def _server_limits():
    """The limits a server started with the default arguments applies."""
    from sglang.srt.managers.request_validation import RequestLimits
    from sglang.srt.server_args import ServerArgs

    return RequestLimits.of(ServerArgs(model_path="dummy"))


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(sampling_params={"n": 100000, "max_new_tokens": 1}),
         r"sampling_params.n is 100000; a request may ask for at most 128 parallel samples "
         r"\(the server argument --max-parallel-samples raises it\)"),
        (dict(input_ids=[[5]] * 2, sampling_params=[{"n": 129}, {"n": 1}]),
         r"sampling_params\[0\].n is 129; .* --max-parallel-samples"),
        (dict(input_ids=[[5]] * 40, sampling_params={"n": 128}),
         r"The request asks for 5120 sequences \(40 prompts x n=128\); a request may ask for "
         r"at most 4096 \(the server argument --max-sequences-per-request raises it\)"),
        (dict(input_ids=[[5]] * 4097),
         r"The request asks for 4097 sequences \(4097 prompts x n=1\)"),
        (dict(return_logprob=True, top_logprobs_num=21),
         r"top_logprobs_num is 21; a request may ask for at most 20 top logprobs per token "
         r"\(the server argument --max-top-logprobs-num raises it\)"),
        (dict(input_ids=[[5], [6]], return_logprob=True, top_logprobs_num=[1, 500]),
         r"top_logprobs_num\[1\] is 500; .* --max-top-logprobs-num"),
        (dict(return_logprob=True, token_ids_logprob=[5] * (VOCAB + 1)),
         r"token_ids_logprob has 513 token ids, more than the vocabulary's 512"),
        (dict(embedding=True, input_ids=[[5]] * 4097), r"asks for 4097 sequences"),
        # a malformed n is answered by its own check, whatever the batch
        (dict(input_ids=[[5]] * 3, sampling_params={"n": "x"}), r"sampling_params.n must be an integer"),
    ],
)
@pytest.mark.stack("generic-fixes", step="bound-what-one-request-reserves", fails_before=True)
def test_what_one_request_reserves_is_bounded(kw, match):
    # n = 100000 kept every other client waiting for minutes: a 400 naming the server argument
    from sglang.srt.managers.io_struct import EmbeddingReqInput, GenerateReqInput
    from sglang.srt.managers.request_validation import RequestValidationError, validate_generate_request

    kw = {"input_ids": [5, 6], **kw}
    req = (EmbeddingReqInput if kw.pop("embedding", False) else GenerateReqInput)(**kw)
    with pytest.raises(RequestValidationError, match=match):
        validate_generate_request(req, VOCAB, limits=_server_limits())


@pytest.mark.stack("generic-fixes", step="bound-what-one-request-reserves")
def test_requests_within_the_bounds_pass():
    from dataclasses import replace

    from sglang.srt.managers.io_struct import EmbeddingReqInput, GenerateReqInput
    from sglang.srt.managers.request_validation import validate_generate_request

    limits = _server_limits()
    validate_generate_request(EmbeddingReqInput(input_ids=[[5]] * 4096), VOCAB, limits=limits)
    for kw in (
        dict(input_ids=[5], sampling_params={"n": 128}),
        dict(input_ids=[[5]] * 32, sampling_params={"n": 128}),
        dict(input_ids=[[5]] * 4096),
        dict(input_ids=[5], return_logprob=True, top_logprobs_num=20,
             token_ids_logprob=list(range(VOCAB))),
    ):
        validate_generate_request(GenerateReqInput(**kw), VOCAB, limits=limits)
    # each bound is the server argument's value
    raised = replace(limits, max_parallel_samples=1000, max_sequences_per_request=10**6,
                     max_top_logprobs_num=VOCAB)
    validate_generate_request(
        GenerateReqInput(input_ids=[5], sampling_params={"n": 1000}, return_logprob=True,
                         top_logprobs_num=VOCAB), VOCAB, limits=raised)


@pytest.mark.stack("generic-fixes", step="pd-decode-request-needs-bootstrap-host", fails_before=True)
def test_a_pd_decode_server_needs_the_bootstrap_host():
    # without it the decode scheduler failed building the transfer's address: the server stopped
    import types

    from sglang.srt.managers.io_struct import GenerateReqInput
    from sglang.srt.managers.request_validation import RequestLimits, validate_generate_request

    def check(mode, **kw):
        limits = RequestLimits.of(types.SimpleNamespace(disaggregation_mode=mode))
        validate_generate_request(GenerateReqInput(**kw), VOCAB, limits=limits)

    boot = dict(bootstrap_host="10.0.0.1", bootstrap_port=8998, bootstrap_room=7)
    check("decode", input_ids=[5], **boot)
    check("decode", input_ids=[[5], [6]], **{**boot, "bootstrap_host": ["10.0.0.1", "10.0.0.2"]})
    check("prefill", input_ids=[5])
    check("null", input_ids=[5])
    with pytest.raises(ValueError, match=r"bootstrap_host is missing: a PD decode server .* the router"):
        check("decode", input_ids=[5])
    with pytest.raises(ValueError, match=r"bootstrap_host\[1\] is missing"):
        check("decode", input_ids=[[5], [6]], bootstrap_host=["10.0.0.1", None])


@pytest.mark.stack("generic-fixes", step="per-request-sampling-seed", fails_before=True)
def test_a_seed_speculative_decoding_would_not_honour_is_refused_unless_greedy():
    # where verify draws from the batch's generator, or the drafts follow no seed, the same
    # seeded request would sample differently with its company, silently
    import types

    from sglang.srt.managers.io_struct import GenerateReqInput
    from sglang.srt.managers.request_validation import RequestLimits, validate_generate_request

    def check(algorithm, deterministic=False, rejection=False, **params):
        limits = RequestLimits.of(types.SimpleNamespace(
            speculative_algorithm=algorithm, enable_deterministic_inference=deterministic,
            speculative_use_rejection_sampling=rejection))
        validate_generate_request(GenerateReqInput(input_ids=[5], sampling_params=params),
                                  VOCAB, limits=limits)

    seeded = {"sampling_seed": 3, "temperature": 0.8}
    check(None, **seeded)
    check("FROZEN_KV_MTP", temperature=0.8)
    check("FROZEN_KV_MTP", **{**seeded, "temperature": 0})
    check("FROZEN_KV_MTP", **{**seeded, "temperature": 1e-7})
    check("FROZEN_KV_MTP", **{**seeded, "top_k": 1})
    check("FROZEN_KV_MTP", deterministic=True, **seeded)  # verify's coins follow each row's seed
    for params in ({"sampling_seed": 3}, {**seeded, "top_k": 5}):
        with pytest.raises(ValueError, match=r"sampling_seed is set, but this server runs speculative "
                           r"decoding \(--speculative-algorithm FROZEN_KV_MTP\), whose verify step samples "
                           r"from the batch's generator unless --enable-deterministic-inference is on.*"
                           r"greedy output \(temperature 0\)"):
            check("FROZEN_KV_MTP", **params)
    with pytest.raises(ValueError, match=r"\(--speculative-algorithm NGRAM\), whose drafts do not follow"):
        check("NGRAM", deterministic=True, **seeded)
    with pytest.raises(ValueError, match=r"EAGLE --speculative-use-rejection-sampling\), whose drafts"):
        check("EAGLE", deterministic=True, rejection=True, **seeded)


@pytest.mark.stack("generic-fixes", step="scheduler-aborts-out-of-vocab-request", fails_before=True)
def test_scheduler_check():
    from types import SimpleNamespace as NS

    from sglang.srt.managers.request_validation import check_tokenized_request

    def req(ids, **kw):
        d = dict(input_ids=array("q", ids), mm_inputs=None, input_embeds=None,
                 return_logprob=False, top_logprobs_num=0)
        d.update(kw)
        return NS(**d)

    assert check_tokenized_request(req([1, 511]), VOCAB) is None
    assert "token id 512" in check_tokenized_request(req([1, 512]), VOCAB)
    assert "token id -3" in check_tokenized_request(req([-3, 1]), VOCAB)
    # multimodal pad values and input_embeds placeholders are not token ids
    assert check_tokenized_request(req([1, 10**9], mm_inputs=object()), VOCAB) is None
    assert check_tokenized_request(req([1, 10**9], input_embeds=[[0.0]]), VOCAB) is None
    assert "top_logprobs_num is 600" in check_tokenized_request(
        req([1], return_logprob=True, top_logprobs_num=600), VOCAB)


def _yoco_args():
    """YOCO on (every prefill pass) where the tree has the flag (not at stack 02's own check)."""
    import importlib.util

    if importlib.util.find_spec("sglang.srt.arg_groups.kv_sharing_fast_prefill_hook"):
        return ["--kv-sharing-fast-prefill", "--kv-sharing-fast-prefill-min-tokens", "0"]
    return []


@pytest.fixture(scope="module")
def server(model_dir):
    s = ServerProcess(model_dir, _yoco_args(), name="validation")
    try:
        yield s.wait_ready()
    finally:
        s.stop()


def _serves(server):
    r = server.post("/generate", {"input_ids": [5, 6, 7],
                                  "sampling_params": {"max_new_tokens": 3, "temperature": 0}})
    return r.status_code == 200 and len(r.json()["output_ids"]) == 3


def test_bad_requests_get_400_and_the_server_keeps_serving(server):
    assert _serves(server)
    failures = []
    for name, path, body, expect in BAD_REQUESTS:
        r = server.post(path, body, timeout=120)
        msg = error_message(r)
        if r.status_code != 400 or not any(
                m in msg for m in accepted_messages(path, body, expect)):
            failures.append((name, r.status_code, msg[:300]))
        # a served generation shows the scheduler alive (/health waits 1 s each)
        if server.proc.poll() is not None or not _serves(server):
            pytest.fail(f"the server stopped serving after {name}:\n{server.log_tail()}")
    assert not failures, failures
    assert STOCK_CRASHES <= {name for name, *_ in BAD_REQUESTS}


def test_streamed_bad_request_gets_400(server):
    """Patch 0034: checked before the stream's 200 goes out (stock: 200 and an
    error event)."""
    body = {"input_ids": [5, VOCAB], "sampling_params": {"max_new_tokens": 2}, "stream": True}
    r = server.post("/generate", body, timeout=60)
    assert r.status_code == 400, r.text
    assert "input_ids[1] is 512, outside the vocabulary" in error_message(r)
    body = {"input_ids": [5, 6], "stream": True,
            "sampling_params": {"max_new_tokens": 2, "stream_interval": 0}}
    r = server.post("/generate", body, timeout=60)
    assert r.status_code == 400 and "stream_interval must be at least 1" in error_message(r)
    assert _serves(server)


def test_completions_serve_token_ids_without_a_tokenizer(server):
    """Stock answered this 500 "'text'" after generating."""
    body = {"model": "m", "prompt": [5, 6, 7], "max_tokens": 2, "temperature": 0,
            "return_token_ids": True}
    r = server.post("/v1/completions", body, timeout=60)
    assert r.status_code == 200, r.text
    assert [(c["text"], len(c["token_ids"])) for c in r.json()["choices"]] == [("", 2)]
    r = server.post("/v1/completions", {**body, "stream": True}, timeout=60)
    assert r.status_code == 200 and "data: [DONE]" in r.text, r.text


@pytest.mark.stack("generic-fixes", step="v1-loads-unknown-section-400", fails_before=True)
def test_loads_with_an_unknown_section_gets_400(server):
    """Stock: 500 (the snapshot's ValueError escaped the handler), in JSON; the prometheus
    format ignored the section."""
    import requests

    for query in ("include=bogus", "include=core,bogus&format=prometheus", "include=core,"):
        r = requests.get(f"{server.url}/v1/loads?{query}", timeout=30)
        assert r.status_code == 400 and "include has unknown sections" in r.text and "'queues'" in r.text, (query, r.status_code, r.text)
    r = requests.get(f"{server.url}/v1/loads?include=core,memory", timeout=30)
    assert r.status_code == 200 and set(r.json()["loads"][0]) >= {"memory"}, r.text
    assert _serves(server)


# Falsifying examples the fuzz found (each a 5xx before stack 02's tokenizer steps),
# kept as regression cases: (path, JSON body, raw body).
FUZZ_REGRESSIONS = [
    ("/v1/completions", {"model": "m", "prompt": [[0], [184]], "max_tokens": 2,
                         "return_token_ids": True}, None),  # 500 'text'
    ("/v1/completions", {"model": "m", "prompt": [5], "max_tokens": 2}, None),  # 500 'text'
    ("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": ""}]},
     None),  # 500: no tokenizer to apply the chat template
]

FUZZ_EXAMPLES = 300
FUZZ_SECONDS = 60.0
# /health generates a token and waits at least 1 s; both cores are shared in CI
HEALTHY_WITHIN = 10.0


def test_fuzz_http_api(server, record_property):
    """A seeded fuzz of /generate, /v1/completions and /v1/chat/completions (http_fuzz.py).
    No answer is a 5xx; /v1/loads answers within HEALTHY_WITHIN after each request, and
    /health (a generation through the scheduler) throughout, polled from a thread; the
    server is idle at the end, and a greedy request gives the same tokens as before.
    Bounded: FUZZ_EXAMPLES requests, none drawn after FUZZ_SECONDS sent."""
    import threading

    import requests
    from hypothesis import HealthCheck, Phase, example, given, settings

    from http_fuzz import Counts, http_request

    probe = {"input_ids": [11, 12, 13, 14], "sampling_params": {"max_new_tokens": 4,
                                                                "temperature": 0}}
    before = server.post("/generate", probe, timeout=60)
    assert before.status_code == 200, before.text
    counts, failures, health = Counts(), [], []
    stop = threading.Event()

    def poll_health():
        while not stop.is_set():
            t0 = time.monotonic()
            try:
                ok = requests.get(server.url + "/health", timeout=HEALTHY_WITHIN).status_code == 200
            except requests.RequestException:
                ok = False
            health.append((ok, time.monotonic() - t0))

    end = time.monotonic() + FUZZ_SECONDS

    def send(case):
        path, body, raw = case
        if time.monotonic() > end:
            counts.not_sent += 1
            return
        if raw is not None:
            r = requests.post(server.url + path, data=raw, timeout=120,
                              headers={"Content-Type": "application/json"})
        else:
            r = server.post(path, body, timeout=120)
        counts.add(path, r.status_code, error_message(r) if r.status_code >= 400 else "")
        if r.status_code >= 500:
            failures.append((path, body if raw is None else raw, r.status_code, r.text[:300]))
        try:
            server.loads(timeout=HEALTHY_WITHIN)
        except (requests.RequestException, AssertionError) as e:
            pytest.fail(f"/v1/loads did not answer within {HEALTHY_WITHIN:.0f} s after {path} {body or raw!r}: "
                        f"{e}\n{server.log_tail()}")
        assert server.proc.poll() is None, server.log_tail()

    run = given(case=http_request)(send)
    for case in FUZZ_REGRESSIONS:
        run = example(case=case)(run)
    run = settings(max_examples=FUZZ_EXAMPLES, derandomize=True, deadline=None,
                   database=None, phases=(Phase.explicit, Phase.generate), print_blob=False,
                   suppress_health_check=list(HealthCheck))(run)
    poller = threading.Thread(target=poll_health, daemon=True)
    poller.start()
    try:
        run()
    finally:
        stop.set()
        poller.join(timeout=10)

    summary = counts.summary() + (
        f"\n/health: {sum(ok for ok, _ in health)} of {len(health)} answered 200, "
        f"slowest {max((t for _, t in health), default=0):.1f} s")
    print(summary)
    record_property("summary", summary)
    assert not failures, failures
    assert health and all(ok for ok, _ in health), health
    # nothing left running or waiting once the answers are in (the last health
    # check's one token may still be on its way)
    for _ in range(10):
        busy = [(d["num_running_reqs"], d["num_waiting_reqs"]) for d in server.loads(HEALTHY_WITHIN)
                if d["num_running_reqs"] or d["num_waiting_reqs"]]
        if not busy:
            break
        time.sleep(1)
    assert not busy, busy
    after = server.post("/generate", probe, timeout=60)
    assert after.status_code == 200, after.text
    assert after.json()["output_ids"] == before.json()["output_ids"]
