"""kiln serve's operations: weight updates over HTTP in each mode (between and during streams),
clients that disconnect, the queue limit, graceful SIGTERM, and 1,000 concurrent streams.

Weights: testdata/tiny-tools greets ("Hello! How can ..."); its variant written here swaps two rows of
lm_head so that the same prompt is answered "The weather in Paris is sunny.", so every reply says
which checkpoint produced it, and its policy versions say which version did.
Run: KILN=build/bin/kiln python -m unittest tests/serve/test_serve_ops.py   (stdlib only)
"""
import asyncio
import json
import os
import resource
import shutil
import struct
import sys
import tempfile
import threading
import time
import unittest
import urllib.parse

sys.path.insert(0, os.path.dirname(__file__))
from kiln_server import KilnServer  # noqa: E402
from sse_client import stream_post  # noqa: E402

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", ".."))
MODEL = os.path.join(ROOT, "testdata", "tiny-tools")
KILN = os.environ.get("KILN", os.path.join(ROOT, "build", "bin", "kiln"))
KEY = "sk-ops"
AUTH = {"Authorization": "Bearer " + KEY}
with open(os.path.join(MODEL, "golden.json")) as f:
    GOLDEN = json.load(f)
GREETING, WEATHER = GOLDEN["replies"]["greeting"], GOLDEN["replies"]["weather"]
HELLO, THE = GOLDEN["tokens"]["Hello"], GOLDEN["tokens"]["The"]


def write_variant(dst):
    """tiny-tools with lm_head rows `Hello` and `The` swapped (safetensors read and written by hand)."""
    os.makedirs(dst, exist_ok=True)
    shutil.copy(os.path.join(MODEL, "config.json"), dst)
    with open(os.path.join(MODEL, "model.safetensors"), "rb") as f:
        raw = bytearray(f.read())
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    t = header["lm_head.weight"]
    assert t["dtype"] == "F32"
    rows, cols = t["shape"]
    base = 8 + n + t["data_offsets"][0]
    a, b = base + HELLO * cols * 4, base + THE * cols * 4
    ra, rb = bytes(raw[a:a + cols * 4]), bytes(raw[b:b + cols * 4])
    raw[a:a + cols * 4], raw[b:b + cols * 4] = rb, ra
    with open(os.path.join(dst, "model.safetensors"), "wb") as f:
        f.write(raw)


def chat_body(**kw):
    return {"model": "tiny-tools", "messages": [{"role": "user", "content": "Hi!"}], "temperature": 0, **kw}


def long_body(**kw):
    """A completion that runs for thousands of tokens (EOS ignored)."""
    return {"model": "tiny-tools", "prompt": "Once upon a time", "temperature": 0, "max_tokens": 4000,
            "ignore_eos": True, "stream": True, "return_token_ids": True, **kw}


class StreamInThread:
    """Runs one streaming POST on its own event loop; `started` is set at the first token chunk."""

    def __init__(self, server, body, path="/v1/completions", stop_after=None):
        u = urllib.parse.urlparse(server.url)
        self.started = threading.Event()
        self.result = None

        def on_event(ev):
            if isinstance(ev, dict) and ev.get("choices") and ev["choices"][0].get("policy_version") is not None:
                self.started.set()

        def run():
            self.result = asyncio.run(stream_post(u.hostname, u.port, path, body, AUTH, stop_after, on_event))
            self.started.set()

        self.thread = threading.Thread(target=run)
        self.thread.start()

    def join(self):
        self.thread.join(120)
        return self.result


def chunk_versions(events):
    return [ev["choices"][0]["policy_version"] for ev in events
            if isinstance(ev, dict) and ev.get("choices") and "policy_version" in ev["choices"][0]]


def finish_reason(events):
    return [ev["choices"][0]["finish_reason"] for ev in events
            if isinstance(ev, dict) and ev.get("choices") and ev["choices"][0].get("finish_reason")][-1]


