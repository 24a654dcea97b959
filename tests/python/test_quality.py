"""Model-level quality of the numerics modes on the trained tiny fixtures (issue 16):
`deepinfer-lab quality` runs each (fixture, numerics, device) (held-out perplexity over
windows of 512 tokens, greedy continuations of 32 prompts x 64 tokens; the second run of a pair
follows the first one's continuations) and `quality --compare` gates each pair of runs listed in
PAIRS. Adding a mode or a backend is one line in PAIRS.

Runs on a device other than the CPU are skipped unless DIL_QUALITY_DEVICES lists it (on the
GPU machine: DIL_QUALITY_DEVICES=cpu,cuda)."""
import concurrent.futures
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = os.environ.get("DIL_BIN", str(ROOT / "build" / "deepinfer-lab"))
DEVICES = os.environ.get("DIL_QUALITY_DEVICES", "cpu").split(",")

# The CI workload, sized for a 2-core machine: 8 of the 46 held-out windows of 512 (4088
# scored tokens; a window reaches 128 CSA rows of which the indexer picks 16, 4 HCA rows;
# V4.1 256 ratio-2 rows, 512 ratio-1 rows in 64 candidate blocks of which 4 are kept) and 32
# prompts of 128 ids + 64 greedy tokens (up to position 191). 10 K tokens a run: about 40 s
# of CPU time for V4, 75 s for V4.1, 4 runs on 2 cores in about 2 minutes.
WORKLOAD = ["--windows", "8", "--prompts", "32", "--prompt-len", "128", "--gen", "64"]

# (fixture, run A, run B, max |ppl_B / ppl_A - 1|, min greedy agreement). Run B follows A's
# greedy continuations (`quality --follow A.json`): at each of A's 32 x 64 steps B is fed A's
# prefix and we count how often B's argmax is A's token. Free-running continuations part at the
# first near tie and never meet again, which measures chaos, not the numerics: that prefix
# agreement is printed too (reference vs official 0.36, fast vs official 0.25 on V4), not gated.
#
# Measured on this workload (CPU, v4-trained; V4.1 in the test's output):
#   reference vs official: ppl 7.0955 vs 7.0866 (ratio - 1 = +1.26e-3 as B/A with A official);
#     followed greedy agreement 0.963 (1973/2048), teacher-forced top-1 over the windows 0.954.
#   fast vs official: ppl 7.1044 vs 7.0866 (+2.52e-3); followed greedy agreement 0.956
#     (1958/2048), teacher-forced top-1 0.943.
# Perplexity bound 1% (the issue's): official numerics put activations through e4m3 (per 1 x 128
#   / 1 x 32 blocks), fast adds BF16 roundings (2^-9 relative) at the official BF16 points; both
#   cost far less than the weights' own quantization (+1.39% V4, +0.81% V4.1,
#   tools/train_tiny/README.md); measured <= 0.3%, and a wrong scale or a broken round trip moves
#   perplexity by far more (random weights: relative L2 of the logits 0.13-0.3).
# Agreement bound 0.90 (the issue's): a position disagrees only where A's top-2 logits are within
#   the perturbation of each other; measured 4-5% of positions for both perturbations, so 0.90
#   leaves 2x the measured disagreement; a broken path (a wrong kernel, a wrong rounding point)
#   disagrees on most positions (random weights: argmax agreement 0.5-0.7 between modes).
PAIRS = [
    ("v4-trained", ("official", "cpu"), ("reference", "cpu"), 0.01, 0.90),
    ("v41-trained", ("official", "cpu"), ("reference", "cpu"), 0.01, 0.90),
    ("v4-trained", ("official", "cpu"), ("fast", "cpu"), 0.01, 0.90),
    ("v41-trained", ("official", "cpu"), ("fast", "cpu"), 0.01, 0.90),
    ("v4-trained", ("official", "cpu"), ("fast", "cuda"), 0.01, 0.90),
    ("v41-trained", ("official", "cpu"), ("fast", "cuda"), 0.01, 0.90),
]

# Held-out perplexity of the same 8 windows computed by the training code in float64 on the
# dequantized checkpoint (`tools/train_tiny/train.py eval --model tests/data/<f> --windows 8`):
# the engine's reference mode must reproduce it. Bound 1e-4 relative: reference logits are
# within 1e-4 relative L2 of float64 (the fixtures' bound), which moves a mean NLL of ~2 by
# far less; the constants are rounded to 4 decimals (<= 7e-6 relative).
TORCH_F64_PPL = {"v4-trained": 7.0955, "v41-trained": 7.4698}


def _runs_needed():
    """(fixture, numerics, device, followed run or None): the free runs first, then the runs
    that follow one of them."""
    free, following = [], []
    for fixture, a, b, _, _ in PAIRS:
        if a[1] in DEVICES and b[1] in DEVICES:
            if (fixture, *a, None) not in free:
                free.append((fixture, *a, None))
            following.append((fixture, *b, a))
    return free, following


