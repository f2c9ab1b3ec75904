#!/usr/bin/env python3
"""A convlog agent: exec kind (stdin/stdout), or http kind with a port."""
import json, sys, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

def turn(req):
    text = req["prompt"]["text"]
    yield {"type": "thinking", "delta": f"{len(text.split())} words. "}
    yield {"type": "tool_started", "id": "t1", "name": "count", "args": {"text": text}}
    yield {"type": "tool_ended", "id": "t1", "content": {"words": len(text.split())}}
    yield {"type": "x-progress", "pct": 50}  # unknown types: relayed unchanged
    if text.startswith("fail"):
        yield {"type": "failed", "details": "asked to", "code": "asked_to_fail"}
        return
    for word in text.split():
        time.sleep(0.05 if "slow" in text else 0)
        yield {"type": "text", "delta": word.upper() + " "}
    yield {"type": "completed", "data": {"session": req["scope"]["session"]}}

class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-ndjson")
        self.end_headers()
        for ev in turn(req):
            self.wfile.write((json.dumps(ev) + "\n").encode())
            self.wfile.flush()

if len(sys.argv) > 1:  # http kind: python3 agent.py PORT (0: any free port)
    server = ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler)
    print(server.server_port, flush=True)
    server.serve_forever()
else:  # exec kind: one turn, the request on stdin, the events on stdout
    for ev in turn(json.load(sys.stdin)):
        print(json.dumps(ev), flush=True)
