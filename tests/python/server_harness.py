"""Starts `deepinfer-lab serve` (DIL_BIN) as a subprocess on a free port for the server tests.

The binary serves the bundled tiny-v4 model on the CPU by default; extra flags (api key,
overload policy, context length) come per test module.
"""
import os
import re
import socket
import subprocess
import time

import httpx

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT_BIN = os.path.join(REPO, "build", "deepinfer-lab")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def require_serve():
    """Skips when the binary has no `serve` command yet (the server lands before the engine)."""
    import pytest
    binary = os.environ.get("DIL_BIN", DEFAULT_BIN)
    if not os.path.exists(binary):
        pytest.skip(f"{binary} not built")
    r = subprocess.run([binary, "serve", "--help"], capture_output=True, text=True, timeout=30)
    if "unknown command" in r.stderr:
        pytest.skip("this build has no `serve` command (no engine linked yet)")


class ServerProcess:
    def __init__(self, *flags, timeout=120):
        require_serve()
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        binary = os.environ.get("DIL_BIN", DEFAULT_BIN)
        self.log_path = f"/tmp/dil-server-{self.port}.log"
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen([binary, "serve", "--port", str(self.port), *flags],
                                     stdout=self.log, stderr=subprocess.STDOUT, cwd=REPO)
        deadline = time.time() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}: {self.read_log()}")
            try:
                if httpx.get(self.base + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.time() > deadline:
                self.stop()
                raise RuntimeError("server did not become healthy: " + self.read_log())
            time.sleep(0.1)

    def read_log(self):
        self.log.flush()
        with open(self.log_path) as f:
            return f.read()[-4000:]

    def alive(self):
        return self.proc.poll() is None

    def metrics(self):
        """Prometheus text -> {name{labels}: value} and {name: value of its first sample}."""
        text = httpx.get(self.base + "/metrics", timeout=10).text
        out = {}
        for line in text.splitlines():
            if not line or line.startswith("#"):
                continue
            key, value = line.rsplit(" ", 1)
            out[key] = float(value)
            out.setdefault(re.sub(r"\{.*\}", "", key), float(value))
        return out

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
