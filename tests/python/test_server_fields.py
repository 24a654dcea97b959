"""No silent ignores: every request field of the OpenAI/vLLM shapes is either implemented (and
checked here to have its effect) or refused with a 400 naming it."""
import httpx
import pytest

from server_harness import ServerProcess

MODEL = "tiny-v4"
HI = [{"role": "user", "content": "hi"}]
EOS = 1  # tiny-v4's eos_token_id


@pytest.fixture(scope="module")
def server():
    s = ServerProcess("--max-model-len", "2048")
    yield s
    s.stop()


def chat(server, **kw):
    return httpx.post(server.base + "/v1/chat/completions", json={"model": MODEL, "messages": HI, "max_tokens": 2, **kw},
                      timeout=60)


def completion(server, **kw):
    return httpx.post(server.base + "/v1/completions", json={"model": MODEL, "max_tokens": 2, **kw}, timeout=60)


def assert_400(r, param, code=None):
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param, err
    if code:
        assert err["code"] == code, err
    return err


@pytest.mark.parametrize("field,value", [
    ("guided_grammar", "root ::= 'a'"), ("guided_decoding_backend", "xgrammar"),
    ("guided_whitespace_pattern", " "), ("structural_tag", "{}"), ("prompt_logprobs", 1), ("prompt_logprobs", 0), ("use_beam_search", True),
    ("length_penalty", 0.5), ("bad_words", ["x"]), ("logits_processors", ["m.f"]),
    ("return_tokens_as_token_ids", True), ("return_token_ids", True), ("kv_transfer_params", {}),
    ("priority", 1), ("continue_final_message", True), ("chat_template", "{{ x }}"),
    ("documents", [{"text": "x"}]), ("mm_processor_kwargs", {"a": 1}), ("echo", True), ("audio", {"voice": "x"}),
    ("modalities", ["text", "audio"]), ("prediction", {"type": "content", "content": "x"}),
    ("web_search_options", {}), ("functions", [{"name": "f"}]), ("function_call", "auto"),
    ("verbosity", "low"), ("best_of", 2),
])
def test_unimplemented_chat_fields_are_400(server, field, value):
    assert_400(chat(server, **{field: value}), field)


@pytest.mark.parametrize("field,value", [
    ("guided_grammar", "root ::= 'a'"), ("structural_tag", "{}"), ("prompt_logprobs", 2), ("use_beam_search", True), ("prompt_embeds", "AAAA"), ("best_of", 3), ("priority", -1),
])
def test_unimplemented_completion_fields_are_400(server, field, value):
    assert_400(completion(server, prompt="hi", **{field: value}), field)


