#!/usr/bin/env python3
"""Headless-Chromium check of kiln serve's web chat page.

    check_chat_page.py --kiln PATH --model DIR --expect TEXT --screenshot OUT.png [--chromium chromium]
    check_chat_page.py --url http://127.0.0.1:PORT --expect TEXT --screenshot OUT.png

Starts `PATH serve --model DIR --port 0` (unless --url names a running server), waits up to 60 s
for its `kiln: serving NAME on http://HOST:PORT` line on stderr, opens URL/?prompt=Hi&send=1 in
headless Chromium, waits for the streamed reply to finish (the page sets body[data-state=idle]),
asserts the last assistant bubble (.msg.assistant) contains --expect, and saves a 1000x800
screenshot. Exit 0: passed; 1: failed (the reason is printed); 77: skipped, no chromium.

How it drives Chromium: the DevTools protocol over --remote-debugging-pipe (JSON messages ended
by NUL on file descriptors 3 and 4), not --dump-dom/--screenshot. With Debian 12's chromium
(new headless), --dump-dom returns while a fetch() body is still streaming: --virtual-time-budget
does not count a streaming response as pending network, and --timeout stops early too. Over the
pipe the check polls the live page until its reply is done (on a real clock, with --timeout), then
reads the DOM and takes the screenshot from the same page: no port, no websocket client, no races.
"""
import argparse
import base64
import fcntl
import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

SERVING = re.compile(r"kiln: serving (\S+) on (http://\S+)")


class Fail(Exception):
    pass


class Parser(argparse.ArgumentParser):
    def error(self, message):  # usage errors exit 1 (argparse's own is 2)
        self.print_usage(sys.stderr)
        self.exit(1, f"{self.prog}: error: {message}\n")


