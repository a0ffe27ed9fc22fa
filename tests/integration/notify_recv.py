#!/usr/bin/env python3
"""A stand-in for systemd's notification socket, for integration tests.

    notify_recv.py SOCKET_PATH LOG_PATH

Binds an AF_UNIX datagram socket at SOCKET_PATH and appends every line of
every datagram it receives (READY=1, STATUS=..., WATCHDOG=1, ...) to
LOG_PATH as "<seconds since start> <line>", flushed at once. Runs until
killed.
"""
import os
import socket
import sys
import time

path, log = sys.argv[1], sys.argv[2]
try:
    os.unlink(path)
except FileNotFoundError:
    pass
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(path)
t0 = time.monotonic()
with open(log, "a", buffering=1) as f:
    while True:
        data = s.recv(65536)
        for line in data.decode("utf-8", "replace").splitlines():
            f.write("%.3f %s\n" % (time.monotonic() - t0, line))
