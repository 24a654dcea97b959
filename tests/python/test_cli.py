"""The command line (issue 24): every command and subcommand answers --help with exit 0 and lists
every option it declares with its default; an unknown option, a malformed value, a missing value
and a missing required option exit 2 with a message naming the option. What each command
declares comes from the binary itself (`deepinfer-lab --options-json`, the same CLI11 tree that
parses), so the test follows the commands as they change."""
import json
import os
import pty
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = os.environ.get("DIL_BIN", str(ROOT / "build" / "deepinfer-lab"))
TINY = ROOT / "models" / "tiny-v4"


def run(*args, timeout=120):
    return subprocess.run([BIN, *args], capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def declared():
    r = run("--options-json")
    assert r.returncode == 0, r.stderr
    return {c["command"]: c for c in json.loads(r.stdout)}


COMMANDS = declared()
LEAVES = [name for name, c in COMMANDS.items() if c["subcommands"] == 0]


def argv(command):
    return command.split() if command else []


def help_lines(command):
    """--help of `command` -> {option names as printed ("-h,--help"): its line}."""
    r = run(*argv(command), "--help")
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""
    lines = {}
    for line in r.stdout.splitlines():
        if line.startswith("  -"):
            lines[line.split()[0]] = line
    return r.stdout, lines


def test_every_command_is_declared():
    assert set(COMMANDS) == {"", "inspect", "logits", "generate", "kv-report", "bench", "bench prefill",
                             "bench decode", "bench ceilings", "tokenize", "render", "serve", "kernels-doc", "quality",
                             "trace"}


@pytest.mark.parametrize("command", list(COMMANDS))
def test_help_lists_every_option_with_its_default(command):
    text, lines = help_lines(command)
    opts = COMMANDS[command]["options"]
    assert set(lines) == {",".join(o["names"]) for o in opts}, text
    for o in opts:
        line = lines[",".join(o["names"])]
        if o["flag"] and o["default"] == "":  # an action, not a setting
            assert o["names"][-1] in ("--help", "--options-json"), o
            continue
        if o["required"]:
            assert "(required" in line, line
        elif o["flag"]:
            assert o["default"] in ("on", "off"), o
            assert line.endswith(f"(default: {o['default']})"), line
        else:
            assert line.endswith(f"(default: {o['default'] or 'none'})"), line
    # A group lists its subcommands.
    for sub in (n for n in COMMANDS if n != command and n.startswith(command) and len(argv(n)) == len(argv(command)) + 1):
        assert re.search(rf"^  {argv(sub)[-1]}\s", text, re.M), (sub, text)


@pytest.mark.parametrize("command", list(COMMANDS))
def test_unknown_option_exits_2_naming_it(command):
    r = run(*argv(command), "--no-such-option", "3")
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "unknown option --no-such-option" in r.stderr, r.stderr
    assert r.stdout == ""


def value_options():
    for command in LEAVES:
        for o in COMMANDS[command]["options"]:
            if not o["flag"]:
                yield command, o


@pytest.mark.parametrize("command,opt", [(c, o["names"][-1]) for c, o in value_options()])
def test_missing_value_exits_2_naming_the_option(command, opt):
    r = run(*argv(command), opt)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert opt in r.stderr, r.stderr


@pytest.mark.parametrize("command,opt", [(c, o["names"][-1]) for c, o in value_options() if o["type"] != "TEXT"])
def test_malformed_value_exits_2_naming_the_option(command, opt):
    # Every typed or checked option (numbers, ranges, choices, the numerics mode, the device)
    # rejects a word while parsing.
    r = run(*argv(command), opt, "bogus-value")
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert opt in r.stderr, r.stderr


@pytest.mark.parametrize("command", [c for c in LEAVES if any(o["required"] for o in COMMANDS[c]["options"])])
def test_missing_required_option_exits_2_naming_it(command):
    r = run(*argv(command))
    assert r.returncode == 2, (r.stdout, r.stderr)
    first = next(o for o in COMMANDS[command]["options"] if o["required"])
    assert first["names"][-1] in r.stderr and "required" in r.stderr, r.stderr


@pytest.mark.parametrize("command", ["", "bench"])
def test_a_group_without_its_subcommand_exits_2(command):
    r = run(*argv(command))
    assert r.returncode == 2 and "required" in r.stderr, r.stderr


def test_numerics_is_one_option_everywhere():
    kinds = set()
    for command in ("logits", "generate", "bench prefill", "bench decode", "serve"):
        opts = {n: o for o in COMMANDS[command]["options"] for n in o["names"]}
        kinds.add((opts["--numerics"]["type"], opts["--numerics"]["default"]))
    (modes, default), = kinds  # the same modes and default in every command
    # The default follows the device: fast (production) on cuda, official (the oracle) on cpu.
    assert set(modes.split("|")) == {"reference", "official", "fast"}, kinds
    assert default == "fast on --device cuda, official on cpu", kinds
    for command, c in COMMANDS.items():
        assert not any("--mode" in o["names"] for o in c["options"]), command
    r = run("logits", "--model", "x", "--ids", "1", "--out", "x.npy", "--numerics", "turbo")
    assert r.returncode == 2 and "--numerics" in r.stderr and "unknown numerics mode 'turbo'" in r.stderr, r.stderr


def test_serve_lists_the_engine_options():
    opts = {n: o for o in COMMANDS["serve"]["options"] for n in o["names"]}
    for name in ("--kv-memory-mb", "--max-num-batched-tokens", "--max-num-seqs", "--max-model-len", "--dp",
                 "--ep", "--nnodes", "--node-rank", "--master-addr", "--master-port", "--dist-timeout",
                 "--shutdown-timeout", "--access-log"):
        assert name in opts, name
    assert "--nproc" not in opts  # serve's ranks come from --dp
    assert opts["--max-num-seqs"]["default"] == "256"
    assert opts["--kv-memory-mb"]["default"] == "auto, from --gpu-memory-utilization"
    assert opts["--gpu-memory-utilization"]["default"] == "0.9"
    r = run("serve", "--gpu-memory-utilization", "1.5")
    assert r.returncode == 2 and "--gpu-memory-utilization" in r.stderr, r.stderr
    r = run("serve", "--gpu-memory-utilization", "0.9", "--enable-prefix-caching=true", "--kv-cache-dtype", "fp8")
    assert r.returncode == 2
    assert "unknown option --enable-prefix-caching=true --kv-cache-dtype (and arguments: fp8)" in r.stderr, r.stderr


def test_launch_options_parse_on_every_multi_rank_command():
    # The launcher re-executes the same argv per rank: the same flags must parse. A bad world
    # is a run-time error (exit 1) naming the flag, after parsing succeeded.
    for command in ("logits", "generate", "bench prefill", "bench decode"):
        names = {n for o in COMMANDS[command]["options"] for n in o["names"]}
        assert {"--nproc", "--nnodes", "--node-rank", "--master-addr", "--master-port", "--dist-timeout"} <= names
    r = run("generate", "--model", str(ROOT / "tests/data/v4-tiny"), "--prompt-ids", "1,2", "--nproc", "2",
            "--nnodes", "2", "--node-rank", "5", "--master-addr", "127.0.0.1", "--dist-timeout", "2.5")
    assert r.returncode == 1 and "node-rank" in r.stderr, r.stderr


# generate --prompt / --chat: the same ids as tokenizing / rendering the text first.

def _lines(stdout):
    return [json.loads(l) for l in stdout.splitlines()]


def _ids_of(args, lines):
    r = subprocess.run([BIN, *args], input="".join(json.dumps(l) + "\n" for l in lines), capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return [json.loads(l)["ids"] for l in r.stdout.splitlines()]


def _decode(ids):
    r = subprocess.run([BIN, "tokenize", "--tokenizer", str(TINY / "tokenizer.json"), "--decode", "--skip-special"],
                       input=json.dumps({"ids": ids}) + "\n", capture_output=True, text=True, timeout=60)
    return json.loads(r.stdout)["text"]


def _generate(*args):
    r = run("generate", "--model", str(TINY), "--max-tokens", "6", *args)
    assert r.returncode == 0, r.stderr
    (line,) = _lines(r.stdout)
    return line


TEXT = "The quick brown fox"


def test_generate_prompt_text_equals_its_ids():
    bos = json.load(open(TINY / "config.json"))["bos_token_id"]
    (ids,) = _ids_of(["tokenize", "--tokenizer", str(TINY / "tokenizer.json")], [{"text": TEXT}])
    by_text = _generate("--prompt", TEXT, "--print-ids")
    by_ids = _generate("--prompt-ids", ",".join(map(str, [bos] + ids)))
    assert len(by_text["ids"]) == 6
    assert by_text == by_ids
    assert by_text["text"] == _decode(by_text["ids"])
    assert "ids" not in _generate("--prompt", TEXT)  # ids with --print-ids only


@pytest.mark.parametrize("mode", ["chat", "thinking"])
def test_generate_chat_renders_one_user_message(mode):
    msgs = [{"role": "user", "content": TEXT}]
    (ids,) = _ids_of(["render", "--model", str(TINY), "--ids"], [{"messages": msgs, "thinking_mode": mode}])
    flags = ["--chat"] + (["--thinking"] if mode == "thinking" else [])
    by_chat = _generate("--prompt", TEXT, "--print-ids", *flags)
    assert by_chat == _generate("--prompt-ids", ",".join(map(str, ids)))
    assert by_chat["text"] == _decode(by_chat["ids"])


def test_generate_text_needs_a_tokenizer():
    r = run("generate", "--model", str(ROOT / "tests/data/v4-tiny"), "--prompt", "hi")
    assert r.returncode == 1 and "tokenizer.json" in r.stderr, r.stderr
    r = run("generate", "--model", str(TINY), "--thinking", "--prompt", "hi")
    assert r.returncode == 2 and "--thinking requires --chat" in r.stderr, r.stderr


# Load progress: stderr only; periodic lines in logs, a live line on a terminal; the final line.

LOADED = re.compile(r"^loaded: weights [\d.]+ [kMG]?B \((\d+) tensors\) in [\d.]+ s \([\d.-]+ GB/s\); "
                    r"plan: cpu backend, reference numerics; kernels: the reference of every op$", re.M)


def test_load_progress_in_logs():
    r = run("generate", "--model", str(ROOT / "tests/data/v4-tiny"), "--prompt-ids", "1,2,3", "--max-tokens", "2",
            "--numerics", "reference")
    assert r.returncode == 0, r.stderr
    assert "loading" not in r.stdout and "loaded" not in r.stdout
    start = re.search(r"^loading: (\d+) tensors, [\d.]+ [kMG]?B$", r.stderr, re.M)
    done = LOADED.search(r.stderr)
    assert start and done, r.stderr
    assert start.group(1) == done.group(1) and int(done.group(1)) > 100
    assert "\r" not in r.stderr


def test_load_progress_on_a_terminal_is_one_live_line():
    # stderr on a pseudo-terminal: the progress line is rewritten in place, then replaced by
    # the final line.
    master, slave = pty.openpty()
    p = subprocess.Popen([BIN, "generate", "--model", str(ROOT / "tests/data/v4-tiny"), "--prompt-ids", "1,2,3",
                          "--max-tokens", "2", "--numerics", "reference"], stdout=subprocess.PIPE, stderr=slave,
                         stdin=subprocess.DEVNULL)
    os.close(slave)
    err = b""
    while True:
        try:
            chunk = os.read(master, 4096)
        except OSError:
            break
        if not chunk:
            break
        err += chunk
    out = p.stdout.read()
    assert p.wait(timeout=60) == 0
    os.close(master)
    text = err.decode()
    assert re.search(r"\rloading: 0/(\d+) tensors", text), text
    assert "\r\x1b[K" in text
    assert LOADED.search(text.replace("\r\n", "\n").split("\x1b[K")[-1]), text
    assert b"loading" not in out


def test_serve_final_load_line_has_the_kv_capacity():
    from server_harness import ServerProcess
    s = ServerProcess("--max-model-len", "1024", "--max-num-seqs", "8")
    try:
        log = s.read_log()
    finally:
        s.stop()
    m = re.search(r"^loaded: weights [\d.]+ MB \(\d+ tensors\) .*; KV cache (\d+) tokens \((\d+) blocks of 128\), "
                  r"(\d+) sequences of 1024 tokens \(8 state slots\), [\d.]+ MiB \[min\(0.9 x [\d.]+ [GM]iB available, "
                  r"[\d.]+ MiB for max_num_seqs sequences of max_model_len\)\]; prefix cache: 16 more slots for snapshots; "
                  r"plan: cpu backend, official numerics; kernels: the reference of every op$",
                  log, re.M)
    assert m, log
    tokens, blocks, seqs = map(int, m.groups())
    # The CPU's automatic pool: what the limits can use (8 sequences of 8 blocks and the
    # copy-on-write block), far below 0.9 of any machine's available memory.
    assert tokens == blocks * 128 and blocks == 8 * 8 + 1
    assert seqs == 8


def test_serve_dummy_weights_on_a_layer_subset():
    # Serving at real dimensions for timing (issue 25's TPOT through the server): random weights
    # in the official formats from config.json, only the listed backbone layers built and run.
    import httpx
    from server_harness import ServerProcess
    tensors = {}
    for flags in ((), ("--load-format", "dummy", "--layers", "0,2")):
        s = ServerProcess("--max-model-len", "256", "--max-num-seqs", "4", *flags)
        try:
            r = httpx.post(s.base + "/v1/completions", timeout=60,
                           json={"model": "tiny-v4", "prompt": "hello world", "max_tokens": 4, "ignore_eos": True})
            assert r.status_code == 200, r.text
            assert r.json()["usage"]["completion_tokens"] == 4
            tensors[flags] = int(re.search(r"^loaded: weights [\d.]+ [kMG]?B \((\d+) tensors\)", s.read_log(),
                                           re.M).group(1))
        finally:
            s.stop()
    full, subset = tensors.values()
    assert 0 < subset < full, tensors  # 2 of the 5 layers (and the embedding, head, mHC head)
    r = run("serve", "--load-format", "dummy", "--layers", "0,9")
    assert r.returncode != 0 and "layer 9 outside [0, 5)" in r.stderr, r.stderr
    r = run("serve", "--layers", "x,1")
    assert r.returncode != 0 and "--layers 'x,1'" in r.stderr, r.stderr
    r = run("serve", "--load-format", "gguf")
    assert r.returncode == 2 and "--load-format" in r.stderr, r.stderr
