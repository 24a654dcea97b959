"""Structured output end to end on the bundled tiny-v4 model (random weights: the model would
write noise, so whatever validates does so because of the grammar): JSON Schema, json_object,
regex and choice on both endpoints, the official client's parse(), forced tool calls, the
error cases. Every JSON output is checked with the `jsonschema` package."""
import json
import re
from concurrent.futures import ThreadPoolExecutor

import httpx
import jsonschema
import openai
import pytest

from server_harness import ServerProcess

MODEL = "tiny-v4"
MSG = [{"role": "user", "content": "Reply in JSON."}]

# 20 schemas: nested objects, arrays, enums, anyOf/oneOf, $ref (recursive too), formats, ranges.
SCHEMAS = [
    {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}}, "required": ["name", "age"]},
    {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]},
                                      "shade": {"type": "integer", "minimum": 0, "maximum": 10}}, "required": ["color"]},
    {"type": "array", "items": {"type": "integer", "minimum": -5, "maximum": 5}, "minItems": 1, "maxItems": 4},
    {"type": "object", "properties": {
        "user": {"type": "object", "properties": {"id": {"type": "integer"}, "email": {"type": "string", "format": "email"}},
                 "required": ["id"]},
        "active": {"type": "boolean"}}, "required": ["user", "active"]},
    {"anyOf": [{"type": "string", "maxLength": 8}, {"type": "number", "minimum": 0, "maximum": 1}, {"type": "null"}]},
    {"$defs": {"point": {"type": "object", "properties": {"x": {"type": "number"}, "y": {"type": "number"}},
                         "required": ["x", "y"]}},
     "type": "object", "properties": {"a": {"$ref": "#/$defs/point"}, "b": {"$ref": "#/$defs/point"}}, "required": ["a", "b"]},
    {"$defs": {"node": {"type": "object", "properties": {
        "v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 2}},
        "required": ["v", "kids"], "additionalProperties": False}}, "$ref": "#/$defs/node"},
    {"type": "array", "maxItems": 3, "items": {"type": "object", "additionalProperties": False, "required": ["sku", "qty"],
                                               "properties": {"sku": {"type": "string", "pattern": "^[A-Z]{3}[0-9]{2}$"},
                                                              "qty": {"type": "integer", "minimum": 1}}}},
    {"type": "object", "properties": {"version": {"const": 2}, "mode": {"enum": ["fast", "slow", None]}},
     "required": ["version", "mode"]},
    {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "integer"}, "c": {"type": "boolean"}}},
    {"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"],
     "additionalProperties": {"type": "string", "maxLength": 5}},
    {"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}, {"type": "boolean"}], "items": False,
     "minItems": 3},
    {"type": "object", "properties": {"day": {"type": "string", "format": "date"},
                                      "at": {"type": "string", "format": "date-time"}}, "required": ["day", "at"]},
    {"type": "object", "properties": {"p": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1},
                                      "t": {"type": "number", "minimum": -40.5, "maximum": 60}}, "required": ["p", "t"]},
    {"oneOf": [{"type": "object", "properties": {"kind": {"const": "circle"}, "r": {"type": "number", "minimum": 0}},
                "required": ["kind", "r"], "additionalProperties": False},
               {"type": "object", "properties": {"kind": {"const": "square"}, "side": {"type": "number", "minimum": 0}},
                "required": ["kind", "side"], "additionalProperties": False}]},
    {"type": "object", "properties": {"note": {"type": ["string", "null"], "maxLength": 20},
                                      "count": {"anyOf": [{"type": "integer"}, {"type": "null"}]}},
     "required": ["note", "count"]},
    {"type": "object", "properties": {"id": {"type": "string", "format": "uuid"}, "ip": {"type": "string", "format": "ipv4"}},
     "required": ["id", "ip"]},
    {"type": "object", "required": ["a"], "properties": {"a": {"type": "object", "required": ["b"], "properties": {
        "b": {"type": "object", "required": ["c"], "properties": {
            "c": {"type": "array", "items": {"type": "string", "enum": ["x", "y"]}}}}}}}},
    {"type": "object", "properties": {"code": {"type": "string", "minLength": 4, "maxLength": 6},
                                      "tags": {"type": "array", "items": {"type": "string", "maxLength": 3}, "maxItems": 3}},
     "required": ["code", "tags"]},
    {"$defs": {"Status": {"enum": ["ok", "fail"], "title": "Status", "type": "string"},
               "Item": {"properties": {"name": {"title": "Name", "type": "string"}, "status": {"$ref": "#/$defs/Status"},
                                       "parent": {"anyOf": [{"$ref": "#/$defs/Item"}, {"type": "null"}], "default": None}},
                        "required": ["name", "status"], "title": "Item", "type": "object"}},
     "$ref": "#/$defs/Item"},
]

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather for a city", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1, "maximum": 7},
                                         "unit": {"enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"]}}},
    {"type": "function", "function": {"name": "search", "parameters": {
        "type": "object", "properties": {"query": {"type": "string", "maxLength": 30},
                                         "filters": {"type": "array", "items": {"type": "string"}, "maxItems": 2},
                                         "exact": {"type": "boolean"}},
        "required": ["query"]}}},
]
TOOL_SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


