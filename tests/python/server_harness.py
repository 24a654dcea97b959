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


def threads(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("Threads:"):
                return int(line.split()[1])
    raise RuntimeError("no Threads")


def peak_rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    raise RuntimeError("no VmHWM")


class RawResponse:
    def __init__(self, status, headers, body, interim):
        self.status, self.headers, self.body, self.interim = status, headers, body, interim

    def header(self, name):
        return self.headers.get(name.lower())


class RawConn:
    """A plain socket speaking HTTP/1.x by hand, for what clients libraries hide: pipelining,
    half-close, HTTP/1.0, broken framing. read_response() skips (and records) 1xx responses."""

    def __init__(self, port, timeout=30):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.buf = b""

    def send(self, data):
        self.sock.sendall(data)

    def _fill(self):
        chunk = self.sock.recv(65536)
        if not chunk:
            raise EOFError("connection closed")
        self.buf += chunk

    def _line(self):
        while b"\r\n" not in self.buf:
            self._fill()
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def _exact(self, n):
        while len(self.buf) < n:
            self._fill()
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def read_response(self, head_only=False):
        interim = []
        while True:
            status_line = self._line()
            version, status = status_line.split(b" ", 2)[:2]
            status = int(status)
            headers = {}
            while True:
                line = self._line()
                if not line:
                    break
                k, v = line.split(b":", 1)
                headers[k.decode().strip().lower()] = v.decode().strip()
            if 100 <= status < 200:
                interim.append(status)
                continue
            break
        if head_only:
            body = b""
        elif headers.get("transfer-encoding", "").lower() == "chunked":
            body = b""
            while True:
                size = int(self._line().split(b";")[0], 16)
                if size == 0:
                    while self._line():
                        pass
                    break
                body += self._exact(size)
                assert self._exact(2) == b"\r\n"
        elif "content-length" in headers:
            body = self._exact(int(headers["content-length"]))
        else:
            while True:
                try:
                    self._fill()
                except EOFError:
                    break
            body, self.buf = self.buf, b""
        return RawResponse(status, headers, body, interim)

    def closed_by_peer(self, timeout):
        """True when the server closes the connection within `timeout` seconds."""
        self.sock.settimeout(timeout)
        try:
            while True:
                chunk = self.sock.recv(65536)
                if not chunk:
                    return True
                self.buf += chunk
        except (socket.timeout, TimeoutError):
            return False
        except ConnectionResetError:
            return True

    def close(self):
        self.sock.close()


def request_bytes(method, path, body=None, headers=None, version="1.1"):
    h = {"Host": "127.0.0.1"} if version == "1.1" else {}
    if body is not None:
        h["Content-Type"] = "application/json"
        h["Content-Length"] = str(len(body))
    h.update(headers or {})
    head = f"{method} {path} HTTP/{version}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in h.items()) + "\r\n"
    return head.encode() + (body or b"")
