"""kiln serve's operations: weight updates over HTTP in each mode (between and during streams),
clients that disconnect, the queue limit, graceful SIGTERM, and 1,000 concurrent streams.

Weights: testdata/tiny-tools greets ("Hello! How can ..."); its variant written here swaps two rows of
lm_head so that the same prompt is answered "The weather in Paris is sunny.", so every reply says
which checkpoint produced it, and its policy versions say which version did.
Run: KILN=build/bin/kiln python -m unittest tests/serve/test_serve_ops.py   (stdlib only)
"""
import asyncio
import ipaddress
import json
import os
import resource
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import urllib.error
import urllib.parse
import urllib.request

sys.path.insert(0, os.path.dirname(__file__))
from kiln_server import KilnServer  # noqa: E402
from sse_client import stream_post  # noqa: E402

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", ".."))
MODEL = os.path.join(ROOT, "testdata", "tiny-tools")
KILN = os.environ.get("KILN", os.path.join(ROOT, "build", "bin", "kiln"))
# Set by scripts/sanitize.sh: the binary runs under AddressSanitizer, whose allocator keeps freed
# memory in a quarantine (256 MB by default) and never hands it back, so the process's RSS says
# nothing about leaks there; LeakSanitizer checks them instead when the server exits.
SANITIZED = os.environ.get("KILN_SANITIZED") == "1"
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

    def test_every_field_of_every_type_is_answered(self):
        """Each field of valid requests (OpenAI chat with tools and tool calls, completions, Anthropic
        messages with tool use and results, token counting) replaced by a value of each other JSON
        type, or deleted: every request gets an answer below 500, and the server lives on (a field
        read with nlohmann's value() on a number once ended the process)."""
        import copy
        chat = {"model": "tiny-tools", "max_tokens": 2, "messages": [
            {"role": "system", "content": "s"}, {"role": "user", "content": [{"type": "text", "text": "hi"}]},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"x\": 1}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "42"}],
            "tools": [{"type": "function", "function": {"name": "f", "description": "d", "parameters": {
                "type": "object", "properties": {"x": {"type": "integer"}}}}}],
            "tool_choice": {"type": "function", "function": {"name": "f"}}, "temperature": 0.5, "top_p": 0.9,
            "n": 1, "seed": 3, "stop": ["a"], "logprobs": True, "top_logprobs": 2,
            "response_format": {"type": "text"}}
        completion = {"model": "tiny-tools", "prompt": ["hello", "x"], "max_tokens": 2, "logprobs": 2, "stop": "a"}
        messages = {"model": "tiny-tools", "max_tokens": 2, "system": [{"type": "text", "text": "s"}], "messages": [
            {"role": "user", "content": [{"type": "text", "text": "q"}]},
            {"role": "assistant", "content": [{"type": "text", "text": "t"},
                                              {"type": "tool_use", "id": "t1", "name": "f", "input": {"x": 1}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                          "content": [{"type": "text", "text": "42"}], "is_error": False}]}],
            "tools": [{"name": "f", "description": "d", "input_schema": {"type": "object"}}],
            "tool_choice": {"type": "auto"}, "thinking": {"type": "disabled"}, "stop_sequences": ["z"], "top_k": 3}
        count = {"model": "tiny-tools", "messages": [{"role": "user", "content": "hi"}], "system": "s",
                 "tools": [{"name": "f", "input_schema": {"type": "object"}}], "tool_choice": {"type": "any"}}
        others = [5, -1, 1.5, "x", [], [1], {}, {"a": 1}, None, True]

        def paths(v, p=()):
            if p:
                yield p
            items = v.items() if isinstance(v, dict) else enumerate(v) if isinstance(v, list) else []
            for k, x in items:
                yield from paths(x, p + (k,))

        def variants(body, p):
            for w in others:
                v = copy.deepcopy(body)
                cur = v
                for k in p[:-1]:
                    cur = cur[k]
                cur[p[-1]] = w
                yield v
            v = copy.deepcopy(body)
            cur = v
            for k in p[:-1]:
                cur = cur[k]
            del cur[p[-1]]
            yield v

        server = KilnServer(KILN, MODEL)
        try:
            sent = 0
            for route, body in (("/v1/chat/completions", chat), ("/v1/completions", completion),
                                ("/v1/messages", messages), ("/v1/messages/count_tokens", count)):
                status, reply = server.post(route, body)
                self.assertEqual(status, 200, (route, reply))
                for p in paths(body):
                    for v in variants(body, p):
                        status, reply = server.post(route, v)
                        sent += 1
                        self.assertLess(status, 500, (route, p, v, reply))
                for raw in (b"[]", b"5", b"null", b'"x"', b'{"model": 5}'):
                    status, reply = server.post(route, raw)
                    self.assertEqual(status, 400, (route, raw, reply))
            self.assertGreater(sent, 1000)
            status, _ = server.post("/v1/chat/completions", chat_body())
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


def non_loopback_address():
    """An IPv4 address of this machine other than loopback (hostname -I), or None."""
    try:
        out = subprocess.run(["hostname", "-I"], capture_output=True, text=True, timeout=10).stdout.split()
    except (OSError, subprocess.SubprocessError):
        out = []
    for a in out:
        try:
            if isinstance(ipaddress.ip_address(a), ipaddress.IPv4Address) and not ipaddress.ip_address(a).is_loopback:
                return a
        except ValueError:
            pass
    return None


def request(url, path, body=None, headers=None):
    """(status, parsed JSON body) of a GET (body None) or POST to url + path; errors are returned."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url + path, data=data, method="GET" if body is None else "POST",
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def url_at(server, host):
    return f"http://{host}:{urllib.parse.urlparse(server.url).port}"


MESSAGE = {"model": "tiny-tools", "max_tokens": 20, "temperature": 0, "messages": [{"role": "user", "content": "Hi!"}]}


class ServerOptionsTest(unittest.TestCase):
    def assert_openai_error(self, got, status, type_, code=None):
        self.assertEqual(got[0], status, got)
        self.assertEqual(set(got[1]), {"error"}, got)
        self.assertEqual((got[1]["error"]["type"], got[1]["error"]["code"]), (type_, code), got)

    def assert_anthropic_error(self, got, status, type_):
        self.assertEqual(got[0], status, got)
        self.assertEqual((got[1]["type"], got[1]["error"]["type"]), ("error", type_), got)

    def test_without_a_key_only_loopback(self):
        # Without an API key kiln listens on 127.0.0.1 only: another host cannot even connect. Binding
        # another address takes an explicit --host (the issue: "without a key only loopback is allowed
        # unless --host is given explicitly"), and then kiln warns that anyone who reaches it may use it.
        # (The server also answers 403 to a non-loopback peer when no key and no --host were given; a
        # loopback bind never sees one, so that line is a second guard no client can reach.)
        addr = non_loopback_address()
        if addr is None:
            self.skipTest("this machine has no non-loopback IPv4 address (hostname -I) to connect through")
        server = KilnServer(KILN, MODEL)
        try:
            self.assertIn("no API key", server.read_log())
            self.assertEqual(request(server.url, "/v1/models")[0], 200)
            with self.assertRaises(urllib.error.URLError) as e:
                request(url_at(server, addr), "/v1/models")
            self.assertIsInstance(e.exception.reason, ConnectionRefusedError)
            # Admin routes need a key even on loopback.
            self.assert_openai_error(request(server.url, "/v1/admin/flush_cache", {}), 403, "permission_error")
        finally:
            self.assertEqual(server.stop(), 0)
        server = KilnServer(KILN, MODEL, "--host", "0.0.0.0")
        try:
            self.assertIn("warning: no API key", server.read_log())
            status, body = request(url_at(server, addr), "/v1/chat/completions", chat_body())
            self.assertEqual((status, body["choices"][0]["message"]["content"]), (200, GREETING))
            self.assertIn(f'"remote":"{addr}:', server.read_log())  # it was served as the other address
            self.assert_openai_error(request(url_at(server, addr), "/v1/admin/flush_cache", {}), 403, "permission_error")
        finally:
            self.assertEqual(server.stop(), 0)

    def test_api_key_from_environment(self):
        # KILN_API_KEY is enforced as --api-key is, on every address, for both protocols and /metrics;
        # --api-key wins over it.
        addr = non_loopback_address()
        server = KilnServer(KILN, MODEL, "--host", "0.0.0.0", env={"KILN_API_KEY": "sk-env"})
        try:
            self.assertNotIn("no API key", server.read_log())
            for base in [url_at(server, "127.0.0.1")] + ([url_at(server, addr)] if addr else []):
                for headers in ({}, {"Authorization": "Bearer sk-wrong"}, {"x-api-key": "sk-wrong"}, {"Authorization": "sk-env"}):
                    self.assert_openai_error(request(base, "/v1/models", None, headers), 401, "authentication_error")
                    self.assert_openai_error(request(base, "/v1/chat/completions", chat_body(), headers), 401, "authentication_error")
                    self.assert_anthropic_error(request(base, "/v1/messages", MESSAGE, headers), 401, "authentication_error")
                    self.assertEqual(request(base, "/v1/admin/flush_cache", {}, headers)[0], 401)
                    with self.assertRaises(urllib.error.HTTPError) as e:
                        urllib.request.urlopen(urllib.request.Request(base + "/metrics", headers=headers), timeout=30)
                    self.assertEqual(e.exception.code, 401)
                self.assertEqual(request(base, "/v1/models", None, {"Authorization": "Bearer sk-env"})[0], 200)
                status, body = request(base, "/v1/chat/completions", chat_body(), {"Authorization": "Bearer sk-env"})
                self.assertEqual((status, body["choices"][0]["message"]["content"]), (200, GREETING))
                status, body = request(base, "/v1/messages", MESSAGE, {"x-api-key": "sk-env"})
                self.assertEqual((status, body["content"][0]["text"]), (200, GREETING))
                self.assertEqual(request(base, "/v1/admin/flush_cache", {}, {"x-api-key": "sk-env"}), (200, {"flushed": True}))
        finally:
            self.assertEqual(server.stop(), 0)
        server = KilnServer(KILN, MODEL, "--api-key", "sk-flag", env={"KILN_API_KEY": "sk-env"})
        try:
            self.assertEqual(request(server.url, "/v1/models", None, {"Authorization": "Bearer sk-env"})[0], 401)
            self.assertEqual(request(server.url, "/v1/models", None, {"Authorization": "Bearer sk-flag"})[0], 200)
        finally:
            self.assertEqual(server.stop(), 0)

    def test_served_model_name(self):
        server = KilnServer(KILN, MODEL, "--served-model-name", "acme/kiln-7")
        try:
            self.assertIn("kiln: serving acme/kiln-7 on", server.read_log())
            status, models = request(server.url, "/v1/models")
            self.assertEqual([m["id"] for m in models["data"]], ["acme/kiln-7"])
            self.assertEqual(request(server.url, "/v1/models/acme/kiln-7")[1]["id"], "acme/kiln-7")
            self.assertEqual(request(server.url, "/v1/models/tiny-tools")[0], 404)
            name = {"model": "acme/kiln-7"}
            status, body = request(server.url, "/v1/chat/completions", chat_body(**name))
            self.assertEqual((status, body["model"], body["choices"][0]["message"]["content"]), (200, "acme/kiln-7", GREETING))
            status, body = request(server.url, "/v1/completions", {**name, "prompt": "Once upon a time", "temperature": 0})
            self.assertEqual((status, body["model"], body["choices"][0]["text"]), (200, "acme/kiln-7", GOLDEN["replies"]["story"]))
            status, body = request(server.url, "/v1/messages", {**MESSAGE, **name})
            self.assertEqual((status, body["model"], body["content"][0]["text"]), (200, "acme/kiln-7", GREETING))
            u = urllib.parse.urlparse(server.url)
            code, _, events = asyncio.run(stream_post(u.hostname, u.port, "/v1/chat/completions", chat_body(stream=True, **name)))
            self.assertEqual({ev["model"] for ev in events[:-1]}, {"acme/kiln-7"})
            code, _, events = asyncio.run(stream_post(u.hostname, u.port, "/v1/messages", {**MESSAGE, **name, "stream": True}))
            self.assertEqual(events[0]["message"]["model"], "acme/kiln-7")
            # The folder's name, or any other, is refused in each protocol's shape.
            for other in ("tiny-tools", "acme/kiln-8", ""):
                self.assert_openai_error(request(server.url, "/v1/chat/completions", chat_body(model=other)),
                                         404, "invalid_request_error", "model_not_found")
                self.assert_openai_error(request(server.url, "/v1/completions", {"model": other, "prompt": "x"}),
                                         404, "invalid_request_error", "model_not_found")
                self.assert_anthropic_error(request(server.url, "/v1/messages", {**MESSAGE, "model": other}), 404, "not_found_error")
                self.assert_anthropic_error(request(server.url, "/v1/messages/count_tokens", {**MESSAGE, "model": other}),
                                            404, "not_found_error")
        finally:
            self.assertEqual(server.stop(), 0)

    def test_model_sampling_defaults(self):
        # generation_config.json recommends greedy decoding and 3 new tokens: a request that names
        # neither gets them (what an explicit request for them gets); --generation-config none
        # restores OpenAI's defaults.
        tmp = tempfile.mkdtemp()
        try:
            model = os.path.join(tmp, "tiny-tools")
            shutil.copytree(MODEL, model)
            with open(os.path.join(model, "generation_config.json"), "w") as f:
                json.dump({"temperature": 0.0, "max_new_tokens": 3, "eos_token_id": 258, "pad_token_id": 256}, f)
            plain = {"model": "tiny-tools", "messages": [{"role": "user", "content": "Hi!"}], "return_token_ids": True}
            server = KilnServer(KILN, model)
            try:
                self.assertIn("sampling defaults from", server.read_log())
                status, auto = request(server.url, "/v1/chat/completions", {**plain, "seed": 1})
                self.assertEqual(status, 200, auto)
                _, again = request(server.url, "/v1/chat/completions", {**plain, "seed": 2})
                _, explicit = request(server.url, "/v1/chat/completions", {**plain, "temperature": 0, "max_tokens": 3})
                self.assertEqual(auto["usage"]["completion_tokens"], 3)
                self.assertEqual(auto["choices"][0]["finish_reason"], "length")
                for other in (again, explicit):
                    self.assertEqual(auto["choices"][0]["token_ids"], other["choices"][0]["token_ids"])
                self.assertTrue(GREETING.startswith(auto["choices"][0]["message"]["content"]))
            finally:
                self.assertEqual(server.stop(), 0)
            server = KilnServer(KILN, model, "--generation-config", "none")
            try:
                self.assertNotIn("sampling defaults from", server.read_log())
                status, body = request(server.url, "/v1/chat/completions", {**plain, "temperature": 0})
                self.assertEqual((status, body["choices"][0]["message"]["content"]), (200, GREETING))
            finally:
                self.assertEqual(server.stop(), 0)
        finally:
            shutil.rmtree(tmp)

    def test_reasoning_parser(self):
        # A template that opens a <think> block after the generation prompt (DeepSeek-R1's way): with
        # --reasoning-parser the reply, which never closes it, is all reasoning; without, the same
        # text is the content.
        tmp = tempfile.mkdtemp()
        try:
            model = os.path.join(tmp, "tiny-tools")
            shutil.copytree(MODEL, model)
            path = os.path.join(model, "chat_template.jinja")
            with open(path) as f:
                template = f.read()
            with open(path, "w") as f:
                f.write(template.replace("{{- '<|im_start|>assistant\\n' }}", "{{- '<|im_start|>assistant\\n<think>\\n' }}"))
            body = {"model": "tiny-tools", "messages": [{"role": "user", "content": "Hi!"}], "temperature": 0, "max_tokens": 12}
            message = {"model": "tiny-tools", "max_tokens": 12, "temperature": 0, "messages": [{"role": "user", "content": "Hi!"}]}
            server = KilnServer(KILN, model)
            try:
                status, raw = request(server.url, "/v1/chat/completions", body)
                self.assertEqual(status, 200, raw)
                raw_text = raw["choices"][0]["message"]["content"]
                self.assertNotIn("reasoning_content", raw["choices"][0]["message"])
            finally:
                self.assertEqual(server.stop(), 0)
            self.assertTrue(raw_text)
            server = KilnServer(KILN, model, "--reasoning-parser", "deepseek_r1")
            try:
                self.assertIn("reasoning split", server.read_log())
                status, split = request(server.url, "/v1/chat/completions", body)
                self.assertEqual(status, 200, split)
                msg = split["choices"][0]["message"]
                self.assertEqual((msg["content"], msg["reasoning_content"], msg["reasoning"]), (None, raw_text, raw_text))
                u = urllib.parse.urlparse(server.url)
                code, _, events = asyncio.run(stream_post(u.hostname, u.port, "/v1/chat/completions", {**body, "stream": True}))
                deltas = [ev["choices"][0]["delta"] for ev in events if isinstance(ev, dict) and ev.get("choices")]
                self.assertEqual("".join(d.get("reasoning_content", "") for d in deltas), raw_text)
                self.assertEqual("".join(d.get("content", "") for d in deltas), "")
                status, anth = request(server.url, "/v1/messages",
                                       {**message, "max_tokens": 1100, "thinking": {"type": "enabled", "budget_tokens": 1024}})
                self.assertEqual(status, 200, anth)
                self.assertEqual(anth["content"][0]["type"], "thinking")
                self.assertTrue(anth["content"][0]["thinking"].startswith(raw_text), anth["content"])
                code, _, events = asyncio.run(stream_post(u.hostname, u.port, "/v1/messages", {**message, "stream": True}))
                starts = [ev["content_block"]["type"] for ev in events if isinstance(ev, dict) and ev.get("type") == "content_block_start"]
                thinking = "".join(ev["delta"]["thinking"] for ev in events if isinstance(ev, dict)
                                   and ev.get("type") == "content_block_delta" and ev["delta"]["type"] == "thinking_delta")
                signatures = [ev for ev in events if isinstance(ev, dict) and ev.get("type") == "content_block_delta"
                              and ev["delta"]["type"] == "signature_delta"]
                self.assertEqual((starts, thinking, len(signatures)), (["thinking"], raw_text, 1))
            finally:
                self.assertEqual(server.stop(), 0)
        finally:
            shutil.rmtree(tmp)

    def test_token_and_context_limits(self):
        # --kv-tokens 128 makes a KV pool of 128 tokens, and so the context (prompt + completion) 128;
        # --max-tokens-limit 5 caps what a request may ask for and what it gets by default.
        server = KilnServer(KILN, MODEL, "--kv-tokens", "128", "--max-tokens-limit", "5", "--max-n", "2")
        try:
            self.assertIn("(context 128 tokens", server.read_log())
            short = GREETING.split(" can")[0] + " can I"  # "Hello! How can I": five tokens
            # The cap: the default is the cap, asking for it is fine, asking for more is refused.
            for kw in ({}, {"max_tokens": 5}, {"max_completion_tokens": 5}):
                status, body = server.post("/v1/chat/completions", chat_body(**kw))
                self.assertEqual((status, body["choices"][0]["message"]["content"], body["choices"][0]["finish_reason"],
                                  body["usage"]["completion_tokens"]), (200, short, "length", 5), kw)
            status, body = server.post("/v1/completions", {"model": "tiny-tools", "prompt": "Once upon a time", "temperature": 0})
            self.assertEqual((status, body["choices"][0]["text"]), (200, " there was a little dragon"))  # 5 of 16 by default
            for kw in ({"max_tokens": 6}, {"max_completion_tokens": 100}):
                got = server.post("/v1/chat/completions", chat_body(**kw))
                self.assert_openai_error(got, 400, "invalid_request_error")
                self.assertIn("--max-tokens-limit", got[1]["error"]["message"])
            status, body = server.post("/v1/messages", {**MESSAGE, "max_tokens": 5})
            self.assertEqual((status, body["content"][0]["text"], body["stop_reason"]), (200, short, "max_tokens"))
            got = server.post("/v1/messages", {**MESSAGE, "max_tokens": 6})
            self.assert_anthropic_error(got, 400, "invalid_request_error")
            self.assertIn("--max-tokens-limit", got[1]["error"]["message"])
            # The context: "Hi!" renders to 92 tokens (golden), three of them the message's bytes; a message
            # of n x's (one byte token each) renders to 89 + n. 89 + 34 + 5 = 128 fits, 89 + 35 + 5 does not.
            prompt_tokens = next(c["prompt_tokens"] for c in GOLDEN["cases"] if c["name"] == "chat")

            def xs(n):
                return [{"role": "user", "content": "x" * n}]
            status, body = server.post("/v1/chat/completions", chat_body(messages=xs(34), max_tokens=5))
            self.assertEqual((status, body["usage"]["prompt_tokens"]), (200, prompt_tokens - 3 + 34))
            got = server.post("/v1/chat/completions", chat_body(messages=xs(35), max_tokens=5))
            self.assert_openai_error(got, 400, "invalid_request_error", "context_length_exceeded")
            self.assertIn("128", got[1]["error"]["message"])
            # Without max_tokens the completion gets what the context leaves (here 3 < 5).
            status, body = server.post("/v1/chat/completions", chat_body(messages=xs(36)))
            self.assertEqual((status, body["choices"][0]["message"]["content"], body["usage"]["completion_tokens"]),
                             (200, "Hello! How", 3))
            self.assert_openai_error(server.post("/v1/chat/completions", chat_body(messages=xs(39))),
                                     400, "invalid_request_error", "context_length_exceeded")
            self.assertEqual(server.post("/v1/messages", {**MESSAGE, "max_tokens": 5, "messages": xs(34)})[0], 200)
            got = server.post("/v1/messages", {**MESSAGE, "max_tokens": 5, "messages": xs(35)})
            self.assert_anthropic_error(got, 400, "invalid_request_error")
            self.assertIn("prompt is too long", got[1]["error"]["message"])
            # Token-id prompts of completions: 123 + 5 fits, 124 + 5 does not, 128 leaves no room at all.
            self.assertEqual(server.post("/v1/completions", {"model": "tiny-tools", "prompt": [120] * 123, "max_tokens": 5})[0], 200)
            for n, kw in ((124, {"max_tokens": 5}), (128, {})):
                self.assert_openai_error(server.post("/v1/completions", {"model": "tiny-tools", "prompt": [120] * n, **kw}),
                                         400, "invalid_request_error", "context_length_exceeded")
            # --max-n.
            status, body = server.post("/v1/chat/completions", chat_body(n=2, max_tokens=1))
            self.assertEqual((status, len(body["choices"])), (200, 2))
            got = server.post("/v1/chat/completions", chat_body(n=3, max_tokens=1))
            self.assert_openai_error(got, 400, "invalid_request_error")
            self.assertIn("'n'", got[1]["error"]["message"])
        finally:
            self.assertEqual(server.stop(), 0)


class LoadTest(unittest.TestCase):
    N = 1000
    WARM_CHATS = 8

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

            async def long_prompt(i):  # 4,000 byte tokens, each prompt from its own first token; 8 generated
                body = {"model": "tiny-tools", "prompt": [(i + j) % 250 for j in range(4000)], "temperature": 0,
                        "max_tokens": 8, "ignore_eos": True, "stream": True}
                return await stream_post(u.hostname, u.port, "/v1/completions", body)

            async def wave(n):
                return await asyncio.gather(*(one(i) for i in range(n)))

            async def warm_up():
                return await asyncio.gather(*(long_prompt(i) for i in range(4)), wave(self.WARM_CHATS))

            def check(results):
                for code, _, events in results:
                    self.assertEqual(code, 200)
                    self.assertEqual(events[-1], "[DONE]")
                    text = "".join(ev["choices"][0]["delta"].get("content") or "" for ev in events[:-1] if ev.get("choices"))
                    self.assertEqual(text, GREETING)
                    self.assertEqual(events[-2]["usage"]["completion_tokens"], 10)

            # Warm-up, so that what the server allocates at start but touches only when used counts in the
            # baseline: four 4,000-token prompts at once fill the KV pool (four full-length sequences on
            # the CPU) and run full 8,192-token steps; a few chats go through the HTTP and chat path.
            *longs, chats = asyncio.run(warm_up())
            for code, _, events in longs:
                self.assertEqual((code, events[-1]), (200, "[DONE]"))
            check(chats)
            self.assertGreater(server.metrics()["kiln_kv_usage_ratio"], 0.95)
            before = server.rss_kib()
            t0 = time.time()
            check(asyncio.run(wave(self.N)))
            first = time.time() - t0
            after_first = server.rss_kib()
            check(asyncio.run(wave(self.N)))
            after = server.rss_kib()
            m = server.metrics()
            self.assertEqual(m["kiln_requests_running"] + m["kiln_requests_waiting"] + m["kiln_completions_open"], 0)
            self.assertEqual(m["kiln_http_connections"], 1)  # the metrics request itself
            self.assertEqual(m['kiln_requests_total{route="/v1/chat/completions",status="200"}'], 2 * self.N + self.WARM_CHATS)
            msg = f"RSS {before} KiB before the load, {after_first} KiB after the first wave, {after} KiB after the second"
            if SANITIZED:  # see SANITIZED: the bounds below hold for glibc's allocator only
                print(f"\n{self.N} concurrent streams: {first:.2f} s; {msg} (sanitized: RSS not bounded)", file=sys.stderr)
                return
            # Memory: a second wave of the same load leaves the server where the first one did.
            self.assertLess(after - after_first, 16 * 1024, msg)
            # And near where it was before the load. Not at it: the process's peak RSS (VmHWM) is reached with
            # the 1,000 streams open and stays, because glibc keeps what they freed in its arenas (a
            # thread's arena returns memory only from its top) for the next load; the live heap itself
            # comes back within a megabyte (the prefix cache's index of the prompts; malloc_stats read
            # through gdb). What stays is the footprint of the open streams: the read buffer Beast
            # holds to watch for a disconnect (4 KiB), the session, the request's JSON, its prompt and
            # engine request, the SSE chunks waiting to be written: measured 11 to 13 KiB per concurrent
            # stream for 250 to 2,000 streams (Debian 12, glibc 2.36), and bounded here by 16 KiB per
            # stream. It grows with the streams open at once, not with the requests served: a leak of
            # 3 KiB per request over the 2,000 would cross the bound.
            self.assertLess(after - before, 16 * self.N, msg)
            print(f"\n{self.N} concurrent streams: {first:.2f} s; {msg}", file=sys.stderr)
        finally:
            self.assertEqual(server.stop(), 0)


if __name__ == "__main__":
    unittest.main()
