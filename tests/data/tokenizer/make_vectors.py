# Generates prompt-encoder and parser test vectors with DeepSeek's official Python encoders.
# Run outside the repository: python3 gen_vectors.py OUT_DIR
import copy, json, sys
import os
sys.path.insert(0, os.environ.get("ENC_DIR", "/tmp/enc"))  # official encoders, outside the repo
import encoding_dsv4 as v4
import encoding_v41 as v41  # V4.1 encoding/encoding.py saved under this name

W = {"type": "function", "function": {"name": "get_weather", "description": "Get the weather for a city. 获取天气",
     "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City name"},
     "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}, "days": {"type": "integer", "minimum": 1}},
     "required": ["city"]}}}
S = {"type": "function", "function": {"name": "search", "description": "Search the web",
     "parameters": {"type": "object", "properties": {"query": {"type": "string"}, "top_k": {"type": "number", "default": 5.0},
     "filters": {"type": "object"}}, "required": ["query"]}}}
C = {"type": "function", "function": {"name": "run_code", "description": "Run \"python\" code\nwith a\ttab",
     "parameters": {"type": "object", "properties": {"code": {"type": "string"}, "timeout": {"type": "number"}}}}}
RF = {"type": "json_schema", "json_schema": {"name": "answer", "schema": {"type": "object",
      "properties": {"answer": {"type": "string"}, "confidence": {"type": "number", "minimum": 0.0, "maximum": 1.0}},
      "required": ["answer"]}}}

def tc(id_, name, args):
    return {"id": id_, "type": "function", "function": {"name": name, "arguments": args}}