@pytest.fixture(scope="module")
def server():
    s = ServerProcess("--max-num-seqs", "32")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base + "/v1", api_key="none", max_retries=0, timeout=300)


def validator(schema):
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


def run_one(server, i):
    """Request i of the 200: schema i % 20, through one of the ways a client can ask for it:
    0 response_format (the schema is also in the prompt), 1 structured_outputs, 2 guided_json in
    thinking mode, 3 completions with guided_json, 4 guided_json streamed. The budget is small:
    the random model writes strings until the grammar has to close them."""
    schema = SCHEMAS[i % len(SCHEMAS)]
    way = (i // len(SCHEMAS)) % 5
    body = {"model": MODEL, "max_tokens": 64, "temperature": 1.0, "seed": i}
    if way == 3:
        body.update(prompt="JSON:", guided_json=schema)
        url = "/v1/completions"
    else:
        body["messages"] = MSG
        url = "/v1/chat/completions"
        if way == 0:
            body["response_format"] = {"type": "json_schema", "json_schema": {"name": f"s{i % 20}", "schema": schema}}
        elif way == 1:
            body["structured_outputs"] = {"json": schema}
        else:
            body["guided_json"] = schema
        if way == 2:
            body["chat_template_kwargs"] = {"thinking": True}
        if way == 4:
            body["stream"] = True
    if body.get("stream"):
        text, reasoning = "", ""
        with httpx.stream("POST", server.base + url, json=body, timeout=300) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    delta = json.loads(line[6:])["choices"][0]["delta"]
                    text += delta.get("content") or ""
        return schema, text, way
    r = httpx.post(server.base + url, json=body, timeout=300)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    text = choice["text"] if url == "/v1/completions" else choice["message"]["content"]
    if way == 2:
        assert "reasoning_content" in choice["message"]
    return schema, text, way


def test_200_requests_over_20_schemas_all_validate(server):
    with ThreadPoolExecutor(max_workers=32) as pool:
        results = list(pool.map(lambda i: run_one(server, i), range(200)))
    for i, (schema, text, way) in enumerate(results):
        try:
            value = json.loads(text)
        except json.JSONDecodeError as e:
            pytest.fail(f"request {i} (schema {i % 20}, way {way}): not JSON: {e}: {text!r}")
        errors = list(validator(schema).iter_errors(value))
        assert not errors, f"request {i} (schema {i % 20}, way {way}): {errors[0].message}: {text!r}"
    m = server.metrics()
    assert m["dil:structured_output_mask_seconds_total"] > 0


def test_openai_parse_with_a_pydantic_model(client):
    from enum import Enum
    from typing import List, Optional

    from pydantic import BaseModel, Field

    class Unit(str, Enum):
        celsius = "celsius"
        fahrenheit = "fahrenheit"

    class Reading(BaseModel):
        hour: int = Field(ge=0, le=23)
        value: float

    class Forecast(BaseModel):
        city: str
        unit: Unit
        readings: List[Reading] = Field(max_length=3)
        note: Optional[str]

    def one(seed):
        return client.chat.completions.parse(model=MODEL, messages=MSG, response_format=Forecast, max_tokens=100,
                                             temperature=1.0, seed=seed)

    with ThreadPoolExecutor(max_workers=3) as pool:
        results = list(pool.map(one, range(3)))
    for r in results:
        assert r.choices[0].finish_reason == "stop"
        parsed = r.choices[0].message.parsed
        assert isinstance(parsed, Forecast), r.choices[0].message.content
        assert all(0 <= x.hour <= 23 for x in parsed.readings)


def tool_call_args(call):
    assert call.type == "function"
    args = json.loads(call.function.arguments)
    errors = list(validator(TOOL_SCHEMAS[call.function.name]).iter_errors(args))
    assert not errors, f"{call.function.name}({call.function.arguments}): {errors[0].message}"
    return args


def test_tool_choice_required_calls_a_tool_every_time(client):
    def one(i):
        return client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "What now?"}], tools=TOOLS, tool_choice="required",
            max_tokens=120, temperature=1.0, seed=100 + i, extra_body={"chat_template_kwargs": {"thinking": i % 2 == 1}})

    # Few requests: the tools block makes a long prompt for the CPU reference model.
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(one, range(4)))
    for r in results:
        c = r.choices[0]
        assert c.finish_reason == "tool_calls", c
        assert c.message.tool_calls, c.message
        for call in c.message.tool_calls:
            assert call.function.name in TOOL_SCHEMAS
            tool_call_args(call)
        assert "DSML" not in (c.message.content or "")


