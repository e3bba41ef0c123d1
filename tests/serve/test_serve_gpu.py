"""kiln serve on a device (KILN_SERVE_DEVICE, default cuda): the known greedy replies of
testdata/tiny-tools (bf16 on CUDA; transformers' replies in golden.json) through the OpenAI and
Anthropic routes, streamed and not, with tool calls. Stdlib only (the GPU machine has no pip).
Run: KILN=build-gpu/bin/kiln python3 -m unittest tests/serve/test_serve_gpu.py
"""
import asyncio
import json
import os
import sys
import unittest
import urllib.parse

sys.path.insert(0, os.path.dirname(__file__))
from kiln_server import KilnServer  # noqa: E402
from sse_client import stream_post  # noqa: E402

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", ".."))
MODEL = os.path.join(ROOT, "testdata", "tiny-tools")
KILN = os.environ.get("KILN", os.path.join(ROOT, "build", "bin", "kiln"))
DEVICE = os.environ.get("KILN_SERVE_DEVICE", "cuda")
with open(os.path.join(MODEL, "golden.json")) as f:
    GOLDEN = json.load(f)
CASES = {c["name"]: c for c in GOLDEN["cases"]}
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "description": "The city name."}}, "required": ["city"]}}}


class ServeOnDevice(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = KilnServer(KILN, MODEL, "--device", DEVICE)

    @classmethod
    def tearDownClass(cls):
        assert cls.server.stop() == 0, cls.server.read_log()[-2000:]

    def test_replies(self):
        for name in ("chat", "chat_system", "chat_multi_turn", "tool_result_no_tools"):
            c = CASES[name]
            status, body = self.server.post("/v1/chat/completions",
                                            {"model": "tiny-tools", "messages": c["messages"], "temperature": 0})
            self.assertEqual(status, 200, body)
            self.assertEqual(body["choices"][0]["message"]["content"], c["completion_text"], name)
            self.assertEqual(body["usage"]["prompt_tokens"], c["prompt_tokens"], name)

    def test_tool_call(self):
        c = CASES["tools"]
        status, body = self.server.post("/v1/chat/completions", {"model": "tiny-tools", "messages": c["messages"],
                                                                 "tools": [TOOL], "temperature": 0})
        self.assertEqual(status, 200, body)
        call = body["choices"][0]["message"]["tool_calls"][0]["function"]
        self.assertEqual((call["name"], json.loads(call["arguments"])), ("get_weather", {"city": "Paris"}))

    def test_streams(self):
        u = urllib.parse.urlparse(self.server.url)
        c = CASES["completion"]
        code, _, events = asyncio.run(stream_post(u.hostname, u.port, "/v1/completions", {
            "model": "tiny-tools", "prompt": c["prompt"], "temperature": 0, "max_tokens": 20, "stream": True}))
        self.assertEqual(code, 200)
        self.assertEqual("".join(e["choices"][0]["text"] for e in events[:-1]), c["completion_text"])
        code, _, events = asyncio.run(stream_post(u.hostname, u.port, "/v1/messages", {
            "model": "tiny-tools", "max_tokens": 50, "temperature": 0, "stream": True,
            "messages": [{"role": "user", "content": "Hi!"}]}))
        self.assertEqual(code, 200)
        self.assertEqual([e["type"] for e in events][:2], ["message_start", "ping"])
        text = "".join(e["delta"]["text"] for e in events if e["type"] == "content_block_delta")
        self.assertEqual(text, CASES["chat"]["completion_text"])
        self.assertEqual(events[-1]["type"], "message_stop")


if __name__ == "__main__":
    unittest.main()
