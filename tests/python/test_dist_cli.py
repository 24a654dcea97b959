"""The CLI launcher for several ranks (`--nproc`): expert-parallel MoE over the CPU backend's
TCP loopback communicator, against the same commands on one rank (v4-tiny, reference mode)."""
import json
import os
import subprocess
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
MODEL = str(ROOT / "tests" / "data" / "v4-tiny")
BIN = os.environ.get("DIL_BIN", str(ROOT / "build" / "deepinfer-lab"))
PROMPTS = "1,2,3,4,5,6,7,8,9;40,41,42;100,200,300,400,500,600,700,800,900,1000,5,6,7"


def run(*args, timeout=300):
    return subprocess.run([BIN, *args], capture_output=True, text=True, timeout=timeout)


def by_prompt(stdout):
    out = {}
    for line in stdout.splitlines():
        d = json.loads(line)
        out[d["prompt"]] = (d["rank"], d["ids"])
    return out


def test_generate_two_ranks_equals_one():
    one = run("generate", "--model", MODEL, "--numerics", "reference", "--prompt-ids", PROMPTS, "--max-tokens", "6")
    two = run("generate", "--model", MODEL, "--numerics", "reference", "--prompt-ids", PROMPTS, "--max-tokens", "6",
              "--nproc", "2")
    assert one.returncode == 0, one.stderr
    assert two.returncode == 0, two.stderr
    a, b = by_prompt(one.stdout), by_prompt(two.stdout)
    assert sorted(a) == sorted(b) == [0, 1, 2]
    for i in a:
        assert b[i][0] == i % 2  # data parallel: prompt i on rank i % 2
        assert a[i][1] == b[i][1], f"prompt {i}: {a[i][1]} vs {b[i][1]}"


def test_logits_two_ranks_equal_one(tmp_path):
    seqs = "5,6,7,8,9,10,11,12,13,14,15,16,17;900,901"
    r1 = run("logits", "--model", MODEL, "--numerics", "reference", "--ids", seqs, "--decode-from", "2",
             "--out", str(tmp_path / "one.npy"))
    r2 = run("logits", "--model", MODEL, "--numerics", "reference", "--ids", seqs, "--decode-from", "2",
             "--out", str(tmp_path / "two.npy"), "--nproc", "2")
    assert r1.returncode == 0, r1.stderr
    assert r2.returncode == 0, r2.stderr
    for i, n in [(0, 13), (1, 2)]:
        a = np.load(tmp_path / f"one.{i}.npy")
        b = np.load(tmp_path / f"two.{i}.npy")
        assert a.shape == b.shape == (n, 1024)
        # Fixture bounds (max |d| <= 2e-3, relative L2 <= 1e-4 per position).
        assert np.abs(a - b).max() <= 2e-3
        rel = np.linalg.norm(a - b, axis=1) / np.linalg.norm(a, axis=1)
        assert rel.max() <= 1e-4


def test_bad_world_is_a_clear_error():
    r = run("generate", "--model", MODEL, "--prompt-ids", "1,2", "--nproc", "2", "--nnodes", "2", "--node-rank", "5")
    assert r.returncode != 0
    assert "node-rank" in r.stderr