def test_named_tool_choice_calls_that_function_with_valid_arguments(client):
    def one(i):
        return client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Search."}], tools=TOOLS,
            tool_choice={"type": "function", "function": {"name": "search"}}, max_tokens=100, temperature=1.0, seed=i)

    with ThreadPoolExecutor(max_workers=3) as pool:
        results = list(pool.map(one, range(3)))
    for r in results:
        c = r.choices[0]
        assert c.finish_reason == "tool_calls"
        assert [t.function.name for t in c.message.tool_calls] == ["search"]
        tool_call_args(c.message.tool_calls[0])


def test_tool_choice_none_writes_no_dsml(client):
    def one(i):
        return client.chat.completions.create(model=MODEL, messages=MSG, tools=TOOLS, tool_choice="none", max_tokens=40,
                                              temperature=1.0, seed=i)

    with ThreadPoolExecutor(max_workers=6) as pool:
        results = list(pool.map(one, range(6)))
    for r in results:
        c = r.choices[0]
        assert not c.message.tool_calls
        assert "DSML" not in (c.message.content or "")


def test_regex_choice_and_json_object(client, server):
    for i in range(4):
        r = client.completions.create(model=MODEL, prompt="Code:", max_tokens=40, temperature=1.0, seed=i,
                                      extra_body={"guided_regex": r"[A-Z]{2}-\d{3,5}( ok| fail)?"})
        assert re.fullmatch(r"[A-Z]{2}-\d{3,5}( ok| fail)?", r.choices[0].text), r.choices[0].text
        c = client.chat.completions.create(model=MODEL, messages=MSG, max_tokens=10, temperature=1.0, seed=i,
                                           extra_body={"guided_choice": ["yes", "no", "maybe later"]})
        assert c.choices[0].message.content in ("yes", "no", "maybe later")
        j = client.chat.completions.create(model=MODEL, messages=MSG, max_tokens=60, temperature=1.0, seed=i,
                                           response_format={"type": "json_object"})
        assert isinstance(json.loads(j.choices[0].message.content), dict)
    # Compact JSON on request (vLLM's disable_any_whitespace).
    body = {"model": MODEL, "messages": MSG, "max_tokens": 60, "temperature": 1.0, "seed": 3,
            "structured_outputs": {"json": SCHEMAS[3], "disable_any_whitespace": True}}
    text = httpx.post(server.base + "/v1/chat/completions", json=body, timeout=120).json()["choices"][0]["message"]["content"]
    assert not re.search(r'^\s|[,:{\[]\s', text) and validator(SCHEMAS[3]).is_valid(json.loads(text)), text


def test_structured_output_errors_are_400_naming_the_field(server):
    def err(extra, endpoint="/v1/chat/completions"):
        body = {"model": MODEL, "max_tokens": 4, **extra}
        body.setdefault("messages" if endpoint.endswith("chat/completions") else "prompt",
                        MSG if endpoint.endswith("chat/completions") else "x")
        r = httpx.post(server.base + endpoint, json=body, timeout=30)
        assert r.status_code == 400, r.text
        return r.json()["error"]

    e = err({"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "object", "properties": {"a": {"type": "string", "patternProperties": {}}}}}}})
    assert e["param"] == "response_format.json_schema.schema" and "patternProperties" in e["message"]
    assert "#/properties/a" in e["message"]
    e = err({"guided_json": {"type": "object", "dependentRequired": {}}}, "/v1/completions")
    assert e["param"] == "guided_json" and "dependentRequired" in e["message"]
    assert err({"guided_regex": "(?<=a)b"})["param"] == "guided_regex"
    assert err({"guided_grammar": "root ::= \"a\""})["param"] == "guided_grammar"
    assert err({"response_format": {"type": "json_object"}, "guided_choice": ["a"]})["param"] == "guided_choice"
    assert err({"tool_choice": "required"})["param"] == "tool_choice"  # no tools
    bad_tool = [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"x": {"type": "string", "format": "color"}}}}}]
    e = err({"tools": bad_tool, "tool_choice": "required"})
    assert e["param"] == "tools[0].function.parameters" and "color" in e["message"]
    assert httpx.get(server.base + "/health").status_code == 200
