"""The HTTP mutation fuzz (bench/http_fuzz.py), briefly: 2,000 requests generated from the
OpenAI request shapes and mutated at the JSON, byte and framing levels. Only 2xx/4xx answers
(501/505 where the request asked for an unsupported coding or version), and the server is
healthy with no request state left. docs/performance.md has the 100,000-request run."""
import os
import sys

from server_harness import ServerProcess

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
import http_fuzz  # noqa: E402


def test_mutation_fuzz_2000_requests():
    s = ServerProcess("--max-model-len", "64")
    try:
        stats, health, m = http_fuzz.run(s.port, 2000, seed=20261201, threads=8)
        assert not stats.bad, stats.bad[:5]
        assert health == 200 and s.alive()
        assert sum(v for k, v in stats.status.items() if 200 <= k < 300) >= 200
        assert sum(v for k, v in stats.status.items() if 400 <= k < 500) >= 1000
        assert m["vllm:num_requests_running"] == 0 and m["dil:requests_in_flight"] == 0
        assert m["dil:kv_blocks_used"] == 0
    finally:
        s.stop()
