#!/usr/bin/env python3
"""Tell HAProxy at once that this replica leads (or, with `down`, no longer does).

    leasehold sidecar --id web-1 ... --on-elected 'python3 haproxy_hook.py up'

Sets server $LEASEHOLD_ID of backend `leader` up or down through HAProxy's
runtime API, the socket $HAPROXY_ADMIN, rather than waiting for its next
health check (which confirms or corrects it 100 ms later). The recipe pushes
only `up`: a replica that stepped down answers 503 by itself, and marking it
down at once could leave HAProxy a moment with no server up.
"""

import os
import re
import socket
import sys

state = {"up": "up", "down": "down"}[sys.argv[1]]
server = os.environ["LEASEHOLD_ID"]
# A server name of HAProxy's, nothing that could end the command.
if not re.fullmatch(r"[A-Za-z0-9_.:-]{1,64}", server):
    sys.exit(f"{server!r} cannot be a HAProxy server name")
command = f"set server leader/{server} health {state}\n"
with socket.socket(socket.AF_UNIX) as admin:
    admin.settimeout(1)
    admin.connect(os.environ["HAPROXY_ADMIN"])
    admin.sendall(command.encode())
    reply = admin.recv(4096).decode().strip()
if reply:
    sys.exit(f"haproxy: {reply}")
