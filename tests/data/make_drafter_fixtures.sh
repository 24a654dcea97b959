#!/usr/bin/env bash
# The tiny fixtures with drafter weights (issue 27), made at test set-up instead of committed:
# their +5.3 MB would push the tracked tree past the 64 MiB the GPU machine copies. Copies
# tests/data/v4-tiny and v41-tiny into OUT and runs tools/add_drafter_weights.py on each with its
# fixed seed (27): deterministic, and the backbone bytes (hence every reference logit) unchanged.
# Usage: tests/data/make_drafter_fixtures.sh SOURCE_DIR OUT   (CTest runs it: test drafter_fixtures)
set -euo pipefail
src=$1
out=$2
# The project's venv (scripts/setup); elsewhere (the GPU machine) any python3 with numpy.
py=$src/.venv/bin/python
[ -x "$py" ] || py=python3
"$py" -c 'import numpy' || { echo "make_drafter_fixtures: $py has no numpy (run scripts/setup)" >&2; exit 1; }
mkdir -p "$out"
for f in v4-tiny v41-tiny; do
  rm -rf "$out/$f.tmp"
  cp -r "$src/tests/data/$f" "$out/$f.tmp"
  "$py" "$src/tools/add_drafter_weights.py" "$out/$f.tmp" --seed 27
  rm -rf "$out/$f"
  mv "$out/$f.tmp" "$out/$f"
done
# A copy of fixture $1 as $2 with every tensor whose name ends in $3 all zeros (FP8 code 0 = +0).
zeroed_copy() {
  rm -rf "$out/$2"
  cp -r "$out/$1" "$out/$2"
  "$py" - "$src/tools/train_tiny" "$out/$2/model.safetensors" "$3" <<'PY'
import json, struct, sys
sys.path.insert(0, sys.argv[1])
import numpy as np
import checkpoint as ck
path, suffix = sys.argv[2], sys.argv[3]
with open(path, "rb") as f:
    meta = json.loads(f.read(struct.unpack("<Q", f.read(8))[0])).get("__metadata__")
t = ck.read_st(path)
names = [k for k in t if k.endswith(suffix)]
assert names, "no tensor named *" + suffix
for k in names:
    dt, w = t[k]
    t[k] = (dt, np.zeros_like(w))
ck.write_st(path, t, meta)
PY
}
# v4-tiny-hzero: the same with mtp.0.h_proj all zeros, so that the MTP block sees only token
# embeddings and its logits are a function of the tokens in its window
# (tests/model/test_v4_mtp.cpp checks the window and the pairing of its ring rows with it).
zeroed_copy v4-tiny v4-tiny-hzero mtp.0.h_proj.weight
# The MTP's float64 numpy reference at position 0 (tests/data/mtp_reference.py), for v4-tiny.
"$py" "$src/tests/data/mtp_reference.py" "$out/v4-tiny" "$src/tools/train_tiny"
# v41-tiny-ezero: v41-tiny with mtp.0..2 and every Engram wkv all zeros, so that Engram adds
# exactly 0 to the streams and a numpy backbone needs no Engram hashing; the DSpark's float64
# numpy reference after position 0 (tests/data/dspark_reference.py) is made for it.
zeroed_copy v41-tiny v41-tiny-ezero .engram.wkv.weight
"$py" "$src/tests/data/dspark_reference.py" "$out/v41-tiny-ezero" "$src/tools/train_tiny"