def test_structured_output_fields_are_accepted(server):
    # They were refused until structured output existed; test_structured_output.py checks what
    # they do. Here: the request goes through with a 200 and the output follows the field.
    r = completion(server, prompt="hi", max_tokens=20, response_format={"type": "json_object"})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"].lstrip().startswith("{")
    for kw in ({"guided_json": {"type": "object"}}, {"guided_regex": "a+"}, {"guided_choice": ["a", "b"]},
               {"structured_outputs": {"json": {"type": "object"}}}):
        assert chat(server, max_tokens=20, **kw).status_code == 200, kw
        assert completion(server, prompt="hi", max_tokens=20, **kw).status_code == 200, kw
    # Found by the HTTP fuzz: two allow-lists without a common token were a 500 mid-answer.
    assert_400(completion(server, prompt="hi", guided_regex="[a-c]{1,3}", allowed_token_ids=[3, 4, 5]),
               "allowed_token_ids", "unsupported_parameter")
    c = chat(server, max_tokens=4, guided_choice=["yes", "no"], temperature=0).json()["choices"][0]
    assert c["message"]["content"] in ("yes", "no") and c["finish_reason"] == "stop"


def test_tool_choice_forces_and_parallel_tool_calls_needs_a_grammar(server):
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    for tc in ("required", {"type": "function", "function": {"name": "f"}}):
        r = chat(server, max_tokens=100, tools=tools, tool_choice=tc, parallel_tool_calls=False)
        assert r.status_code == 200, r.text
        msg = r.json()["choices"][0]
        assert msg["finish_reason"] == "tool_calls", msg
        assert [t["function"]["name"] for t in msg["message"]["tool_calls"]] == ["f"]
    assert_400(chat(server, tools=tools, tool_choice={"type": "function", "function": {"name": "g"}}), "tool_choice")
    # Plain auto lets the model write any number of calls: false cannot be held there.
    assert_400(chat(server, tools=tools, parallel_tool_calls=False), "parallel_tool_calls", "unsupported_parameter")
    assert chat(server, tools=tools, parallel_tool_calls=False, response_format={"type": "json_object"}).status_code == 200
    assert chat(server, parallel_tool_calls=False).status_code == 200  # no tools: nothing to call
    assert chat(server, tools=tools, tool_choice="auto").status_code == 200
    assert chat(server, tools=tools, tool_choice="none").status_code == 200


def test_noop_values_of_unimplemented_fields_are_fine(server):
    for kw in ({"use_beam_search": False}, {"length_penalty": 1.0}, {"bad_words": []}, {"priority": 0},
               {"echo": False}, {"modalities": ["text"]}, {"parallel_tool_calls": True}, {"best_of": 1},
               {"guided_json": None}, {"spaces_between_special_tokens": False}, {"user": "u", "store": False,
                                                                                 "metadata": {"k": "v"}},
               {"stream_options": None}, {"cache_salt": "abc"}, {"service_tier": "auto"}):
        r = chat(server, **kw)
        assert r.status_code == 200, (kw, r.text)
    assert chat(server, n=2, best_of=2).status_code == 200
    assert_400(chat(server, spaces_between_special_tokens="yes"), "spaces_between_special_tokens")
    assert_400(chat(server, stream=True, stream_options={"continuous_usage_stats": True}),
               "stream_options.continuous_usage_stats")


def test_reasoning_effort_is_validated_for_the_model_and_names_its_param(server):
    # tiny-v4 is a DeepSeek-V4 model: low/medium/high/max; V4.1's integer budgets are not V4's.
    err = assert_400(chat(server, reasoning_effort=50), "reasoning_effort")
    assert "DeepSeek-V4" in err["message"]
    assert_400(chat(server, reasoning_effort="minimal"), "reasoning_effort")
    assert_400(chat(server, chat_template_kwargs={"reasoning_effort": 50}), "chat_template_kwargs.reasoning_effort")
    assert_400(httpx.post(server.base + "/tokenize", json={"messages": HI, "reasoning_effort": 50}), "reasoning_effort")
    for e in ("low", "medium", "high", "max"):
        assert chat(server, reasoning_effort=e, chat_template_kwargs={"thinking": True}).status_code == 200


def test_min_tokens_holds_back_eos(server):
    # A +100 bias makes EOS the greedy choice at every step: without min_tokens the answer is
    # empty; with min_tokens=5, five other tokens come first.
    base = dict(prompt=[0, 5, 6, 7], max_tokens=10, temperature=0, logit_bias={str(EOS): 100})
    r = completion(server, **base).json()
    assert r["choices"][0]["finish_reason"] == "stop" and r["usage"]["completion_tokens"] == 1
    r = completion(server, **base, min_tokens=5, logprobs=0).json()
    assert r["choices"][0]["finish_reason"] == "stop"
    assert len(r["choices"][0]["logprobs"]["tokens"]) == 5 and r["usage"]["completion_tokens"] == 6
    c = chat(server, max_tokens=10, temperature=0, logit_bias={str(EOS): 100}, min_tokens=3).json()
    assert c["usage"]["completion_tokens"] == 4
    assert_400(completion(server, prompt="hi", max_tokens=2, min_tokens=3), "min_tokens")
    assert_400(completion(server, prompt="hi", min_tokens=-1), "min_tokens")


def test_allowed_token_ids_restrict_every_draw(server):
    allowed = [500, 501]
    strs = {httpx.post(server.base + "/detokenize", json={"tokens": [t]}).json()["prompt"] for t in allowed}
    r = completion(server, prompt="hi", max_tokens=8, temperature=1.0, seed=3, ignore_eos=True, logprobs=0,
                   allowed_token_ids=allowed).json()
    toks = r["choices"][0]["logprobs"]["tokens"]
    assert len(toks) == 8 and set(toks) <= strs, (toks, strs)
    assert_400(completion(server, prompt="hi", allowed_token_ids=[10 ** 6]), "allowed_token_ids")
    assert_400(completion(server, prompt="hi", allowed_token_ids=[]), "allowed_token_ids")


def test_truncate_prompt_tokens_keeps_the_last_ones(server):
    kw = dict(max_tokens=4, temperature=0)
    long = completion(server, prompt=[0, 5, 6, 7, 8, 9], truncate_prompt_tokens=3, **kw).json()
    short = completion(server, prompt=[7, 8, 9], **kw).json()
    assert long["usage"]["prompt_tokens"] == 3
    assert long["choices"][0]["text"] == short["choices"][0]["text"]
    assert completion(server, prompt=[0, 5, 6], truncate_prompt_tokens=-1, **kw).json()["usage"]["prompt_tokens"] == 3
    assert_400(completion(server, prompt="hi", truncate_prompt_tokens=0), "truncate_prompt_tokens")


def test_include_stop_str_in_output(server):
    kw = dict(prompt="Once upon a time", max_tokens=24, temperature=0)
    base = completion(server, **kw).json()["choices"][0]["text"]
    visible = base.replace("\ufffd", "")
    if len(visible) < 4:
        pytest.skip("greedy output too short to cut")
    stop = visible[2:4]
    cut = completion(server, **kw, stop=[stop], include_stop_str_in_output=True).json()["choices"][0]
    assert cut["finish_reason"] == "stop"
    assert cut["text"] == base[: base.index(stop) + len(stop)]


def test_add_special_tokens_and_request_id(server):
    with_bos = completion(server, prompt="Hello").json()["usage"]["prompt_tokens"]
    without = completion(server, prompt="Hello", add_special_tokens=False).json()["usage"]["prompt_tokens"]
    assert with_bos == without + 1
    plain = chat(server).json()["usage"]["prompt_tokens"]
    assert chat(server, add_special_tokens=True).json()["usage"]["prompt_tokens"] == plain + 1
    assert chat(server, request_id="abc-123").json()["id"] == "chatcmpl-abc-123"
    assert completion(server, prompt="x", request_id="r9").json()["id"] == "cmpl-r9"


def test_tokenize_token_strs_and_refusals(server):
    r = httpx.post(server.base + "/tokenize", json={"prompt": "Hello world", "return_token_strs": True}).json()
    assert len(r["token_strs"]) == r["count"] and r["token_strs"][0] == "<｜begin▁of▁sentence｜>"
    assert_400(httpx.post(server.base + "/tokenize", json={"messages": HI, "chat_template": "x"}), "chat_template")
