"""The OpenAI API of `deepinfer-lab serve` through the official `openai` client (and plain
HTTP where the client has no method), on the bundled tiny-v4 model (random weights: the text
is noise, but it is the model's real output through the real tokenizer)."""
import json

import httpx
import openai
import pytest

from server_harness import ServerProcess

MODEL = "tiny-v4"
HI = [{"role": "user", "content": "Say hi."}]


@pytest.fixture(scope="module")
def server():
    s = ServerProcess()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base + "/v1", api_key="none", max_retries=0, timeout=120)


def tokenize(server, **body):
    r = httpx.post(server.base + "/tokenize", json={"model": MODEL, **body}, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()


def test_models_and_health(server, client):
    assert httpx.get(server.base + "/health").status_code == 200
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]


def test_chat_non_streaming_usage_matches_tokenize(server, client):
    r = client.chat.completions.create(model=MODEL, messages=HI, max_tokens=5, temperature=0)
    c = r.choices[0]
    assert c.message.role == "assistant"
    assert c.finish_reason in ("length", "stop")
    assert isinstance(c.message.content, str)
    # usage.prompt_tokens is the rendered prompt's token count.
    t = tokenize(server, messages=HI)
    assert r.usage.prompt_tokens == t["count"]
    assert 1 <= r.usage.completion_tokens <= 5
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    if c.finish_reason == "length":
        assert r.usage.completion_tokens == 5


def test_chat_streaming_shape_and_usage(client):
    kw = dict(model=MODEL, messages=HI, max_tokens=6, temperature=0)
    full = client.chat.completions.create(**kw)
    chunks = list(client.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finals) == 1
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert all(c.usage is None for c in chunks[:-1])
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    # Greedy: the stream says exactly what the non-streaming answer says.
    assert text == full.choices[0].message.content
    assert finals[0].choices[0].finish_reason == full.choices[0].finish_reason
    assert chunks[-1].usage.completion_tokens == full.usage.completion_tokens
    assert chunks[-1].usage.prompt_tokens == full.usage.prompt_tokens


def test_completions_streaming_and_not(client):
    kw = dict(model=MODEL, prompt="The capital of France is", max_tokens=5, temperature=0)
    r = client.completions.create(**kw)
    assert r.object == "text_completion"
    assert r.usage.completion_tokens >= 1
    chunks = list(client.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == r.choices[0].text
    assert chunks[-1].usage.completion_tokens == r.usage.completion_tokens
    # echo puts the prompt first; token-id prompts work too.
    e = client.completions.create(**kw, echo=True)
    assert e.choices[0].text == "The capital of France is" + r.choices[0].text
    ids = client.completions.create(model=MODEL, prompt=[0, 100, 200, 300], max_tokens=2)
    assert ids.usage.prompt_tokens == 4


def test_seed_reproducible(client):
    kw = dict(model=MODEL, messages=HI, max_tokens=8, temperature=1.0, top_p=0.95)
    a = client.chat.completions.create(**kw, seed=1234, logprobs=True)
    b = client.chat.completions.create(**kw, seed=1234, logprobs=True)
    toks = lambda r: [t.token for t in r.choices[0].logprobs.content]  # noqa: E731
    assert toks(a) == toks(b) and a.choices[0].message.content == b.choices[0].message.content
    others = [toks(client.chat.completions.create(**kw, seed=s, logprobs=True)) for s in (1, 2, 3)]
    assert any(o != toks(a) for o in others), "different seeds should give different samples"


def test_chat_logprobs(client):
    r = client.chat.completions.create(model=MODEL, messages=HI, max_tokens=4, temperature=0,
                                       logprobs=True, top_logprobs=3)
    items = r.choices[0].logprobs.content
    assert len(items) >= 1
    for it in items:
        assert it.logprob <= 0.0
        assert len(it.top_logprobs) == 3
        lps = [t.logprob for t in it.top_logprobs]
        assert lps == sorted(lps, reverse=True)
        # Greedy: the chosen token is the most likely one.
        assert it.logprob == pytest.approx(lps[0], abs=1e-5)
        assert bytes(it.bytes).decode("utf-8", "replace") == it.token or "\ufffd" in it.token


def test_completion_logprobs(client):
    r = client.completions.create(model=MODEL, prompt="Hello", max_tokens=4, temperature=0, logprobs=2)
    lp = r.choices[0].logprobs
    n = len(lp.tokens)
    assert n >= 1 and len(lp.token_logprobs) == n and len(lp.top_logprobs) == n
    assert lp.text_offset[0] == 0
    assert all(len(t) == 2 for t in lp.top_logprobs)


def test_n2(client):
    r = client.chat.completions.create(model=MODEL, messages=HI, max_tokens=4, n=2, seed=7)
    assert [c.index for c in r.choices] == [0, 1]
    one = [client.chat.completions.create(model=MODEL, messages=HI, max_tokens=4, n=1, seed=7 + i)
           for i in range(2)]
    # Choice i runs with seed + i: the same as a single request with that seed.
    assert [c.message.content for c in r.choices] == [o.choices[0].message.content for o in one]
    assert r.usage.completion_tokens == sum(o.usage.completion_tokens for o in one)
    chunks = list(client.chat.completions.create(model=MODEL, messages=HI, max_tokens=4, n=2, seed=7, stream=True))
    for i in range(2):
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices and c.choices[0].index == i)
        assert text == r.choices[i].message.content


