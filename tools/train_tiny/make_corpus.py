# Builds the training and held-out texts of the trained tiny fixtures from the King James
# Version of the Bible (public domain) as Debian's `bible-kjv` package ships it:
#
#   apt-get install bible-kjv          # or: apt-get download bible-kjv bible-kjv-text; dpkg -x each into DIR
#   python3 make_corpus.py OUTDIR [--bible /usr/bin/bible] [--data-path /usr/lib]
#
# OUTDIR gets train.txt (about 4.3 MB) and heldout.txt (the books below, about 43 KB: the
# committed tests/data/v4[1]-trained/heldout.txt). One paragraph per chapter (its verses joined
# by spaces, no verse numbers), chapters separated by a blank line, in canonical book order.
import argparse
import os
import re
import subprocess

# Whole books kept out of training: two narratives and two letters.
HELDOUT_BOOKS = ("Ruth", "Jonah", "Phi", "Jas")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--bible", default="/usr/bin/bible")
    ap.add_argument("--data-path", default=None, help="folder holding bible.data (default: the program's own)")
    a = ap.parse_args()
    cmd = [a.bible] + (["-p", a.data_path] if a.data_path else []) + ["-f", "gen1:1-rev22:21"]
    raw = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    chapters = {}  # (book, chapter) -> [verse text], in order of appearance
    for line in raw.splitlines():
        m = re.match(r"^(\d?[A-Za-z]+)(\d+):(\d+) (.*)$", line)
        if not m:
            raise SystemExit(f"unexpected line: {line!r}")
        chapters.setdefault((m.group(1), int(m.group(2))), []).append(m.group(4).strip())
    assert sum(len(v) for v in chapters.values()) == 31102, "the KJV has 31102 verses"
    train, held = [], []
    for (book, _), verses in chapters.items():
        (held if book in HELDOUT_BOOKS else train).append(" ".join(verses))
    os.makedirs(a.out, exist_ok=True)
    for name, paras in (("train.txt", train), ("heldout.txt", held)):
        with open(os.path.join(a.out, name), "w", encoding="utf-8") as f:
            f.write("\n\n".join(paras) + "\n")
        print(f"{name}: {len(paras)} chapters, {sum(len(p) + 2 for p in paras)} bytes")


if __name__ == "__main__":
    main()
