"""Every bad input gets an OpenAI error body with the right status; the `openai` client maps
them to its typed exceptions."""

import re

import httpx
import openai
import pytest

from server_harness import ServerProcess

MODEL = "tiny-v4"
HI = [{"role": "user", "content": "hi"}]
MAX_LEN = 256


@pytest.fixture(scope="module")
def server():
    s = ServerProcess("--max-model-len", str(MAX_LEN), "--max-body-bytes", "100000")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base + "/v1", api_key="none", max_retries=0, timeout=60)


def post(server, path, body, **kw):
    if isinstance(body, (bytes, str)):
        return httpx.post(server.base + path, content=body, headers={"Content-Type": "application/json"}, timeout=30, **kw)
    return httpx.post(server.base + path, json=body, timeout=30, **kw)


def assert_error(r, status, param=None):
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert isinstance(err["message"], str) and err["message"]
    assert set(err) >= {"message", "type", "param", "code"}
    if param is not None:
        assert err["param"] == param, err
    return err


def test_malformed_json(server):
    assert_error(post(server, "/v1/chat/completions", b'{"model": "tiny-v4", "messages": ['), 400)
    assert_error(post(server, "/v1/chat/completions", b'[1, 2]'), 400)
    assert_error(post(server, "/v1/chat/completions", b'{"messages": [{"role": "user", "content": "\xff\xfe"}]}'), 400)


@pytest.mark.parametrize("field,value", [
    ("temperature", "hot"), ("max_tokens", "10"), ("max_tokens", 1.5), ("n", -1), ("stream", "yes"),
    ("top_p", 5), ("stop", 3), ("seed", "x"), ("messages", "hi"), ("logprobs", 1), ("tools", "x"),
    ("max_tokens", 10 ** 30), ("presence_penalty", 1e300),
])
def test_wrong_types(server, field, value):
    body = {"model": MODEL, "messages": HI, "max_tokens": 2, field: value}
    assert_error(post(server, "/v1/chat/completions", body), 400, param=field)


def test_typed_exceptions(client):
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=MODEL, messages=HI, temperature=-1)
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="gpt-4o", messages=HI)
    assert e.value.body["code"] == "model_not_found"
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="nope", prompt="x")


def test_prompt_longer_than_context(server, client):
    long = "word " * (2 * MAX_LEN)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": long}], max_tokens=4)
    msg = e.value.body["message"]
    assert e.value.body["code"] == "context_length_exceeded"
    n_prompt = httpx.post(server.base + "/tokenize", json={"messages": [{"role": "user", "content": long}]}).json()["count"]
    assert f"maximum context length is {MAX_LEN}" in msg and f"{n_prompt} in the messages" in msg
    # ... and the capacity it could never fit into (the log's figure; the pool holds max_model_len).
    kv_tokens = int(re.search(r"KV cache (\d+) tokens", server.read_log()).group(1))
    assert kv_tokens >= MAX_LEN
    assert f"The KV cache holds {kv_tokens} tokens" in msg, msg
    # prompt fits but prompt + max_tokens does not
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=MODEL, prompt="hello", max_tokens=MAX_LEN)


def test_body_too_large(server):
    body = b'{"model": "tiny-v4", "prompt": "' + b"a" * 200000 + b'"}'
    assert_error(post(server, "/v1/completions", body), 413)
    assert httpx.get(server.base + "/health").status_code == 200


def test_unsupported_response_formats_are_a_clear_400(client):
    # Structured output itself is tested in test_structured_output.py; here: what it refuses.
    cases = [({"type": "yaml"}, "response_format.type", "yaml"),
             ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "minProperties": 1}}},
              "response_format.json_schema.schema", "minProperties")]
    for rf, param, word in cases:
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model=MODEL, messages=HI, response_format=rf)
        assert word in e.value.body["message"] and e.value.body["param"] == param
    r = client.chat.completions.create(model=MODEL, messages=HI, response_format={"type": "text"}, max_tokens=2)
    assert r.choices[0].finish_reason in ("stop", "length")


def test_bad_messages_and_parts(server):
    assert_error(post(server, "/v1/chat/completions", {"messages": []}), 400, "messages")
    assert_error(post(server, "/v1/chat/completions", {"messages": [{"role": "robot", "content": "x"}]}), 400)
    img = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]
    assert_error(post(server, "/v1/chat/completions", {"messages": img}), 400)
    # Text parts (as `vllm bench` sends them) are fine.
    parts = [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    r = post(server, "/v1/chat/completions", {"messages": parts, "max_tokens": 2})
    assert r.status_code == 200, r.text
    assert_error(post(server, "/tokenize", {"messages": [{"role": "user"}]}), 400)


def test_unknown_route_and_unknown_fields(server):
    assert_error(httpx.get(server.base + "/v1/nothing"), 404)
    r = post(server, "/v1/chat/completions", {"messages": HI, "max_tokens": 2, "user": "u", "metadata": {"a": 1},
                                              "some_future_field": [1, 2, 3]})
    assert r.status_code == 200, r.text


def test_api_key():
    s = ServerProcess("--api-key", "sekret", "--max-model-len", str(MAX_LEN))
    try:
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=s.base + "/v1", api_key="wrong", max_retries=0).models.list()
        assert_error(httpx.post(s.base + "/v1/chat/completions", json={"messages": HI}), 401)
        assert_error(httpx.post(s.base + "/tokenize", json={"prompt": "x"}), 401)
        ok = openai.OpenAI(base_url=s.base + "/v1", api_key="sekret", max_retries=0)
        assert ok.chat.completions.create(model=MODEL, messages=HI, max_tokens=2).choices
        assert httpx.get(s.base + "/health").status_code == 200  # probes need no key
    finally:
        s.stop()


def test_overload_429():
    s = ServerProcess("--max-concurrent", "1", "--overload", "reject", "--max-model-len", "4096")
    try:
        c = openai.OpenAI(base_url=s.base + "/v1", api_key="none", max_retries=0, timeout=60)
        stream = c.chat.completions.create(model=MODEL, messages=HI, max_tokens=3000, stream=True, seed=1,
                                           extra_body={"ignore_eos": True})
        first = next(iter(stream))  # the role chunk: the first request holds the only slot
        assert first.choices[0].delta.role == "assistant"
        with pytest.raises(openai.RateLimitError) as e:
            c.chat.completions.create(model=MODEL, messages=HI, max_tokens=2)
        assert e.value.response.headers.get("retry-after") == "1"
        stream.close()
    finally:
        s.stop()
