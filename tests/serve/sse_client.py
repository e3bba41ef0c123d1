"""A minimal asyncio HTTP/1.1 client for server-sent-event streams (stdlib only), for the load and
operations tests: thousands of concurrent streams without a third-party HTTP stack.

stream_post(host, port, path, body, headers, on_event=None, stop_after=None) sends one POST and
returns (status, headers, events) where events are the parsed `data:` JSON objects ([DONE] as the
string "[DONE]"); stop_after=k closes the connection after k events (a client that goes away).
"""
import asyncio
import json


async def _read_chunked(reader):
    while True:
        size_line = await reader.readline()
        if not size_line:
            return
        size = int(size_line.split(b";")[0].strip() or b"0", 16)
        if size == 0:
            await reader.readline()
            return
        data = await reader.readexactly(size)
        await reader.readexactly(2)
        yield data


async def stream_post(host, port, path, body, headers=None, stop_after=None, on_event=None):
    reader, writer = await asyncio.open_connection(host, port)
    try:
        payload = json.dumps(body).encode()
        head = f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n" \
               f"Content-Length: {len(payload)}\r\nConnection: close\r\n"
        for k, v in (headers or {}).items():
            head += f"{k}: {v}\r\n"
        writer.write(head.encode() + b"\r\n" + payload)
        await writer.drain()
        status_line = await reader.readline()
        status = int(status_line.split()[1])
        resp_headers = {}
        while True:
            line = await reader.readline()
            if line in (b"\r\n", b""):
                break
            k, v = line.decode().split(":", 1)
            resp_headers[k.strip().lower()] = v.strip()
        events, buf = [], b""
        if resp_headers.get("transfer-encoding") != "chunked":
            raw = await reader.read()
            return status, resp_headers, [json.loads(raw)] if raw else []
        async for data in _read_chunked(reader):
            buf += data
            while b"\n\n" in buf:
                block, buf = buf.split(b"\n\n", 1)
                for line in block.split(b"\n"):
                    if line.startswith(b"data: "):
                        text = line[6:].decode()
                        ev = "[DONE]" if text == "[DONE]" else json.loads(text)
                        events.append(ev)
                        if on_event:
                            on_event(ev)
                if stop_after is not None and len(events) >= stop_after:
                    return status, resp_headers, events
        return status, resp_headers, events
    finally:
        writer.close()
        try:
            await writer.wait_closed()
        except (ConnectionError, OSError):
            pass