def test_stop_strings(client):
    kw = dict(model=MODEL, prompt="Once upon a time", max_tokens=24, temperature=0)
    base = client.completions.create(**kw).choices[0].text
    visible = base.replace("\ufffd", "")
    if len(visible) < 4:
        pytest.skip("greedy output too short to cut")
    stop = visible[2:4]
    cut = client.completions.create(**kw, stop=[stop])
    assert cut.choices[0].finish_reason == "stop"
    assert cut.choices[0].text == base[: base.index(stop)]
    assert stop not in cut.choices[0].text
    # Streaming holds back text that could start the stop string and never emits it.
    chunks = list(client.completions.create(**kw, stop=[stop], stream=True))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == cut.choices[0].text


def test_logit_bias_and_stop_token_ids(client):
    # A +100 bias makes greedy decoding pick token 500 every time...
    kw = dict(model=MODEL, prompt=[0, 5, 6, 7], max_tokens=3, temperature=0, logit_bias={"500": 100})
    forced = client.completions.create(**kw, logprobs=0)
    assert forced.choices[0].finish_reason == "length"
    assert len(set(forced.choices[0].logprobs.tokens)) == 1 and forced.usage.completion_tokens == 3
    # ...and listing it in stop_token_ids ends the generation at once, without its text.
    stopped = client.completions.create(**kw, extra_body={"stop_token_ids": [500]})
    assert stopped.choices[0].finish_reason == "stop"
    assert stopped.choices[0].text == ""


def test_thinking_and_reasoning_effort_switches(server, client):
    chat = tokenize(server, messages=HI)["prompt"]
    think = tokenize(server, messages=HI, chat_template_kwargs={"thinking": True})["prompt"]
    assert chat.endswith("<｜Assistant｜></think>") and think.endswith("<｜Assistant｜><think>")
    assert tokenize(server, messages=HI, thinking={"type": "enabled"})["prompt"] == think
    mx = tokenize(server, messages=HI, chat_template_kwargs={"thinking": True, "reasoning_effort": "max"})["prompt"]
    assert mx != think and "Reasoning Effort" in mx
    assert tokenize(server, messages=HI, chat_template_kwargs={"thinking": True}, reasoning_effort="max")["prompt"] == mx
    # Thinking mode answers carry reasoning_content (text before </think>).
    r = client.chat.completions.create(model=MODEL, messages=HI, max_tokens=4,
                                       extra_body={"chat_template_kwargs": {"thinking": True}})
    assert "reasoning_content" in r.choices[0].message.model_extra
    greedy = client.chat.completions.create(model=MODEL, messages=HI, max_tokens=4, temperature=0,
                                            extra_body={"chat_template_kwargs": {"thinking": True}})
    chunks = list(client.chat.completions.create(model=MODEL, messages=HI, max_tokens=4, temperature=0, stream=True,
                                                 extra_body={"chat_template_kwargs": {"thinking": True}}))
    streamed = "".join((c.choices[0].delta.model_extra or {}).get("reasoning_content") or ""
                       for c in chunks if c.choices)
    assert streamed == greedy.choices[0].message.model_extra["reasoning_content"]
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == greedy.choices[0].message.content


TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


def test_tool_call_round_trip_http(server, client):
    call = {"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris"})}}
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21C"},
    ]
    # The prompt the model sees: tools block, the call as DSML, the result as <tool_result>.
    p = tokenize(server, messages=messages, tools=TOOLS)["prompt"]
    assert "get_weather" in p and "｜DSML｜" in p and "Paris" in p and "sunny, 21C" in p
    r = client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS, tool_choice="auto", max_tokens=4)
    c = r.choices[0]
    assert c.finish_reason in ("stop", "length", "tool_calls")
    # Whatever the random model wrote, DSML markup never leaks into content.
    assert "DSML" not in (c.message.content or "")
    if c.finish_reason == "tool_calls":
        assert c.message.tool_calls and c.message.tool_calls[0].type == "function"


def test_tokenize_detokenize(server):
    t = tokenize(server, prompt="Hello world", add_special_tokens=True)
    assert t["tokens"][0] == 0 and t["count"] == len(t["tokens"]) and t["max_model_len"] > 0
    assert t["prompt"] == "<｜begin▁of▁sentence｜>Hello world"
    d = httpx.post(server.base + "/detokenize", json={"model": MODEL, "tokens": t["tokens"]}).json()
    assert d["prompt"] == t["prompt"]
    t2 = tokenize(server, prompt="Hello world", add_special_tokens=False)
    assert t2["tokens"] == t["tokens"][1:]
    bad = httpx.post(server.base + "/detokenize", json={"tokens": [1, 99999]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens"


def test_langchain_chat(server):
    from langchain_openai import ChatOpenAI
    llm = ChatOpenAI(model=MODEL, base_url=server.base + "/v1", api_key="none", max_tokens=5,
                     temperature=0, max_retries=0, stream_usage=True)
    msg = llm.invoke("Hello")
    assert isinstance(msg.content, str)
    assert msg.usage_metadata["output_tokens"] >= 1
    parts = list(llm.stream("Hello"))
    assert "".join(p.content for p in parts) == msg.content
