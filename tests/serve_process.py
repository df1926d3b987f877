"""`nmt serve` in a subprocess for the server's tests (tests/test_serve.py, tests/test_serve_page.py)."""

from __future__ import annotations

import http.client
import json
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


class Server:
    """`nmt serve` in a subprocess on a free loopback port; its stderr is collected in `log`."""

    def __init__(self, model: Path, *options: str) -> None:
        cmd = [sys.executable, "-m", "nmt", "serve", "--model", str(model), "--port", "0", "--device", "cpu",
               "--precision", "fp32", "--threads", "1", *options]
        self.proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, cwd=REPO)
        self.log: list[str] = []
        self.port = 0
        deadline = time.monotonic() + 300
        while not self.port:
            line = self.proc.stderr.readline()
            assert line and time.monotonic() < deadline, "server did not start:\n" + "".join(self.log)
            self.log.append(line)
            match = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
            self.port = int(match.group(1)) if match else 0
        threading.Thread(target=lambda: self.log.extend(self.proc.stderr), daemon=True).start()

    def raw(self, method: str, path: str, body: bytes | None = None,
            headers: dict | None = None) -> tuple[int, dict, bytes]:
        """(status, headers with lower-case names, body)."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=300)
        try:
            conn.request(method, path, body=body, headers=headers or {})
            response = conn.getresponse()
            return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
        finally:
            conn.close()

    def request(self, method: str, path: str, body: bytes | None = None,
                headers: dict | None = None) -> tuple[int, dict, dict]:
        """Like `raw`, the body read as JSON."""
        status, headers, raw = self.raw(method, path, body, headers)
        return status, headers, json.loads(raw or b"{}")

    def translate(self, payload: object) -> tuple[int, dict, dict]:
        return self.request("POST", "/translate", json.dumps(payload).encode())

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=120)
