#!/usr/bin/env python3
"""A service that writes only while its replica leads (Python, standard library only).

Run one beside each replica's `leasehold sidecar`, behind a load balancer:

    python3 leader_service.py --listen 127.0.0.1:9001 --id web-1 \
        --sidecar http://127.0.0.1:8001 --resource http://127.0.0.1:8080/objects/orders

Each `POST /` is a write of its body to the protected resource. The service
asks its sidecar's `/leader` when the request arrives (a sub-millisecond
local call) and writes only on a 200, with the answer's token in the
`Fencing-Token` header and a timeout that ends with the answer's
`valid_for_ms`, counted from when it asked. It answers:

- 200 `{"id": ID, "token": T}` once the resource accepted the write;
- 503 when this replica does not lead, its sidecar does not answer, or the
  resource refused the token as stale (leadership has moved on): nothing was
  written, so the load balancer may retry the request elsewhere. When it does
  not lead, it answers after `--hold-off` (50 ms), which gives the balancer
  time to see the new leader before it sends the request again.

`GET /` answers the same 200 or 503 without writing.
"""

import argparse
import http.client
import http.server
import json
import sys
import time
import urllib.error
import urllib.request


def leadership(sidecar):
    """(token, deadline on the monotonic clock) while leading, else None."""
    asked = time.monotonic()
    try:
        with urllib.request.urlopen(sidecar + "/leader", timeout=1) as answer:
            body = json.load(answer)
    except (OSError, ValueError, http.client.HTTPException):
        return None  # 503 (HTTPError is an OSError), no answer, or a bad body
    return body["token"], asked + body["valid_for_ms"] / 1000


def write(resource, token, deadline, body):
    """The resource's status code, or None when it could not be asked in time."""
    left = deadline - time.monotonic()
    if left <= 0:
        return None
    request = urllib.request.Request(
        resource, data=body, method="PUT", headers={"Fencing-Token": str(token)}
    )
    try:
        with urllib.request.urlopen(request, timeout=left) as reply:
            return reply.status
    except urllib.error.HTTPError as refused:
        return refused.code
    except (OSError, http.client.HTTPException):
        return None


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body go out in two writes: without this, Nagle's
    # algorithm holds the body until the client's delayed ACK (40 ms).
    disable_nagle_algorithm = True

    def do_GET(self):
        self.serve(None)

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        self.serve(self.rfile.read(length))

    def serve(self, body):
        config = self.server.config
        held = leadership(config.sidecar)
        if held is None:
            # Sent here, the request found a leader that has just stepped
            # down (or the balancer's view is stale): give the balancer a
            # moment to see the new leader before it sends the request again.
            time.sleep(config.hold_off)
            return self.answer(503, {"id": config.id, "error": "not leading"})
        token, deadline = held
        if body is not None:
            status = write(config.resource, token, deadline, body)
            if status == 409:
                print(f"{config.id}: token {token} is stale; not writing", file=sys.stderr)
            if status is None or status >= 300:
                return self.answer(503, {"id": config.id, "error": f"not written ({status})"})
        self.answer(200, {"id": config.id, "token": token})

    def answer(self, code, body):
        data = json.dumps(body).encode() + b"\n"
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--listen", required=True, help="HOST:PORT to serve on")
    parser.add_argument("--id", required=True, help="this replica's name, in answers")
    parser.add_argument("--sidecar", required=True, help="the sidecar's --http, as http://HOST:PORT")
    parser.add_argument("--resource", required=True, help="URL the fenced writes go to")
    parser.add_argument(
        "--hold-off", type=float, default=0.05, metavar="SECONDS",
        help="wait before a 503 for not leading (0.05): with HAProxy's three "
        "retries, a request outlasts one 100 ms health check interval",
    )
    config = parser.parse_args()
    host, _, port = config.listen.rpartition(":")
    server = http.server.ThreadingHTTPServer((host, int(port)), Handler)
    server.config = config
    print(f"{config.id}: serving on {config.listen}", file=sys.stderr, flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