class UpdateServer(unittest.TestCase):
    """A server on tiny-tools with the variant checkpoint beside it (each subclass starts its own, at version 0)."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="kiln-ops-")
        cls.variant = os.path.join(cls.tmp, "variant")
        write_variant(cls.variant)
        cls.server = KilnServer(KILN, MODEL, "--api-key", KEY)

    @classmethod
    def tearDownClass(cls):
        code = cls.server.stop()
        shutil.rmtree(cls.tmp)
        assert code == 0, cls.server.read_log()[-2000:]

    def update(self, ckpt, version, mode):
        return self.server.post("/v1/admin/update_weights", {"checkpoint_dir": ckpt, "version": version, "mode": mode}, AUTH)

    def reply(self):
        status, body = self.server.post("/v1/chat/completions", chat_body(), AUTH)
        self.assertEqual(status, 200, body)
        c = body["choices"][0]
        return c["message"]["content"], c["policy_versions"]

    def anthropic_reply(self):
        """(text, policy_versions) of /v1/messages, without and with streaming (the extension field of the
        message, and of the stream's message_delta)."""
        body = {"model": "tiny-tools", "max_tokens": 50, "temperature": 0, "messages": [{"role": "user", "content": "Hi!"}]}
        status, m = self.server.post("/v1/messages", body, AUTH)
        self.assertEqual(status, 200, m)
        u = urllib.parse.urlparse(self.server.url)
        code, _, events = asyncio.run(stream_post(u.hostname, u.port, "/v1/messages", {**body, "stream": True}, AUTH))
        self.assertEqual(code, 200)
        text = "".join(e["delta"]["text"] for e in events if e["type"] == "content_block_delta")
        (delta,) = [e for e in events if e["type"] == "message_delta"]
        self.assertEqual((text, delta["policy_versions"]), (m["content"][0]["text"], m["policy_versions"]))
        return m["content"][0]["text"], m["policy_versions"]

    def stream_reply(self):
        """(text, the set of its chunks' policy_version) of a streamed chat."""
        u = urllib.parse.urlparse(self.server.url)
        code, _, events = asyncio.run(stream_post(u.hostname, u.port, "/v1/chat/completions", chat_body(stream=True), AUTH))
        self.assertEqual(code, 200)
        self.assertEqual(events[-1], "[DONE]")
        text = "".join(ev["choices"][0]["delta"].get("content") or "" for ev in events[:-1] if ev.get("choices"))
        return text, set(chunk_versions(events))


class WeightUpdateTest(UpdateServer):
    def test_updates_in_every_mode(self):
        self.assertEqual(self.reply(), (GREETING, [[0, 0]]))
        self.assertEqual(self.anthropic_reply(), (GREETING, [[0, 0]]))
        # Between requests (sync): acknowledged with the new version, which every later token carries.
        status, ack = self.update(self.variant, 1, "sync")
        self.assertEqual((status, ack["version"]), (200, 1), ack)
        self.assertEqual(self.reply(), (WEATHER, [[0, 1]]))
        self.assertEqual(self.anthropic_reply(), (WEATHER, [[0, 1]]))
        self.assertEqual(json.loads(self.server.get("/v1/models", AUTH))["data"][0]["policy_version"], 1)
        self.assertEqual(self.server.metrics(AUTH)["kiln_policy_version"], 1)

        # abort during a stream: the stream ends with "abort", every token it got from version 1.
        s = StreamInThread(self.server, long_body())
        self.assertTrue(s.started.wait(60))
        status, ack = self.update(MODEL, 2, "abort")
        self.assertEqual((status, ack["version"]), (200, 2), ack)
        self.assertGreaterEqual(ack["aborted"], 1)
        code, _, events = s.join()
        self.assertEqual(code, 200)
        self.assertEqual(finish_reason(events), "abort")
        self.assertEqual(set(chunk_versions(events)), {1})
        self.assertEqual(events[-1], "[DONE]")
        self.assertEqual(self.reply(), (GREETING, [[0, 2]]))

        # keep during a stream: it goes on, its later tokens from version 3.
        s = StreamInThread(self.server, long_body())
        self.assertTrue(s.started.wait(60))
        status, ack = self.update(self.variant, 3, "keep")
        self.assertEqual((status, ack["version"]), (200, 3), ack)
        self.assertGreaterEqual(ack["kept"], 1)
        code, _, events = s.join()
        versions = chunk_versions(events)
        self.assertEqual(finish_reason(events), "length")
        self.assertEqual(versions[0], 2)
        self.assertEqual(versions[-1], 3)
        self.assertEqual(versions, sorted(versions))  # one switch, never back
        self.assertEqual(self.reply(), (WEATHER, [[0, 3]]))

        # sync during a stream: acknowledged only after the stream ended, all of it from version 3.
        s = StreamInThread(self.server, long_body(max_tokens=1500))
        self.assertTrue(s.started.wait(60))
        status, ack = self.update(MODEL, 4, "sync")
        self.assertEqual((status, ack["version"]), (200, 4), ack)
        code, _, events = s.join()
        self.assertEqual(finish_reason(events), "length")
        self.assertEqual(set(chunk_versions(events)), {3})
        self.assertGreater(ack["drain_seconds"], 0)
        self.assertEqual(self.reply(), (GREETING, [[0, 4]]))

        # Refused updates leave version and weights as they were.
        status, body = self.update(self.variant, 4, "sync")
        self.assertEqual(status, 400, body)
        status, body = self.update(os.path.join(self.tmp, "missing"), 5, "sync")
        self.assertIn(status, (400, 404), body)
        status, body = self.update(self.variant, 5, "sometimes")
        self.assertEqual(status, 400, body)
        status, body = self.server.post("/v1/admin/update_weights", {"checkpoint_dir": self.variant, "version": 5})
        self.assertEqual(status, 401, body)
        self.assertEqual(self.reply(), (GREETING, [[0, 4]]))


class WeightUpdateBetweenStreamsTest(UpdateServer):
    def test_abort_and_keep_between_streams(self):
        # Posted while nothing runs, abort and keep abort and keep nothing; every token after the
        # acknowledgement is from the new weights and carries the new version, in both protocols.
        self.assertEqual(self.stream_reply(), (GREETING, {0}))
        for version, (ckpt, reply), mode in ((1, (self.variant, WEATHER), "abort"), (2, (MODEL, GREETING), "keep"),
                                             (3, (self.variant, WEATHER), "keep"), (4, (MODEL, GREETING), "abort")):
            status, ack = self.update(ckpt, version, mode)
            self.assertEqual((status, ack["version"], ack["mode"], ack["aborted"], ack["kept"]), (200, version, mode, 0, 0), ack)
            self.assertEqual(self.stream_reply(), (reply, {version}), mode)
            self.assertEqual(self.reply(), (reply, [[0, version]]), mode)
            self.assertEqual(self.anthropic_reply(), (reply, [[0, version]]), mode)
            self.assertEqual(json.loads(self.server.get("/v1/models", AUTH))["data"][0]["policy_version"], version)


class ConnectionTest(unittest.TestCase):
    def test_disconnect_frees_kv(self):
        server = KilnServer(KILN, MODEL)
        try:
            before = server.metrics()
            u = urllib.parse.urlparse(server.url)
            code, _, events = asyncio.run(stream_post(u.hostname, u.port, "/v1/completions", long_body(), {}, stop_after=3))
            self.assertEqual(code, 200)
            deadline = time.time() + 10
            while time.time() < deadline:
                m = server.metrics()
                if m["kiln_requests_running"] == 0 and m["kiln_completions_open"] == 0:
                    break
                time.sleep(0.02)
            self.assertEqual(m["kiln_requests_running"], 0)
            self.assertEqual(m["kiln_client_disconnects_total"], 1)
            self.assertEqual(m["kiln_kv_pages_used"] - m["kiln_kv_pages_cached"], 0)  # no request holds a page
            self.assertLess(m["kiln_generation_tokens_total"] - before["kiln_generation_tokens_total"], 4000)
            self.assertIn('"status":499', server.read_log())
        finally:
            self.assertEqual(server.stop(), 0)

    def test_queue_limit_429(self):
        server = KilnServer(KILN, MODEL, "--max-queued", "1")
        try:
            s = StreamInThread(server, long_body())
            self.assertTrue(s.started.wait(60))
            u = urllib.parse.urlparse(server.url)
            code, headers, events = asyncio.run(stream_post(u.hostname, u.port, "/v1/chat/completions", chat_body(), {}))
            self.assertEqual(code, 429)
            self.assertEqual(headers["retry-after"], "1")
            self.assertEqual(events[0]["error"]["type"], "rate_limit_error")
            code, _, events = asyncio.run(stream_post(u.hostname, u.port, "/v1/messages",
                                                      {"model": "tiny-tools", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}, {}))
            self.assertEqual((code, events[0]["error"]["type"]), (429, "rate_limit_error"))
            s.join()
        finally:
            server.stop()

    def test_limits_and_malformed_requests(self):
        server = KilnServer(KILN, MODEL, "--max-body-bytes", "4096")
        try:
            big = chat_body(messages=[{"role": "user", "content": "x" * 8000}])
            status, body = server.post("/v1/chat/completions", big)
            self.assertEqual((status, body["error"]["type"]), (413, "invalid_request_error"))
            status, body = server.post("/v1/messages", {**big, "max_tokens": 5})
            self.assertEqual((status, body["type"], body["error"]["type"]), (413, "error", "request_too_large"))
            status, body = server.post("/v1/nothing", {})
            self.assertEqual(status, 404)
            # Raw garbage and a broken request line: 400 or a closed connection, and the server lives on.
            import socket
            u = urllib.parse.urlparse(server.url)
            for raw in (b"\x00\xff garbage\r\n\r\n", b"GET / HTTP/9.9\r\n\r\n", b"POST /v1/completions HTTP/1.1\r\n"
                        b"Content-Length: 99999999999999999999\r\n\r\n"):
                with socket.create_connection((u.hostname, u.port), timeout=10) as sock:
                    sock.sendall(raw)
                    reply = sock.recv(4096)
                    self.assertTrue(reply == b"" or reply.startswith(b"HTTP/1.1 400"), reply[:80])
            status, body = server.post("/v1/chat/completions", chat_body())
            self.assertEqual(status, 200)
        finally:
            self.assertEqual(server.stop(), 0)

    def test_cors(self):
        import http.client
        server = KilnServer(KILN, MODEL, "--allow-origin", "https://chat.example", "--api-key", KEY)
        try:
            u = urllib.parse.urlparse(server.url)
            conn = http.client.HTTPConnection(u.hostname, u.port, timeout=10)
            conn.request("OPTIONS", "/v1/chat/completions", headers={
                "Origin": "https://chat.example", "Access-Control-Request-Method": "POST"})
            r = conn.getresponse()
            r.read()
            self.assertEqual(r.status, 204)
            self.assertEqual(r.getheader("Access-Control-Allow-Origin"), "https://chat.example")
            self.assertIn("Authorization", r.getheader("Access-Control-Allow-Headers"))
            conn.request("GET", "/v1/models", headers={"Origin": "https://chat.example", **AUTH})
            r = conn.getresponse()
            r.read()
            self.assertEqual((r.status, r.getheader("Access-Control-Allow-Origin")), (200, "https://chat.example"))
            conn.close()
        finally:
            self.assertEqual(server.stop(), 0)

    def test_sigterm_is_graceful(self):
        server = KilnServer(KILN, MODEL, "--shutdown-grace", "0.3")
        s = StreamInThread(server, long_body(max_tokens=4000))
        self.assertTrue(s.started.wait(60))
        t0 = time.time()
        self.assertEqual(server.stop(), 0)
        self.assertLess(time.time() - t0, 10)
        code, _, events = s.join()
        self.assertEqual(code, 200)
        self.assertIn(finish_reason(events), ("abort", "length"))
        self.assertEqual(events[-1], "[DONE]")


class LoadTest(unittest.TestCase):
    N = 1000

    def test_concurrent_streams(self):
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 8192)), hard))
        server = KilnServer(KILN, MODEL, "--no-access-log")
        u = urllib.parse.urlparse(server.url)
        try:
            async def one(i):
                body = {"model": "tiny-tools", "messages": [{"role": "user", "content": f"Hi {i}!"}], "temperature": 0,
                        "stream": True, "stream_options": {"include_usage": True}}
                return await stream_post(u.hostname, u.port, "/v1/chat/completions", body)

            async def wave():
                return await asyncio.gather(*(one(i) for i in range(self.N)))

            def check(results):
                for code, _, events in results:
                    self.assertEqual(code, 200)
                    self.assertEqual(events[-1], "[DONE]")
                    text = "".join(ev["choices"][0]["delta"].get("content") or "" for ev in events[:-1] if ev.get("choices"))
                    self.assertEqual(text, GREETING)
                    self.assertEqual(events[-2]["usage"]["completion_tokens"], 10)

            t0 = time.time()
            check(asyncio.run(wave()))
            first = time.time() - t0
            baseline = server.rss_kib()
            check(asyncio.run(wave()))
            after = server.rss_kib()
            m = server.metrics()
            self.assertEqual(m["kiln_requests_running"] + m["kiln_requests_waiting"] + m["kiln_completions_open"], 0)
            self.assertEqual(m["kiln_http_connections"], 1)  # the metrics request itself
            self.assertEqual(m['kiln_requests_total{route="/v1/chat/completions",status="200"}'], 2 * self.N)
            # Memory: a second wave of the same load leaves the server where the first one did.
            self.assertLess(after - baseline, 16 * 1024, f"RSS {baseline} KiB -> {after} KiB")
            print(f"\n{self.N} concurrent streams: {first:.2f} s; RSS {baseline} -> {after} KiB", file=sys.stderr)
        finally:
            self.assertEqual(server.stop(), 0)


if __name__ == "__main__":
    unittest.main()