def start_server(kiln, model, extra, log_path):
    """Starts kiln serve with stderr to log_path; returns (process, url) once it listens."""
    log = open(log_path, "wb")
    proc = subprocess.Popen([kiln, "serve", "--model", model, "--port", "0"] + extra,
                            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    log.close()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with open(log_path, "r", errors="replace") as f:
            m = SERVING.search(f.read())
        if m:
            return proc, m.group(2).rstrip("/")
        if proc.poll() is not None:
            raise Fail(f"kiln serve exited with status {proc.returncode} before listening:\n"
                       + tail(log_path))
        time.sleep(0.1)
    raise Fail("kiln serve printed no 'kiln: serving NAME on URL' line within 60 s:\n" + tail(log_path))


def tail(path, lines=15):
    try:
        with open(path, "r", errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return ""


class DevTools:
    """The DevTools protocol over --remote-debugging-pipe: Chromium reads fd 3, writes fd 4."""

    def __init__(self, argv, log_path):
        to_chrome_r, self.to_chrome = os.pipe()
        self.from_chrome, from_chrome_w = os.pipe()

        def child_fds():  # move the two pipe ends to fds 3 and 4 (high copies first: no clobbering)
            a = fcntl.fcntl(to_chrome_r, fcntl.F_DUPFD, 10)
            b = fcntl.fcntl(from_chrome_w, fcntl.F_DUPFD, 10)
            os.dup2(a, 3)
            os.dup2(b, 4)

        log = open(log_path, "wb")
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                     close_fds=False, preexec_fn=child_fds)
        log.close()
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self.buf, self.next_id, self.session = b"", 0, None

    def call(self, method, timeout=30, **params):
        self.next_id += 1
        msg = {"id": self.next_id, "method": method, "params": params}
        if self.session and not method.startswith(("Target.", "Browser.")):
            msg["sessionId"] = self.session
        os.write(self.to_chrome, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            while b"\0" in self.buf:
                raw, self.buf = self.buf.split(b"\0", 1)
                reply = json.loads(raw)
                if reply.get("id") == self.next_id:
                    if "error" in reply:
                        raise Fail(f"DevTools {method}: {reply['error'].get('message')}")
                    return reply.get("result", {})
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.from_chrome], [], [], left)[0]:
                raise Fail(f"DevTools {method}: no answer within {timeout} s")
            data = os.read(self.from_chrome, 1 << 20)
            if not data:
                raise Fail(f"chromium closed the DevTools pipe (exit status {self.proc.poll()})")
            self.buf += data

    def evaluate(self, expression):
        r = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in r:
            raise Fail("page script failed: " + r["exceptionDetails"].get("text", "?"))
        return r["result"].get("value")

    def close(self):
        try:
            self.call("Browser.close", timeout=5)
        except (Fail, OSError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for fd in (self.to_chrome, self.from_chrome):
            os.close(fd)


STATE_JS = """(() => { const b = document.querySelectorAll('.msg.assistant');
  const last = b.length ? b[b.length - 1] : null;
  const part = (sel) => last && last.querySelector(sel) ? last.querySelector(sel).textContent : null;
  return { state: document.body ? document.body.dataset.state : null,
           reply: last ? (part('.reply') ?? last.textContent) : null,
           thinking: part('.thought'),
           errors: [...document.querySelectorAll('.msg.error')].map(e => e.textContent),
           status: (document.getElementById('status') || {}).textContent || '' }; })()"""


def check_page(chromium, page_url, expect, screenshot, timeout, tmp, dom_out):
    argv = [chromium, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
            "--disable-dev-shm-usage", "--remote-debugging-pipe", "--window-size=1000,800",
            "--hide-scrollbars", f"--user-data-dir={tmp}/profile", "about:blank"]
    chrome_log = os.path.join(tmp, "chromium.log")
    dt = DevTools(argv, chrome_log)
    try:
        try:
            targets = dt.call("Target.getTargets")["targetInfos"]
        except Fail as e:
            raise Fail(f"{e}\nchromium's log:\n{tail(chrome_log)}")
        page = next(t for t in targets if t["type"] == "page")
        dt.session = dt.call("Target.attachToTarget", targetId=page["targetId"], flatten=True)["sessionId"]
        dt.call("Emulation.setDeviceMetricsOverride", width=1000, height=800, deviceScaleFactor=1,
                mobile=False)
        dt.call("Page.enable")
        nav = dt.call("Page.navigate", url=page_url)
        if nav.get("errorText"):
            raise Fail(f"chromium could not open {page_url}: {nav['errorText']}")
        deadline, seen = time.monotonic() + timeout, {}
        while time.monotonic() < deadline:
            seen = dt.evaluate(STATE_JS) or {}
            if seen.get("state") == "idle" and (seen.get("reply") is not None or seen.get("errors")):
                break
            time.sleep(0.2)
        else:
            raise Fail(f"the reply did not finish within {timeout} s; the page shows {seen}")
        time.sleep(0.3)  # let the cursor blink and the layout settle before the picture
        png = dt.call("Page.captureScreenshot", format="png")["data"]
        with open(screenshot, "wb") as f:
            f.write(base64.b64decode(png))
        if dom_out:
            with open(dom_out, "w") as f:
                f.write(dt.evaluate("document.documentElement.outerHTML"))
    finally:
        dt.close()
    if seen.get("errors"):
        raise Fail("the page shows an error: " + " | ".join(seen["errors"]))
    if expect not in (seen.get("reply") or ""):
        raise Fail(f"the assistant's reply {seen.get('reply')!r} does not contain {expect!r}")
    return seen


def compare_with_api(url, prompt, query):
    """The page must show what the API answers to the same request (non-streamed): the reply as the
    content and the thinking as reasoning_content."""
    params = {k: v[-1] for k, v in urllib.parse.parse_qs(query).items()}
    with urllib.request.urlopen(url + "/v1/models", timeout=30) as r:
        model = json.load(r)["data"][0]["id"]
    body = {"model": model, "messages": [{"role": "user", "content": prompt}],
            "max_tokens": int(params.get("max_tokens", 512))}
    for key in ("temperature", "top_p"):
        if key in params:
            body[key] = float(params[key])
    req = urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(req, timeout=120) as r:
        message = json.load(r)["choices"][0]["message"]
    return message.get("content") or "", message.get("reasoning_content")


def main():
    ap = Parser(description="Checks kiln serve's chat page in headless Chromium.")
    ap.add_argument("--kiln", help="the kiln binary (started as `kiln serve --model DIR --port 0`)")
    ap.add_argument("--model", help="the model folder to serve")
    ap.add_argument("--serve-arg", action="append", default=[], help="one more argument for kiln serve")
    ap.add_argument("--url", help="an already running server's base URL (then --kiln is not started)")
    ap.add_argument("--expect", required=True, help="text the assistant's reply must contain")
    ap.add_argument("--screenshot", required=True, help="where to write the PNG")
    ap.add_argument("--chromium", default=None, help="the browser binary (default: chromium)")
    ap.add_argument("--prompt", default="Hi", help="the message to send (default: Hi)")
    ap.add_argument("--query", default="", help="more page parameters, e.g. 'temperature=0&max_tokens=16'")
    ap.add_argument("--timeout", type=float, default=120, help="seconds to wait for the reply")
    ap.add_argument("--dom", help="also write the final DOM (as --dump-dom would) to this file")
    ap.add_argument("--compare-api", action="store_true",
                    help="also ask the API the same (non-streamed) and require the page to show its content "
                         "and reasoning_content (the thinking box) exactly")
    args = ap.parse_args()
    if not args.url and not (args.kiln and args.model):
        ap.error("give --kiln and --model, or --url")

    chromium = shutil.which(args.chromium) if args.chromium else next(
        filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome"))), None)
    if not chromium:
        print("skipped: chromium not found", file=sys.stderr)
        return 77

    started = time.monotonic()
    server = None
    with tempfile.TemporaryDirectory(prefix="kiln-chat-check-") as tmp:
        server_log = os.path.join(tmp, "serve.log")
        try:
            if args.url:
                url = args.url.rstrip("/")
            else:
                server, url = start_server(args.kiln, args.model, args.serve_arg, server_log)
            query = "prompt=" + urllib.parse.quote(args.prompt) + "&send=1"
            if args.query:
                query += "&" + args.query.lstrip("&?")
            seen = check_page(chromium, f"{url}/?{query}", args.expect, args.screenshot,
                              args.timeout, tmp, args.dom)
            if args.compare_api:
                content, reasoning = compare_with_api(url, args.prompt, args.query.lstrip("&?"))
                if (seen.get("reply"), seen.get("thinking")) != (content or "(empty reply)", reasoning):
                    raise Fail(f"the page shows reply {seen.get('reply')!r} and thinking {seen.get('thinking')!r}; "
                               f"the API answers {content!r} and reasoning_content {reasoning!r}")
        except Fail as e:
            print(f"FAIL: {e}", file=sys.stderr)
            if server:
                print("kiln serve's last lines:\n" + tail(server_log), file=sys.stderr)
            return 1
        finally:
            if server and server.poll() is None:
                server.send_signal(signal.SIGTERM)
                try:
                    server.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    print("kiln serve ignored SIGTERM for 30 s; killing it", file=sys.stderr)
                    server.kill()
                    server.wait()
    print(f"ok: reply {seen['reply']!r} ({seen['status'].strip()}); screenshot {args.screenshot}; "
          f"{time.monotonic() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