CONVS = {
 "single_user": [{"role": "user", "content": "Hello!"}],
 "system_user": [{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": "What is 2+2?"}],
 "multi_turn": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"},
   {"role": "assistant", "content": "Hello! How can I help?", "reasoning_content": "The user greets me."},
   {"role": "user", "content": "Tell me a joke."}],
 "multi_turn_3": [{"role": "user", "content": "Q1"}, {"role": "assistant", "content": "A1", "reasoning_content": "R1"},
   {"role": "user", "content": "Q2"}, {"role": "assistant", "content": "A2", "reasoning_content": "R2"},
   {"role": "user", "content": "Q3"}],
 "unicode": [{"role": "system", "content": "Réponds en français 🇫🇷."}, {"role": "user", "content": "日本語とかな、한국어, عربى, हिन्दी, ไทย 👨‍👩‍👧\n\ttabs\r\nCRLF"}],
 "trailing_assistant": [{"role": "user", "content": "Write a haiku."}, {"role": "assistant", "content": "Old pond, frog jumps in.", "reasoning_content": "Think of a haiku."}],
 "empty_system": [{"role": "system", "content": ""}, {"role": "user", "content": "x"}],
 "consecutive_users": [{"role": "user", "content": "first part"}, {"role": "user", "content": "second part"}],
 "tool_call_result": [{"role": "system", "content": "You can use tools."}, {"role": "user", "content": "Weather in Beijing?"},
   {"role": "assistant", "content": "", "reasoning_content": "Need the weather tool.", "tool_calls": [tc("call_1", "get_weather", "{\"city\": \"北京\", \"unit\": \"celsius\", \"days\": 3}")]},
   {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 21.5, \"sky\": \"晴\"}"},
   {"role": "assistant", "content": "It is 21.5°C and sunny in Beijing.", "reasoning_content": "Report it."},
   {"role": "user", "content": "And tomorrow?"}],
 "parallel_tools_unsorted": [{"role": "user", "content": "Weather in Paris and search news"},
   {"role": "assistant", "content": "Let me check.", "tool_calls": [tc("a", "get_weather", "{\"city\": \"Paris\"}"),
     tc("b", "search", "{\"query\": \"news\", \"top_k\": 3, \"filters\": {\"lang\": \"en\", \"recent\": true}}")]},
   {"role": "tool", "tool_call_id": "b", "content": "news results"},
   {"role": "tool", "tool_call_id": "a", "content": "sunny"}],
 "tool_then_user_text": [{"role": "user", "content": "run it"},
   {"role": "assistant", "content": None, "tool_calls": [tc("x1", "run_code", "{\"code\": \"print(1)\\nprint('é')\", \"timeout\": 1.5}")]},
   {"role": "tool", "tool_call_id": "x1", "content": "1\né"}, {"role": "user", "content": "thanks, now explain"}],
 "tool_args_nested": [{"role": "user", "content": "complex"},
   {"role": "assistant", "content": "", "tool_calls": [tc("n1", "search", "{\"query\": \"a \\\"quoted\\\" \\\\ path\", \"filters\": {\"tags\": [\"x\", 1, 2.0, null, false], \"nested\": {\"k\": \"中文\"}}, \"top_k\": 1e-05}")]},
   {"role": "tool", "tool_call_id": "n1", "content": "[]"}],
 "tool_result_list_content": [{"role": "user", "content": "go"},
   {"role": "assistant", "content": "", "tool_calls": [tc("L1", "search", "{\"query\": \"q\"}")]},
   {"role": "tool", "tool_call_id": "L1", "content": [{"type": "text", "text": "part one"}, {"type": "text", "text": "part two"}]}],
 "latest_reminder": [{"role": "system", "content": "sys"}, {"role": "user", "content": "What day is it?"},
   {"role": "latest_reminder", "content": "Today is 2026-11-29."}],
 "task_title": [{"role": "user", "content": "Summarize: cats are great.", "task": "title"}],
 "task_action": [{"role": "system", "content": "classify"}, {"role": "user", "content": "Book a flight", "task": "action"}],
}
V4_ONLY = {
 "developer": [{"role": "system", "content": "sys"}, {"role": "developer", "content": "Developer instructions."}, {"role": "user", "content": "hi"}],
 "tool_args_invalid_json": [{"role": "user", "content": "x"},
   {"role": "assistant", "content": "", "tool_calls": [tc("i1", "run_code", "not json at all")]},
   {"role": "tool", "tool_call_id": "i1", "content": "err"}],
}
V41_ONLY = {
 "mid_system": [{"role": "system", "content": "first"}, {"role": "user", "content": "u1"},
   {"role": "assistant", "content": "a1", "reasoning_content": "r1"}, {"role": "system", "content": "New instruction mid-way."}],
 "mid_system_then_user": [{"role": "user", "content": "u1"}, {"role": "assistant", "content": "a1", "reasoning_content": "r1"},
   {"role": "system", "content": "switch language"}, {"role": "user", "content": "u2"}],
 "image_blocks": [{"role": "user", "content": [{"type": "text", "text": "What is in this image?"},
   {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}, {"type": "text", "text": "Be precise."}]}],
 "tool_args_dict_and_double_encoded": [{"role": "user", "content": "x"},
   {"role": "assistant", "content": "", "tool_calls": [tc("d1", "search", {"query": "dict args", "top_k": 2}),
     tc("d2", "search", json.dumps(json.dumps({"query": "double"})))]},
   {"role": "tool", "tool_call_id": "d1", "content": "r1"}, {"role": "tool", "tool_call_id": "d2", "content": "r2"}],
 "text_parts": [{"role": "system", "content": [{"type": "text", "text": "sys part 1"}, {"type": "text", "text": "sys part 2"}]},
   {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
}

def attach(messages, tools, rf):
    msgs = copy.deepcopy(messages)
    if tools or rf:
        if not msgs or msgs[0].get("role") != "system":
            msgs.insert(0, {"role": "system", "content": ""})
        if tools: msgs[0]["tools"] = tools
        if rf: msgs[0]["response_format"] = rf
    return msgs

def variants(fmt):
    efforts = [None, "high", "max"] if fmt == "v4" else [None, "low", "max", 1, 42, 100]
    out = []
    convs = dict(CONVS); convs.update(V4_ONLY if fmt == "v4" else V41_ONLY)
    for name, msgs in convs.items():
        for mode in ["chat", "thinking"]:
            out.append((name, msgs, mode, None, None, None))
        uses_tools = any(m.get("tool_calls") for m in msgs)
        if uses_tools:
            out.append((name + "+tools", msgs, "thinking", None, [W, S, C], None))
            out.append((name + "+tools", msgs, "chat", None, [W, S, C], None))
    for e in efforts:
        out.append(("multi_turn", CONVS["multi_turn"], "thinking", e, None, None))
        out.append(("single_user", CONVS["single_user"], "chat", e, None, None))
    out.append(("system_user+response_format", CONVS["system_user"], "chat", None, None, RF))
    out.append(("single_user+response_format", CONVS["single_user"], "thinking", None, None, RF))
    out.append(("single_user+tools+response_format", CONVS["single_user"], "thinking", "max", [W], RF))
    out.append(("unicode+tools", CONVS["unicode"], "chat", None, [C], None))
    return out

def main(out_dir):
    for fmt, mod in [("v4", v4), ("v41", v41)]:
        cases = []
        for name, msgs, mode, effort, tools, rf in variants(fmt):
            full = attach(msgs, tools, rf)
            try:
                prompt = mod.encode_messages(full, thinking_mode=mode, reasoning_effort=effort)
            except Exception as e:
                print("skip", fmt, name, mode, effort, type(e).__name__, e); continue
            req = {"messages": msgs, "thinking_mode": mode}
            if effort is not None: req["reasoning_effort"] = effort
            if tools: req["tools"] = tools
            if rf: req["response_format"] = rf
            cases.append({"name": name, "request": req, "prompt": prompt})
        # Requests the official encoder rejects (our renderer must reject them too).
        bad = []
        for msgs, mode, effort in [([{"role": "user", "content": "x"}], "thinking", "extreme"),
                                   ([{"role": "wizard", "content": "x"}], "chat", None),
                                   ([{"role": "user", "content": "x"}], "chat", 0 if fmt == "v41" else "ultra"),
                                   ([{"role": "user", "content": "x", "task": "nope"}], "chat", None)] + (
                                   [([{"role": "user", "content": "look <｜deepseek_image｜>"}], "chat", None),
                                    ([{"role": "developer", "content": "d"}], "chat", None)] if fmt == "v41" else
                                   [([{"role": "developer", "content": ""}], "chat", None)]):
            try:
                mod.encode_messages(attach(msgs, None, None), thinking_mode=mode, reasoning_effort=effort)
                print("unexpectedly accepted", fmt, msgs)
            except Exception as e:
                req = {"messages": msgs, "thinking_mode": mode}
                if effort is not None: req["reasoning_effort"] = effort
                bad.append({"request": req, "official_error": f"{type(e).__name__}: {e}"})
        json.dump({"format": fmt, "cases": cases, "rejected": bad}, open(f"{out_dir}/prompts_{fmt}.json", "w"), ensure_ascii=False, indent=1)
        print(fmt, len(cases), "prompt cases,", len(bad), "rejected")

        # Parser vectors: completions rendered by the official encoder from assistant messages,
        # plus malformed ones.
        comps = []
        names = mod.tool_calls_block_name if hasattr(mod, "tool_calls_block_name") else "tool_calls"
        d = "｜DSML｜"
        inv = " invoke" if fmt == "v41" else "invoke"
        par = " parameter" if fmt == "v41" else "parameter"
        asst = [
          {"role": "assistant", "content": "The answer is 4.", "reasoning_content": "2+2=4, simple."},
          {"role": "assistant", "content": "", "reasoning_content": "Need tools.", "tool_calls": [tc("1", "get_weather", "{\"city\": \"北京\", \"days\": 3}")]},
          {"role": "assistant", "content": "Checking both.", "reasoning_content": "Two calls <in> \"parallel\".", "tool_calls": [
             tc("1", "get_weather", "{\"city\": \"Paris\", \"unit\": \"celsius\"}"),
             tc("2", "search", "{\"query\": \"line1\\nline2 \\\"q\\\" </tag>\", \"top_k\": 2.5, \"filters\": {\"a\": [1, true, null]}}")]},
          {"role": "assistant", "content": "Multi\nline\n\ncontent with ``` code ```\n", "reasoning_content": "Line 1\n\nLine 2 \n"},
          {"role": "assistant", "content": "", "reasoning_content": "", "tool_calls": [tc("1", "run_code", "{}")]},
          {"role": "assistant", "content": "emoji 👍🏽 and 中文 < > & ｜", "reasoning_content": "думать"},
        ]
        for a in asst:
            for mode in ["thinking", "chat"]:
                text = mod.render_message(1, [{"role": "user", "content": "u"}, a], thinking_mode=mode, drop_thinking=False)
                comps.append((text, mode))
        tcb = f"\n\n<{d}{names}>\n<{d}{inv} name=\"f\">\n<{d}{par} name=\"x\" string=\"true\">1</{d}{par}>\n</{d}{inv}>\n</{d}{names}>"
        malformed = [
          ("no think end<｜end▁of▁sentence｜>", "thinking"),
          ("r</think>no eos at end", "thinking"),
          ("r</think>c<｜end▁of▁sentence｜>trailing", "thinking"),
          ("c<think>inner</think>x<｜end▁of▁sentence｜>", "chat"),
          ("r</think>" + tcb.replace("string=\"true\"", "string=\"maybe\"") + "<｜end▁of▁sentence｜>", "thinking"),
          ("r</think>" + tcb.replace("name=\"f\">\n", "name=\"f\"> \n") + "<｜end▁of▁sentence｜>", "thinking"),
          ("r</think>" + tcb + "extra<｜end▁of▁sentence｜>", "thinking"),
          ("r</think>" + tcb.replace(f"</{d}{inv}>", f"<{d}{par} name=\"x\" string=\"false\">2</{d}{par}>\n</{d}{inv}>") + "<｜end▁of▁sentence｜>", "thinking"),
          ("r</think>" + tcb[:len(tcb)//2], "thinking"),
          ("c" + tcb + "<｜end▁of▁sentence｜>", "chat"),
          ("c with ｜DSML｜ inside<｜end▁of▁sentence｜>", "chat"),
          ("r</think>" + tcb.replace(">1<", ">not json {<").replace("string=\"true\"", "string=\"false\"") + "<｜end▁of▁sentence｜>", "thinking"),
        ]
        comps += malformed
        pcases = []
        for text, mode in comps:
            try:
                r = mod.parse_message_from_completion_text(text, thinking_mode=mode)
                pcases.append({"text": text, "thinking_mode": mode, "expected": {k: r[k] for k in ("content", "reasoning_content", "tool_calls")}})
            except Exception as e:
                pcases.append({"text": text, "thinking_mode": mode, "official_error": f"{type(e).__name__}: {e}"})
        json.dump({"format": fmt, "cases": pcases}, open(f"{out_dir}/parser_{fmt}.json", "w"), ensure_ascii=False, indent=1)
        print(fmt, len(pcases), "parser cases,", sum("official_error" in c for c in pcases), "rejected")

main(sys.argv[1])
