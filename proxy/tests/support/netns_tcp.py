"""TCP endpoints for the capture tests, run inside a test network namespace (ip netns exec),
as `python3 -c "$(cat netns_tcp.py)" ARGS...`.

serve DEADLINE_S TAG:PORT[,TAG:PORT...]
    Listens on 0.0.0.0 on every PORT, prints "ready" once all are bound, and answers each
    connection with one line "TAG ORIGINAL_DESTINATION" (the destination the client asked for,
    read with SO_ORIGINAL_DST when netfilter redirected the connection, else the address it
    reached). Exits after DEADLINE_S seconds whatever happens, so nothing outlives a test.

connect HOST PORT [SOURCE]
    Connects (from SOURCE when given), prints the line the server answers, and exits; gives up
    after 10 seconds.
"""

import selectors
import socket
import struct
import sys
import time

SO_ORIGINAL_DST = 80


def original_destination(conn):
    try:
        raw = conn.getsockopt(socket.SOL_IP, SO_ORIGINAL_DST, 16)
        port, addr = struct.unpack("!2xH4s8x", raw)
        return "%s:%d" % (socket.inet_ntoa(addr), port)
    except OSError:
        host, port = conn.getsockname()[:2]
        return "%s:%d" % (host, port)


def serve(deadline_s, spec):
    deadline = time.monotonic() + float(deadline_s)
    sel = selectors.DefaultSelector()
    for entry in spec.split(","):
        tag, port = entry.split(":")
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("0.0.0.0", int(port)))
        sock.listen(64)
        sel.register(sock, selectors.EVENT_READ, tag)
    print("ready", flush=True)
    while time.monotonic() < deadline:
        for key, _ in sel.select(timeout=1.0):
            conn, _ = key.fileobj.accept()
            with conn:
                conn.sendall(("%s %s\n" % (key.data, original_destination(conn))).encode())


def connect(host, port, source=None):
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.settimeout(10)
    if source:
        sock.bind((source, 0))
    sock.connect((host, int(port)))
    data = b""
    while not data.endswith(b"\n"):
        chunk = sock.recv(256)
        if not chunk:
            break
        data += chunk
    sys.stdout.write(data.decode())


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve(sys.argv[2], sys.argv[3])
    elif sys.argv[1] == "connect":
        connect(*sys.argv[2:5])
    else:
        sys.exit("usage: netns_tcp.py serve DEADLINE_S TAG:PORT,... | connect HOST PORT [SOURCE]")
