#!/usr/bin/env python3
"""A tiny stand-in for `kiln serve`, for developing and checking the web chat page without a model.

Serves src/serve/chat_page.html at `/`, `GET /v1/models`, and a streaming (or not)
`POST /v1/chat/completions` that answers "Hello! How can I help you today?" one word at a time.
Standard library only.

    python3 tests/serve/mock_openai_server.py [--port 0] [--delay 0.05] [--page PATH]
        [--reply TEXT] [--split] [--api-key KEY]

Prints `kiln: serving mock on http://127.0.0.1:PORT` on stderr once it listens, like kiln does.
A user message containing "error" gets an HTTP 400 error; one containing "midstream" gets an
error line in the middle of the stream. Each reply bumps the policy version by one. --split sends
each SSE line in two writes, cut mid-line (and mid-UTF-8 character where there is one), to check
that a client reassembles lines; --api-key makes every /v1 route want `Authorization: Bearer KEY`.
"""
import argparse
import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

REPLY = "Hello! How can I help you today?"
MODEL = "mock"
_lock = threading.Lock()
_state = {"version": 0}


def _page_path():
    here = os.path.dirname(os.path.abspath(__file__))
    return os.path.join(here, "..", "..", "src", "serve", "chat_page.html")


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    page = _page_path()
    delay = 0.05
    reply = REPLY
    split = False
    api_key = ""

    def log_message(self, fmt, *args):  # quiet; errors still reach stderr through send_error
        pass

    def _send(self, status, body, ctype="application/json"):
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _error(self, status, message, etype="invalid_request_error"):
        self._send(status, {"error": {"message": message, "type": etype, "code": None}})

    def _authorized(self):
        if not self.api_key or self.headers.get("Authorization") == "Bearer " + self.api_key:
            return True
        self._error(401, "a valid API key is needed", "authentication_error")
        return False

    def do_GET(self):
        path = self.path.split("?", 1)[0]
        if path.startswith("/v1/") and not self._authorized():
            return
        if path == "/":
            with open(self.page, "rb") as f:
                self._send(200, f.read(), "text/html; charset=utf-8")
        elif path == "/v1/models":
            with _lock:
                version = _state["version"]
            self._send(200, {"object": "list", "data": [{
                "id": MODEL, "object": "model", "created": int(time.time()), "owned_by": "kiln",
                "max_model_len": 4096, "policy_version": version}]})
        else:
            self._error(404, "no route " + path, "not_found_error")

    def _chunk(self, payload):
        text = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)
        data = ("data: " + text + "\n\n").encode()
        cut = len(data) // 2
        if self.split and any(b >= 0x80 for b in data):  # cut inside a multi-byte character
            cut = next(i for i, b in enumerate(data) if b >= 0x80) + 1
        for piece in ((data[:cut], data[cut:]) if self.split else (data,)):
            self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            self.wfile.flush()
            if self.split:
                time.sleep(0.01)

    def do_POST(self):
        if self.path != "/v1/chat/completions":
            return self._error(404, "no route " + self.path, "not_found_error")
        if not self._authorized():
            return
        try:
            req = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
            messages = req["messages"]
        except (ValueError, KeyError, TypeError):
            return self._error(400, "the body must be JSON with `messages`")
        last = str(messages[-1].get("content", "")) if messages else ""
        if "error" in last.lower():
            return self._error(400, "mock error: you asked for one")
        words = self.reply.split(" ")
        limit = int(req.get("max_tokens") or len(words))
        words = words[:max(1, limit)]
        with _lock:
            _state["version"] += 1
            version = _state["version"]
        prompt_tokens = sum(len(str(m.get("content", "")).split()) for m in messages)
        base = {"id": "chatcmpl-mock", "object": "chat.completion.chunk", "created": int(time.time()),
                "model": MODEL}
        if not req.get("stream"):
            return self._send(200, dict(base, object="chat.completion", choices=[{
                "index": 0, "message": {"role": "assistant", "content": " ".join(words)},
                "finish_reason": "stop", "policy_version": version}],
                usage={"prompt_tokens": prompt_tokens, "completion_tokens": len(words)}))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            self._chunk(dict(base, choices=[{"index": 0, "delta": {"role": "assistant", "content": ""},
                                              "finish_reason": None, "policy_version": version}]))
            for i, word in enumerate(words):
                time.sleep(self.delay)
                if "midstream" in last.lower() and i == 2:
                    self._chunk({"error": {"message": "mock mid-stream error", "type": "server_error",
                                           "code": None}})
                    break
                text = word if i == 0 else " " + word
                self._chunk(dict(base, choices=[{"index": 0, "delta": {"content": text},
                                                  "finish_reason": None, "policy_version": version}]))
            else:
                self._chunk(dict(base, choices=[{"index": 0, "delta": {}, "finish_reason": "stop",
                                                  "policy_version": version}]))
                if (req.get("stream_options") or {}).get("include_usage"):
                    self._chunk(dict(base, choices=[], usage={
                        "prompt_tokens": prompt_tokens, "completion_tokens": len(words),
                        "total_tokens": prompt_tokens + len(words)}))
            self._chunk("[DONE]")
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client stopped the stream


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--delay", type=float, default=0.05, help="seconds between streamed words")
    ap.add_argument("--page", default=_page_path(), help="the HTML served at /")
    ap.add_argument("--reply", default=REPLY, help="the text every reply streams, word by word")
    ap.add_argument("--split", action="store_true", help="cut every SSE line across two writes")
    ap.add_argument("--api-key", default="", help="require this bearer key on /v1 routes")
    args = ap.parse_args()
    Handler.page, Handler.delay, Handler.reply = args.page, args.delay, args.reply
    Handler.split, Handler.api_key = args.split, args.api_key
    server = ThreadingHTTPServer((args.host, args.port), Handler)
    server.daemon_threads = True
    host, port = server.server_address[:2]
    print(f"kiln: serving {MODEL} on http://{host}:{port}", file=sys.stderr, flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


if __name__ == "__main__":
    main()
