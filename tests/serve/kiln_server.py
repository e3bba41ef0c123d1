"""Starts and stops a `kiln serve` process for the serve tests (stdlib only).

KilnServer(kiln, model, *args) launches `kiln serve --model MODEL --port 0 ARGS`, reads the
"kiln: serving NAME on URL" line from its stderr (kept in a file so the access log never blocks
it), and stop() sends SIGTERM and returns the exit code.
"""
import json
import os
import re
import signal
import subprocess
import tempfile
import time
import urllib.request


class KilnServer:
    def __init__(self, kiln, model, *args, env=None):
        self.log = tempfile.NamedTemporaryFile("w+", prefix="kiln-serve-", suffix=".log", delete=False)
        self.proc = subprocess.Popen([kiln, "serve", "--model", model, "--port", "0", *args],
                                     stdout=subprocess.DEVNULL, stderr=self.log,
                                     env={**os.environ, **(env or {})})
        deadline = time.time() + 60
        self.url = None
        while time.time() < deadline and self.url is None:
            if self.proc.poll() is not None:
                raise RuntimeError("kiln serve exited early:\n" + self.read_log())
            m = re.search(r"kiln: serving (\S+) on (http://\S+)", self.read_log())
            if m:
                self.model_name, self.url = m.group(1), m.group(2)
            time.sleep(0.05)
        if self.url is None:
            self.proc.kill()
            raise RuntimeError("kiln serve did not start:\n" + self.read_log())

    def read_log(self):
        with open(self.log.name) as f:
            return f.read()

    def get(self, path, headers=None):
        req = urllib.request.Request(self.url + path, headers=headers or {})
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.read().decode()

    def post(self, path, body, headers=None, timeout=120):
        """(status, parsed JSON body) of a POST; errors are returned, not raised."""
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method="POST",
                                     headers={"Content-Type": "application/json", **(headers or {})})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"null")

    def metrics(self, headers=None):
        """The /metrics samples without labels' detail: {name or name{labels}: value}."""
        out = {}
        for line in self.get("/metrics", headers).splitlines():
            if line and not line.startswith("#"):
                key, value = line.rsplit(" ", 1)
                out[key] = float(value)
                out.setdefault(key.split("{")[0], float(value))
        return out

    def rss_kib(self):
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        return 0

    def stop(self, timeout=60):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return self.proc.returncode