@pytest.fixture(scope="module")
def quality_runs(tmp_path_factory):
    """Every run the pairs need, in parallel on the machine's cores: {(fixture, numerics,
    device): path of its JSON}."""
    out = tmp_path_factory.mktemp("quality")

    def one(key):
        fixture, numerics, device, follow = key
        name = f"{fixture}-{numerics}-{device}" + (f"-following-{follow[0]}-{follow[1]}" if follow else "")
        path = out / f"{name}.json"
        extra = ["--follow", str(done[(fixture, *follow, None)])] if follow else []
        r = subprocess.run([BIN, "quality", "--model", str(ROOT / "tests" / "data" / fixture),
                            "--numerics", numerics, "--device", device, *WORKLOAD, *extra, "--out", str(path)],
                           capture_output=True, text=True, timeout=1200)
        assert r.returncode == 0, f"{key}: {r.stdout}{r.stderr}"
        print(r.stdout, end="")
        return key, path

    free, following = _runs_needed()
    done = {}
    workers = max(1, os.cpu_count() or 1)
    for batch in (free, following):  # a following run reads its free run's greedy tokens
        batch = sorted(batch, key=lambda r: "v41" not in r[0])  # the slower V4.1 runs first
        with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as ex:
            done.update(ex.map(one, batch))
    return done


@pytest.mark.parametrize("fixture,a,b,max_ppl,min_agree", PAIRS,
                         ids=[f"{p[0]}-{p[1][0]}.{p[1][1]}-vs-{p[2][0]}.{p[2][1]}" for p in PAIRS])
def test_quality_pair(quality_runs, fixture, a, b, max_ppl, min_agree):
    if a[1] not in DEVICES or b[1] not in DEVICES:
        pytest.skip(f"device not in DIL_QUALITY_DEVICES={','.join(DEVICES)}")
    r = subprocess.run([BIN, "quality", "--compare", str(quality_runs[(fixture, *a, None)]),
                        str(quality_runs[(fixture, *b, a)]), "--max-ppl-ratio", str(max_ppl),
                        "--min-agreement", str(min_agree)], capture_output=True, text=True, timeout=60)
    print(r.stdout)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("fixture", sorted(TORCH_F64_PPL))
def test_reference_matches_training_code(quality_runs, fixture):
    import json
    # Any reference run: perplexity does not depend on --follow (the windows are scored alone).
    path = next(p for k, p in quality_runs.items() if k[0] == fixture and k[1:3] == ("reference", "cpu"))
    got = json.loads(path.read_text())["ppl"]
    want = TORCH_F64_PPL[fixture]
    print(f"{fixture}: engine reference ppl {got:.6f}, training code float64 {want}")
    assert abs(got / want - 1) <= 1e-4


def test_compare_metrics(tmp_path):
    """The figures `quality --compare` gates on, on two hand-made runs: 2 prompts x 4 tokens,
    prompt 0 equal, prompt 1 diverging at its second token and equal again at its fourth."""
    import json
    base = {"model": "m", "device": "cpu", "window": 512, "windows": 1, "tokens": 600, "prompt_len": 8, "gen": 4,
            "prompt_offsets": [0, 100], "window_nll": [2.0], "window_top1": [3, 4, 5, 6]}
    a = dict(base, numerics="x", ppl=8.0, greedy=[[1, 2, 3, 4], [5, 6, 7, 8]])
    b = dict(base, numerics="y", ppl=8.2, greedy=[[1, 2, 3, 4], [5, 9, 9, 8]], window_top1=[3, 4, 0, 6])
    (tmp_path / "a.json").write_text(json.dumps(a))
    (tmp_path / "b.json").write_text(json.dumps(b))

    def compare(*bounds):
        return subprocess.run([BIN, "quality", "--compare", str(tmp_path / "a.json"), str(tmp_path / "b.json"),
                               *bounds], capture_output=True, text=True, timeout=60)

    r = compare()
    assert r.returncode == 0, r.stderr
    assert "perplexity ratio B/A 1.025000" in r.stdout
    # prefix: 4 + 1 of 8 tokens; positional: 4 + 2 of 8; 1 of 2 prompts diverges.
    assert "prefix 0.6250 (5/8 tokens before the first divergence), positional 0.7500; 1 of 2 prompts diverge" in r.stdout
    assert compare("--max-ppl-ratio", "0.03", "--min-agreement", "0.625").returncode == 0
    assert compare("--max-ppl-ratio", "0.02").returncode == 1
    assert "teacher-forced top-1 agreement over the perplexity windows: 0.7500 (3/4 positions)" in r.stdout
    assert compare("--min-agreement", "0.63").returncode == 1
    # B following A's continuations: B's choice at each of A's steps, 6 of 8 equal.
    (tmp_path / "b.json").write_text(json.dumps(dict(b, followed=a["greedy"])))
    r = compare("--min-agreement", "0.75")
    assert r.returncode == 0, r.stdout
    assert "greedy agreement (B following A's continuations): 0.7500 (6/8 of A's greedy tokens" in r.stdout
    assert compare("--min-agreement", "0.76").returncode == 1
    b["prompt_offsets"] = [0, 101]
    (tmp_path / "b.json").write_text(json.dumps(b))
    r = compare()
    assert r.returncode != 0 and "different workloads" in r.stderr
