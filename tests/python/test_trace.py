"""`deepinfer-lab trace` end to end on the CPU (issue 16): its exit status gates scripts, so it
must be 0 when every op is within its bound and 1, naming the op, when one is not; its JSON
carries every check. The tool's logic (teacher forcing, the mode-pair rule, the bounds) is tested
in tests/trace/test_trace.cpp; here only the command around it."""
import json
import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BIN = os.environ.get("DIL_BIN", str(ROOT / "build" / "deepinfer-lab"))
TINY = str(ROOT / "tests" / "data" / "v4-tiny")


def trace(*args, timeout=300):
    return subprocess.run([BIN, "trace", "--model", TINY, "--tokens", "9", "--decode-steps", "1", *args],
                          capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def test_same_mode_is_exact_and_exits_0(tmp_path):
    out = tmp_path / "t.json"
    r = trace("--a", "cpu:official", "--b", "cpu:official", "--json", str(out))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr
    assert "every op within its tolerance" in r.stdout
    rep = json.loads(out.read_text())
    assert rep["a"] == rep["b"] == "cpu:official" and rep["over"] == 0 and rep["first_over"] is None
    assert rep["layers"] == [0, 1, 2, 3, 4] and len(rep["steps"]) == 2
    assert rep["checks"] and all(c["exact"] and c["gate"] != "mode" for c in rep["checks"])
    # One line per step and layer, the embedding and the head included.
    lines = [l for l in r.stdout.splitlines() if l.startswith("step ")]
    assert len(lines) == 2 * 7, r.stdout
    assert [l.split()[2] for l in lines[:7]] == ["embed", "layer", "layer", "layer", "layer", "layer", "head"]


def test_a_perturbed_op_exits_1_naming_it(tmp_path):
    out = tmp_path / "t.json"
    r = trace("--a", "cpu:official", "--b", "cpu:official", "--perturb", "hc_post:4", "--rows", "over",
              "--json", str(out))
    assert r.returncode == 1, r.stdout[-2000:] + r.stderr
    first = next(l for l in r.stdout.splitlines() if l.startswith("first op over its tolerance"))
    # hc_post is called twice per layer: the 4th call is layer 1's FFN output.
    assert "step 0 layer 1 (SWA)" in first and "hc_post out" in first, first
    rep = json.loads(out.read_text())
    assert rep["over"] == 1 and rep["first_over"]["op"] == "hc_post" and rep["first_over"]["layer"] == 1


def test_a_mode_pair_reports_the_mode_differences():
    r = trace("--a", "cpu:official", "--b", "cpu:fast", "--rows", "all")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr
    assert "different numerics modes" in r.stdout
    rows = [l for l in r.stdout.splitlines() if l.rstrip().endswith(" mode")]
    assert rows, r.stdout[-3000:]
    assert "mode differences (not gated)" in r.stdout


def test_reference_against_official_is_a_usage_error():
    r = trace("--a", "cpu:reference", "--b", "cpu:official")
    assert r.returncode == 1 and "reference numerics has no quantization points" in r.stderr, r.stderr
