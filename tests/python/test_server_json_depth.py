"""Deeply nested JSON (10^5 and 10^6 levels, 0.2-2 MB) in every place a client can put JSON
is a 400 naming the limit, and the server keeps answering. Before the limit, 10^5 levels in a
message or a tool schema overflowed a connection thread's stack and killed the process."""
import json

import httpx
import pytest

from server_harness import ServerProcess

HI = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def server():
    s = ServerProcess("--max-model-len", "256", "--max-body-bytes", str(8 << 20))
    yield s
    s.stop()


def deep(n):
    return "[" * n + "]" * n


def deep_obj(n):
    return '{"a":' * n + "1" + "}" * n


# (endpoint, body with @ where the deep document goes)
PLACES = [
    ("/v1/chat/completions", '{"messages":@}'),
    ("/v1/chat/completions", '{"messages":[{"role":"user","content":"hi","x":@}]}'),
    ("/v1/chat/completions", '{"messages":[{"role":"user","content":@}]}'),
    ("/v1/chat/completions", '{"messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function",'
                             '"function":{"name":"f","parameters":{"type":"object","properties":@}}}]}'),
    ("/v1/chat/completions", '{"messages":[{"role":"user","content":"hi"}],"response_format":@}'),
    ("/v1/chat/completions", '{"messages":[{"role":"user","content":"hi"}],"chat_template_kwargs":{"x":@}}'),
    ("/v1/chat/completions", '{"messages":[{"role":"user","content":"hi"}],"logit_bias":@}'),
    ("/v1/chat/completions", '{"messages":[{"role":"user","content":"hi"}],"future_field":@}'),
    ("/v1/completions", '{"prompt":@}'),
    ("/v1/completions", '{"prompt":"hi","stop":@}'),
    ("/tokenize", '{"messages":[{"role":"user","content":"hi"}],"tools":@}'),
    ("/tokenize", '{"prompt":@}'),
    ("/detokenize", '{"tokens":@}'),
    ("/v1/chat/completions", "@"),
]


def post(server, path, body):
    return httpx.post(server.base + path, content=body, headers={"Content-Type": "application/json"}, timeout=60)


@pytest.mark.parametrize("depth", [10 ** 5, 10 ** 6])
@pytest.mark.parametrize("path,shape", PLACES)
def test_deep_body_is_400(server, path, shape, depth):
    for doc in (deep(depth), deep_obj(depth)):
        r = post(server, path, shape.replace("@", doc).encode())
        assert r.status_code == 400, r.text[:300]
        err = r.json()["error"]
        assert err["code"] == "json_too_deep" and "512" in err["message"], err
    assert httpx.get(server.base + "/health", timeout=10).status_code == 200
    assert server.alive()


@pytest.mark.parametrize("depth", [10 ** 5, 10 ** 6])
def test_deep_tool_call_arguments_string_is_400(server, depth):
    """`arguments` is JSON inside a string: a short-looking body can carry a deep document
    that the prompt encoder would parse."""
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": deep(depth)}}
    body = {"messages": [*HI, {"role": "assistant", "content": None, "tool_calls": [call]},
                         {"role": "tool", "tool_call_id": "c1", "content": "ok"}], "max_tokens": 1}
    for path in ("/v1/chat/completions", "/tokenize"):
        r = post(server, path, json.dumps(body).encode())
        assert r.status_code == 400, r.text[:300]
        err = r.json()["error"]
        assert err["code"] == "json_too_deep"
        assert err["param"] == "messages[1].tool_calls[0].function.arguments", err
    # Encoded twice (a JSON string holding the document): the encoder parses at most once more
    # and treats too-deep text as unparsable.
    call["function"]["arguments"] = json.dumps(deep(depth))
    r = post(server, "/tokenize", json.dumps(body).encode())
    assert r.status_code in (200, 400), r.text[:300]
    assert httpx.get(server.base + "/health", timeout=10).status_code == 200
    assert server.alive()


def test_nesting_at_the_limit_is_accepted(server):
    """512 levels are fine (the body's own top-level object is the first)."""
    prefix = '{"messages":[{"role":"user","content":"hi"}],"max_tokens":1,"x":'
    r = post(server, "/v1/chat/completions", (prefix + deep(511) + "}").encode())
    assert r.status_code == 200, r.text[:300]
    r = post(server, "/v1/chat/completions", (prefix + deep(512) + "}").encode())
    assert r.status_code == 400 and r.json()["error"]["code"] == "json_too_deep"
