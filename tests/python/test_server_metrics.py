"""/metrics parses with prometheus_client's own parser, with vLLM's names and types, and its
counters agree with what the API answered; --access-log writes one line per response."""
import json

import httpx
from prometheus_client.parser import text_string_to_metric_families

from server_harness import ServerProcess

NAME = 'we"ird\\name'  # a served name that needs escaping in label values

VLLM_TYPES = {
    "vllm:num_requests_running": "gauge",
    "vllm:num_requests_waiting": "gauge",
    "vllm:kv_cache_usage_perc": "gauge",
    "vllm:prompt_tokens": "counter",          # exposed as vllm:prompt_tokens_total
    "vllm:generation_tokens": "counter",      # vllm:generation_tokens_total
    "vllm:num_preemptions": "counter",        # vllm:num_preemptions_total
    "vllm:request_success": "counter",
    "vllm:time_to_first_token_seconds": "histogram",
    "vllm:inter_token_latency_seconds": "histogram",
    "vllm:e2e_request_latency_seconds": "histogram",
    "vllm:request_prompt_tokens": "histogram",
    "vllm:request_generation_tokens": "histogram",
}


def test_metrics_parse_with_vllm_names_types_and_values():
    s = ServerProcess("--max-model-len", "256", "--served-model-name", NAME, "--access-log")
    try:
        usage = []
        with httpx.Client(base_url=s.base, timeout=60) as c:
            for i in range(3):
                r = c.post("/v1/completions", json={"model": NAME, "prompt": "Hello", "max_tokens": 4 + i,
                                                    "ignore_eos": True})
                assert r.status_code == 200, r.text
                usage.append(r.json()["usage"])
            with c.stream("POST", "/v1/chat/completions",
                          json={"model": NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5,
                                "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}) as r:
                lines = [line for line in r.iter_lines() if line.startswith("data: {")]
            usage.append(json.loads(lines[-1][6:])["usage"])
            assert c.get("/v1/nothing").status_code == 404
            # Engine gauges are published after each step: the last step's may trail its output.
            for _ in range(100):
                text = c.get("/metrics").text
                fams = {f.name: f for f in text_string_to_metric_families(text)}
                if fams["vllm:num_requests_running"].samples[0].value == 0:
                    break
        for name, typ in VLLM_TYPES.items():
            assert name in fams, name
            assert fams[name].type == typ, (name, fams[name].type)

        def value(fam, suffix="", **labels):
            for smp in fams[fam].samples:
                if smp.name == fam + suffix and all(smp.labels.get(k) == v for k, v in labels.items()):
                    return smp.value
            raise KeyError((fam, suffix, labels))

        assert all(smp.labels["model_name"] == NAME for smp in fams["vllm:prompt_tokens"].samples)
        assert value("vllm:prompt_tokens", "_total") == sum(u["prompt_tokens"] for u in usage)
        assert value("vllm:generation_tokens", "_total") == sum(u["completion_tokens"] for u in usage)
        assert value("vllm:time_to_first_token_seconds", "_count") == 4
        assert value("vllm:e2e_request_latency_seconds", "_count") == 4
        assert value("vllm:inter_token_latency_seconds", "_count") == sum(u["completion_tokens"] - 1 for u in usage)
        assert value("vllm:request_success", "_total", finished_reason="length") == 4
        assert value("vllm:num_requests_running") == 0
        assert value("dil:http_responses", "_total", code="404") == 1
        assert value("dil:http_connections_open") >= 1
        assert value("dil:server_draining") == 0
        log = s.read_log()
        assert log.count('"POST /v1/completions HTTP/1.1" 200 ') == 3, log
        assert '"GET /v1/nothing HTTP/1.1" 404 ' in log
    finally:
        s.stop()
