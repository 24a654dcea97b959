#!/usr/bin/env python3
"""Builds models/tiny-v4/tokenizer.json: a real byte-level BPE whose 1024 ids fit the v4-tiny
checkpoint (vocab_size 1024), shaped like DeepSeek's tokenizer so every code path that reads
the real one (pre-tokenizer splits, ByteLevel decoder, added tokens, chat special tokens) runs
unchanged on the bundled model.

How: take DeepSeek-V3's tokenizer.json (same BPE base as V4), decode each vocabulary entry to
text (entries that are not whole UTF-8 are skipped), weight earlier (more frequent) entries
higher, and train a 1024-id byte-level BPE on that text with HF `tokenizers`, using DeepSeek's
normalizer, pre-tokenizer, post-processor and decoder verbatim. BOS/EOS/PAD take ids 0/1/2 as
in DeepSeek's file; the V4/V4.1 chat special tokens take the top ids, as DeepSeek places its
added tokens after the BPE vocabulary.

Usage: python tools/make_tiny_tokenizer.py [--src DIR_WITH_V3_TOKENIZER_JSON] [--out FILE]
Deterministic: running it again writes the same bytes.
"""
import argparse
import json
import os
import sys

from tokenizers import Tokenizer, pre_tokenizers, trainers

VOCAB = 1024
HEAD_SPECIALS = ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜▁pad▁｜>"]  # ids 0, 1, 2
# The tokens V4 (encoding_dsv4.py) and V4.1 (encoding.py) encoders and parsers emit or expect.
TAIL_SPECIALS = [
    "<｜User｜>", "<｜Assistant｜>", "<|EOT|>", "<think>", "</think>",
    "<｜DSML｜tool_calls>", "</｜DSML｜tool_calls>", "｜DSML｜", "<｜latest_reminder｜>",
    "<｜System｜>", "<｜action｜>", "<｜query｜>", "<｜authority｜>", "<｜domain｜>",
    "<｜title｜>", "<｜read_url｜>",
]


def byte_decoder():
    # GPT-2's byte <-> printable-unicode table, as HF's ByteLevel uses it.
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def corpus(v3):
    dec = byte_decoder()
    vocab = sorted(v3["model"]["vocab"].items(), key=lambda kv: kv[1])
    for tok, rank in vocab:
        try:
            text = bytes(dec[ch] for ch in tok).decode("utf-8")
        except (KeyError, UnicodeDecodeError):
            continue  # a partial UTF-8 piece: not text on its own
        # Earlier merges are more frequent pieces of real text: repeat them more.
        for _ in range(1 + (rank < 4000) * 3 + (rank < 20000)):
            yield text


def build(src_dir):
    with open(os.path.join(src_dir, "tokenizer.json"), encoding="utf-8") as f:
        v3 = json.load(f)
    tok = Tokenizer.from_str(json.dumps({
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": [],
        "normalizer": v3["normalizer"], "pre_tokenizer": v3["pre_tokenizer"],
        "post_processor": v3["post_processor"], "decoder": v3["decoder"],
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False, "vocab": {}, "merges": []},
    }))
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB - len(TAIL_SPECIALS), min_frequency=2, show_progress=False,
        special_tokens=HEAD_SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus(v3), trainer=trainer)
    tok.add_special_tokens(TAIL_SPECIALS)
    out = json.loads(tok.to_str())
    # DeepSeek's own file: the decoder, pre-tokenizer etc. exactly as shipped (training may
    # normalise their JSON form), and the added tokens' flags as in DeepSeek's table.
    for key in ("normalizer", "pre_tokenizer", "post_processor", "decoder"):
        out[key] = v3[key]
    for a in out["added_tokens"]:
        a.update(single_word=False, lstrip=False, rstrip=False, normalized=False, special=True)
    # The trainer also writes the head specials into the BPE vocab (same ids), so use a set.
    ids = {a["id"] for a in out["added_tokens"]} | set(out["model"]["vocab"].values())
    if sorted(ids) != list(range(VOCAB)):
        sys.exit(f"expected ids 0..{VOCAB - 1} exactly once, got {len(set(ids))} ids, max {max(ids)}")
    want = {t: i for i, t in enumerate(HEAD_SPECIALS)}
    want.update({t: VOCAB - len(TAIL_SPECIALS) + i for i, t in enumerate(TAIL_SPECIALS)})
    got = {a["content"]: a["id"] for a in out["added_tokens"]}
    if got != want:
        sys.exit(f"special ids differ from the plan: {got}")
    return out


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--src", default="/work/shared/fixtures/deepseek-v3-tokenizer")
    p.add_argument("--out", default=os.path.join(here, "..", "models", "tiny-v4", "tokenizer.json"))
    a = p.parse_args()
    out = build(a.src)
    with open(a.out, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")
    # Round trip through HF tokenizers as a sanity check of the written file.
    t = Tokenizer.from_file(a.out)
    s = "<｜User｜>Hello, 世界! 123 <think>x</think>"
    ids = t.encode(s, add_special_tokens=False).ids
    assert t.decode(ids, skip_special_tokens=False) == s, "round trip failed"
    assert max(ids) < VOCAB
    print(f"wrote {a.out}: {t.get_vocab_size()} ids; '{s}' -> {ids}")


if __name__ == "__main__":
    main()
