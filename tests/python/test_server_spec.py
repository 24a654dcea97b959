"""Speculative decoding through the HTTP API (issue 27), on the bundled tiny-v4 model:
`--speculative ngram` gives the same completions, logprobs included, as no speculation (greedy
and seeded sampling), and /metrics carries vLLM's spec_decode counters with the mean acceptance
length; an unknown method is refused at start."""
import os
import subprocess

import httpx

from server_harness import DEFAULT_BIN, ServerProcess, require_serve

MODEL = "tiny-v4"
# Repetitive prompts: the prompt-lookup drafter finds what followed the last tokens before.
PROMPTS = [[7 + (p % 9) * 31 for p in range(60)], [400 + (p % 5) for p in range(41)], list(range(3, 40)) * 2]


def run(flags):
    s = ServerProcess("--max-model-len", "512", *flags)
    try:
        out = []
        with httpx.Client(base_url=s.base, timeout=120) as c:
            for i, p in enumerate(PROMPTS):
                for temp, seed in ((0, None), (0.8, 100 + i)):
                    body = {"model": MODEL, "prompt": p, "max_tokens": 24, "temperature": temp, "logprobs": 3,
                            "ignore_eos": True}
                    if seed is not None:
                        body["seed"] = seed
                    r = c.post("/v1/completions", json=body)
                    assert r.status_code == 200, r.text
                    ch = r.json()["choices"][0]
                    out.append((ch["text"], ch["logprobs"]["token_logprobs"], ch["logprobs"]["top_logprobs"]))
        return out, s.metrics()
    finally:
        s.stop()


def test_ngram_speculation_gives_the_same_completions_and_counts_drafts():
    want, m0 = run([])
    got, m = run(["--speculative", "ngram", "--num-speculative-tokens", "4"])
    assert got == want
    assert m0["vllm:spec_decode_num_drafts_total"] == 0
    drafts = m["vllm:spec_decode_num_drafts_total"]
    draft_tokens = m["vllm:spec_decode_num_draft_tokens_total"]
    accepted = m["vllm:spec_decode_num_accepted_tokens_total"]
    assert drafts > 0 and 0 <= accepted <= draft_tokens <= 4 * drafts
    assert abs(m["dil:spec_decode_mean_acceptance_length"] - (1 + accepted / drafts)) < 1e-9


def serve_refused(method):
    """stderr of `serve --speculative METHOD`, which must exit with an error at start."""
    require_serve()
    binary = os.environ.get("DIL_BIN", DEFAULT_BIN)
    r = subprocess.run([binary, "serve", "--speculative", method, "--port", "0"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode != 0
    return r.stderr


def test_unknown_method_is_refused():
    assert "--speculative" in serve_refused("eagle")


def test_mtp_without_the_mtp_layer_is_refused():
    # The bundled tiny-v4 has no mtp.0 (num_nextn_predict_layers 0): a clear error at start, not a
    # server without its drafter. (The MTP drafter itself: test_runtime SpecDecode.Mtp*.)
    err = serve_refused("mtp")
    assert "MTP layer" in err, err
