"""A two-rank program that stands in for a multi-node engine (a server on node 1, a worker on node 2).

Standard library only.

    python3 rank_standin.py server <listen address> <peer port> <service port>
    python3 rank_standin.py worker <server address> <peer port>
    python3 rank_standin.py hold                                 (sleeps until killed)

The server (rank 0) listens for its worker on ``<peer port>`` and opens ``<service port>`` only once the worker has
connected and named its host, as a server that needs its remote workers answers nothing before they are there. Each
client of the service port gets one JSON line: the server's hostname, the worker's hostname and the address the
worker connected from. The server exits when its worker's connection closes. The worker (rank 1) connects (retrying
for 60 s: it may start first), sends its hostname and holds the connection until killed.
"""
from __future__ import annotations

import json
import socket
import sys
import threading
import time


def server(address: str, peer_port: int, service_port: int) -> None:
    with socket.create_server((address, peer_port)) as peers:
        worker, (worker_addr, _) = peers.accept()
    worker_host = worker.makefile().readline().strip()
    answer = json.dumps({"server_host": socket.gethostname(), "worker_host": worker_host,
                         "worker_address": worker_addr}) + "\n"
    service = socket.create_server((address, service_port))

    def serve() -> None:
        while True:
            client, _ = service.accept()
            with client:
                client.sendall(answer.encode())

    threading.Thread(target=serve, daemon=True).start()
    worker.recv(1)  # returns b"" when the worker goes away
    sys.exit("server: the worker's connection closed")


def worker(address: str, peer_port: int) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            conn = socket.create_connection((address, peer_port), timeout=2)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    conn.settimeout(None)
    conn.sendall((socket.gethostname() + "\n").encode())
    conn.recv(1)  # held until the server or this process goes away


def main(argv: list[str]) -> None:
    role = argv[0]
    if role == "server":
        server(argv[1], int(argv[2]), int(argv[3]))
    elif role == "worker":
        worker(argv[1], int(argv[2]))
    elif role == "hold":
        time.sleep(3600)
    else:
        sys.exit(f"unknown role {role!r}: server, worker or hold")


if __name__ == "__main__":
    main(sys.argv[1:])
