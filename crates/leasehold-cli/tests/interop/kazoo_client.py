"""A client of kazoo's Election, for leasehold's interop tests and benchmark
(crates/leasehold-cli/tests/cli/interop.rs, benches/interop.rs): what a
Python service using kazoo's recipe does. Run in a virtual environment that
the test harness makes, with kazoo from PyPI.

  python kazoo_client.py contend HOSTS PATH ID TIMEOUT_SEC
    Contends with client.Election(PATH, ID).run(func) and prints, one line
    per event:
      queued NODE     its node is created (NODE: the node's path)
      leader ID       func was called: it leads
      releasing       on SIGTERM or SIGINT, as func returns (the election is
                      left when it has returned)
      released        the election is left and the client closed
    A SIGTERM or SIGINT while it waits in line cancels its campaign.

  python kazoo_client.py observe HOSTS PATH
    Prints `leader ID` (contenders()[0]) or `none` whenever it changes,
    polling every 50 ms.

Every line is flushed as it is printed; kazoo's logging goes to stderr.
"""

import signal
import sys
import threading
import time

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError


_SAY = threading.Lock()


def say(line):
    # One write per line, under a lock: print() writes the text and the
    # newline separately, so lines of two threads could mix.
    with _SAY:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def contend(hosts, path, ident, timeout):
    client = KazooClient(hosts=hosts, timeout=timeout)
    client.start()
    election = client.Election(path, ident)
    stop = threading.Event()
    leading = threading.Event()

    def on_signal(_signum, _frame):
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    def lead():
        leading.set()
        say(f"leader {ident}")
        stop.wait()
        say("releasing")

    worker = threading.Thread(target=election.run, args=(lead,))
    worker.start()
    queued = False
    # Polls for the node until it is created; a signal wakes the wait at
    # once in any case.
    while not stop.wait(0.5 if queued else 0.01):
        node = election.lock.node
        if not queued and node is not None:
            say(f"queued {path}/{node}")
            queued = True
    if not leading.is_set():
        election.cancel()
    worker.join()
    client.stop()
    client.close()
    say("released")


def observe(hosts, path):
    client = KazooClient(hosts=hosts, timeout=10.0)
    client.start()
    election = client.Election(path)
    shown = None
    while True:
        try:
            contenders = election.contenders()
        except NoNodeError:
            contenders = []
        now = f"leader {contenders[0]}" if contenders else "none"
        if now != shown:
            say(now)
            shown = now
        time.sleep(0.05)


def main(args):
    if len(args) == 5 and args[0] == "contend":
        contend(args[1], args[2], args[3], float(args[4]))
    elif len(args) == 3 and args[0] == "observe":
        observe(args[1], args[2])
    else:
        sys.exit(
            "usage: kazoo_client.py contend HOSTS PATH ID TIMEOUT_SEC"
            " | observe HOSTS PATH"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
