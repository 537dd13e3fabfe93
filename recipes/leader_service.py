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
- 503 when nothing was written: this replica does not lead, its sidecar does
  not answer, the resource refused the token as stale (leadership has moved
  on) or could not be reached; the load balancer may send the request again
  elsewhere. When it does not lead, it answers after `--hold-off` (50 ms),
  which gives the balancer time to see the new leader first;
- 502 when the resource answered another error, and 504 when its answer did
  not come in time: the write may have landed, so these must not be retried
  blindly;
- 400, 411 or 413 for a request without one usable `Content-Length` (two,
  or a `Transfer-Encoding`, are refused) or with a body over 1 MiB.

On SIGTERM it stops taking connections and finishes the requests under way.

`GET /` answers the same 200 or 503 without writing.
"""

import argparse
import http.client
import http.server
import json
import signal
import sys
import threading
import time
import urllib.error
import urllib.request


# The largest body taken, and how long a client may take to send a request.
MAX_BODY = 1 << 20
CLIENT_TIMEOUT = 10


def leadership(sidecar):
    """(token, deadline on the monotonic clock) while leading, else None."""
    asked = time.monotonic()
    try:
        with urllib.request.urlopen(sidecar + "/leader", timeout=1) as answer:
            body = json.load(answer)
        return int(body["token"]), asked + body["valid_for_ms"] / 1000
    except (OSError, ValueError, KeyError, TypeError, http.client.HTTPException):
        return None  # 503 (HTTPError is an OSError), no answer, or a bad body


def write(resource, token, deadline, body):
    """This service's answer to a write: 200, 503 (nothing written), 502 or
    504 (the write may have landed)."""
    left = deadline - time.monotonic()
    if left <= 0:
        return 503  # nothing sent
    request = urllib.request.Request(
        resource, data=body, method="PUT", headers={"Fencing-Token": str(token)}
    )
    try:
        with urllib.request.urlopen(request, timeout=left) as reply:
            return 200 if reply.status < 300 else 502
    except urllib.error.HTTPError as refused:
        if refused.code == 409:
            print(f"token {token} is stale; not written", file=sys.stderr)
            return 503
        return 502
    except urllib.error.URLError as failed:
        # Refused before anything was sent: nothing written.
        return 503 if isinstance(failed.reason, ConnectionRefusedError) else 504
    except (OSError, http.client.HTTPException):
        return 504  # sent, and no answer in time: the write may have landed


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = CLIENT_TIMEOUT
    # Headers and body go out in two writes: without this, Nagle's
    # algorithm holds the body until the client's delayed ACK (40 ms).
    disable_nagle_algorithm = True

    def do_GET(self):
        self.serve(None)

    def do_POST(self):
        lengths = self.headers.get_all("Content-Length") or []
        if "Transfer-Encoding" in self.headers or len(lengths) > 1:
            # Two lengths, or a chunked body, could hide a second request.
            self.close_connection = True
            return self.answer(400, {"error": "one Content-Length and no Transfer-Encoding"})
        length = lengths[0] if lengths else None
        if length is None:
            return self.answer(411, {"error": "a write needs a Content-Length"})
        if not length.isdigit():
            return self.answer(400, {"error": "Content-Length is not a number"})
        if int(length) > MAX_BODY:
            return self.answer(413, {"error": f"a body of at most {MAX_BODY} bytes"})
        self.serve(self.rfile.read(int(length)))

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
            code = write(config.resource, token, deadline, body)
            if code != 200:
                error = "not written" if code == 503 else "the write may have landed"
                return self.answer(code, {"id": config.id, "error": error})
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
    # On SIGTERM: stop taking connections, finish the requests under way.
    server.daemon_threads = False
    server.config = config
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    print(f"{config.id}: serving on {config.listen}", file=sys.stderr, flush=True)
    server.serve_forever()
    server.server_close()


if __name__ == "__main__":
    main()
