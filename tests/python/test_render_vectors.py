"""`deepinfer-lab render` and `render --parse` against DeepSeek's official encoders (issue 11).

The vectors in tests/data/tokenizer/ were produced by the official `encoding_dsv4.py` (V4) and
V4.1 `encoding.py` (see the README there). The format is taken from the fixtures' config.json.
"""
import json
import os
import pathlib
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
BIN = os.environ.get("DIL_BIN", str(ROOT / "build" / "deepinfer-lab"))
DATA = ROOT / "tests/data/tokenizer"
MODEL = {"v4": ROOT / "tests/data/v4-tiny", "v41": ROOT / "tests/data/v41-tiny"}


def _run(args, lines):
    p = subprocess.run([BIN] + args, input="".join(json.dumps(x, ensure_ascii=False) + "\n" for x in lines),
                       capture_output=True, text=True, encoding="utf-8", timeout=300)
    out = [json.loads(line) for line in p.stdout.split("\n") if line]
    assert len(out) == len(lines), p.stderr[-2000:]
    return out


@pytest.mark.parametrize("fmt", ["v4", "v41"])
def test_render_reproduces_official_prompts(fmt):
    d = json.loads((DATA / f"prompts_{fmt}.json").read_text())
    assert len(d["cases"]) >= 40
    # --config selects the format from the model's config.json (V4: deepseek_v4, V4.1: composite).
    out = _run(["render", "--config", str(MODEL[fmt] / "config.json")], [c["request"] for c in d["cases"]])
    bad = [c["name"] for c, o in zip(d["cases"], out) if o.get("prompt") != c["prompt"]]
    assert not bad, bad
    rejected = _run(["render", "--config", str(MODEL[fmt] / "config.json")], [c["request"] for c in d["rejected"]])
    assert all("error" in o and o["error"] for o in rejected), rejected


def test_render_ids_use_the_model_tokenizer():
    d = json.loads((DATA / "prompts_v41.json").read_text())
    from tokenizers import Tokenizer
    tk = Tokenizer.from_file(str(MODEL["v41"] / "tokenizer.json"))
    out = _run(["render", "--model", str(MODEL["v41"]), "--ids"], [c["request"] for c in d["cases"][:10]])
    for c, o in zip(d["cases"], out):
        assert o["prompt"] == c["prompt"] and o["ids"] == tk.encode(c["prompt"]).ids


@pytest.mark.parametrize("fmt", ["v4", "v41"])
def test_parse_matches_official_parser(fmt):
    d = json.loads((DATA / f"parser_{fmt}.json").read_text())
    out = _run(["render", "--config", str(MODEL[fmt] / "config.json"), "--parse"],
               [{"text": c["text"], "thinking_mode": c["thinking_mode"]} for c in d["cases"]])
    n_rejected = 0
    for c, o in zip(d["cases"], out):
        if "official_error" in c:
            n_rejected += 1
            assert "error" in o and o["error"], (c, o)
        else:
            assert o == c["expected"], c["text"]
    assert n_rejected >= 5
