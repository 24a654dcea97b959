"""/tokenize renders exactly the official V4 encoder's prompts (the tokenizer issue's vectors
in tests/data/tokenizer/prompts_v4.json) and returns the ids HF `tokenizers` gives for them
with the served model's tokenizer.json (issue 11)."""
import json
import pathlib

import httpx
import pytest
from tokenizers import Tokenizer

from server_harness import REPO, ServerProcess

DATA = pathlib.Path(REPO) / "tests/data/tokenizer/prompts_v4.json"


@pytest.fixture(scope="module")
def server():
    s = ServerProcess()
    yield s
    s.stop()


def to_body(req):
    body = {"model": "tiny-v4", "messages": req["messages"],
            "chat_template_kwargs": {"thinking": req.get("thinking_mode") == "thinking"}}
    for k in ("tools", "response_format", "reasoning_effort"):
        if req.get(k) is not None:
            body[k] = req[k]
    return body


def test_tokenize_matches_official_v4_prompts(server):
    d = json.loads(DATA.read_text())
    tk = Tokenizer.from_file(str(pathlib.Path(REPO) / "models/tiny-v4/tokenizer.json"))
    bad = []
    with httpx.Client(base_url=server.base, timeout=60) as c:
        for case in d["cases"]:
            r = c.post("/tokenize", json=to_body(case["request"]))
            if r.status_code != 200 or r.json()["prompt"] != case["prompt"]:
                bad.append((case["name"], r.status_code, r.text[:200]))
                continue
            j = r.json()
            assert j["tokens"] == tk.encode(case["prompt"]).ids, case["name"]
            assert j["count"] == len(j["tokens"])
        assert not bad, bad
        for case in d["rejected"]:
            r = c.post("/tokenize", json=to_body(case["request"]))
            assert r.status_code == 400 and r.json()["error"]["message"], (case, r.text)
