#!/usr/bin/env python3
"""A stand-in for systemd's file-descriptor store, for t_restart_cache.sh.

    fdstore_check.py KVD RAW MODEL DIR PROMPT

Plays the service manager for a series of kvd runs, without systemd: binds
a notification socket (NOTIFY_SOCKET), starts kvd, waits for READY=1, runs
one generation with kvd_raw, stops kvd with SIGTERM, and keeps the fds kvd
stores with FDSTORE=1 (answering BARRIER=1 as systemd does, by closing the
fd that comes with it). The next run gets fds back as systemd passes them:
LISTEN_FDS from fd 3, LISTEN_FDNAMES, LISTEN_PID. Cases:

  cold            no fds passed (the reference run)
  valid           the pool and index as stored: adopted
  corrupt-index   the index with one byte flipped, in a sealed memfd
  unsealed-index  the index's bytes in a memfd without seals
  hostile-index   an entry pointing past the pool, checksum recomputed
  pipe-pool       a pipe in place of the pool
  unsealed-pool   the pool's bytes in a memfd without the shrink seal
  short-pool      the pool's first half, sealed
  index-only      the index without a pool
  cuda            the genuine fds (copies) to kvd on the CUDA plug-in, when
                  $KVD_TEST_CUDA_PLUGIN names one (the emulated build of
                  tests/gpu/t_cuda_emulated.sh): its pool is in device memory

For every case it writes DIR/CASE.log (kvd's stderr), DIR/CASE.out (the
generated text), DIR/CASE.ids (token ids) and DIR/CASE.done (the DONE line);
DIR/stored-CASE.txt lists the names kvd stored at its stop. The shell test
judges them. $KVD_TEST_POOL_SIZE (default 2M) sizes the pool; $KVD_TEST_ARGS
adds kvd options (e.g. a swap file). Exits non-zero only when the harness itself fails (kvd not
ready, a client error).
"""
import array
import fcntl
import os
import signal
import socket
import subprocess
import sys
import time

KVD, RAW, MODEL, DIR, PROMPT = sys.argv[1:6]
SOCK = os.path.join(DIR, "kvd.sock")
NOTIFY = os.path.join(DIR, "notify.sock")
M64 = (1 << 64) - 1


def persist_sum(b):
    """kvmm/persist.c's checksum (the field at offset 24 read as 0)."""
    n = len(b)
    h = (0x6B76642D70657273 ^ n) & M64
    i = 0
    while i + 8 <= n:
        v = 0 if i == 24 else int.from_bytes(b[i:i + 8], "little")
        h = ((h ^ v) * 0x9E3779B97F4A7C15) & M64
        h ^= h >> 29
        i += 8
    while i < n:
        h = ((h ^ b[i]) * 0x100000001B3) & M64
        i += 1
    h ^= h >> 33
    h = (h * 0xFF51AFD7ED558CCD) & M64
    h ^= h >> 33
    return h


def read_fd(fd):
    size = os.fstat(fd).st_size
    return os.pread(fd, size, 0)


F_ADD_SEALS = 1033  # F_LINUX_SPECIFIC_BASE + 9
ALL_SEALS = 1 | 2 | 4 | 8  # F_SEAL_SEAL | SHRINK | GROW | WRITE
SHRINK_GROW = 2 | 4


def memfd(data, seals):
    """A memfd holding data, with the given seals added."""
    fd = os.memfd_create("test", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
    if seals:
        fcntl.fcntl(fd, F_ADD_SEALS, seals)
    return fd

ns = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
try:
    os.unlink(NOTIFY)
except FileNotFoundError:
    pass
ns.bind(NOTIFY)
ns.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)


def receive(store, timeout):
    """One datagram: lines, fds handled as systemd would. False on timeout."""
    ns.settimeout(timeout)
    try:
        msg, anc, _, _ = ns.recvmsg(65536, socket.CMSG_SPACE(16 * 4) + socket.CMSG_SPACE(12))
    except socket.timeout:
        return None
    fds = []
    for level, typ, data in anc:
        if level == socket.SOL_SOCKET and typ == socket.SCM_RIGHTS:
            a = array.array("i")
            a.frombytes(data[: len(data) - (len(data) % 4)])
            fds.extend(a)
    lines = msg.decode("utf-8", "replace").splitlines()
    kv = dict(l.split("=", 1) for l in lines if "=" in l)
    if kv.get("BARRIER") == "1":
        for fd in fds:
            os.close(fd)
    elif kv.get("FDSTORE") == "1" and fds:
        name = kv.get("FDNAME", "stored")
        for fd in fds:
            store.append((name, fd))
    elif kv.get("FDSTOREREMOVE") == "1":
        keep = []
        for n, f in store:
            if n == kv.get("FDNAME"):
                os.close(f)
            else:
                keep.append((n, f))
        store[:] = keep
    else:
        for fd in fds:
            os.close(fd)
    return lines


def run(case, passed, plugin=None):
    """Start kvd with `passed` [(name, fd)], generate once, stop it.
    Returns the [(name, fd)] it stored."""
    env = dict(os.environ, NOTIFY_SOCKET=NOTIFY)
    backend = ["--backend", "cpu"]
    if plugin:
        env.update(KVD_CUDA_PLUGIN=plugin, KVD_CUDA_EMULATED="1")
        backend = ["--backend", "cuda"]
    for k in ("LISTEN_FDS", "LISTEN_FDNAMES", "LISTEN_PID"):
        env.pop(k, None)
    high = [os.dup(fd) for _, fd in passed]  # above 3 + len: dup2 cannot clobber a source
    if passed:
        env["LISTEN_FDS"] = str(len(passed))
        env["LISTEN_FDNAMES"] = ":".join(n for n, _ in passed)

    def child():
        for i, fd in enumerate(high):
            os.dup2(fd, 3 + i)

    cmd = ["/bin/sh", "-c", 'LISTEN_PID=$$; [ -n "$LISTEN_FDS" ] && export LISTEN_PID; exec "$0" "$@"', KVD,
           "--config", "/dev/null", "--model", MODEL, "--socket", SOCK, "--threads", "2", "--pool-size", os.environ.get("KVD_TEST_POOL_SIZE", "2M")] + backend + os.environ.get("KVD_TEST_ARGS", "").split()
    log = open(os.path.join(DIR, case + ".log"), "wb")
    p = subprocess.Popen(cmd, env=env, stderr=log, preexec_fn=child, pass_fds=tuple(range(3, 3 + len(high))))
    log.close()
    for fd in high:
        os.close(fd)
    store = []
    deadline = time.monotonic() + 60
    ready = False
    while not ready and time.monotonic() < deadline and p.poll() is None:
        lines = receive(store, 0.2)
        ready = bool(lines) and "READY=1" in lines
    if not ready:
        p.kill()
        sys.exit("%s: kvd not ready (exit %s)" % (case, p.poll()))
    with open(os.path.join(DIR, case + ".out"), "wb") as out, open(os.path.join(DIR, case + ".err"), "wb") as err:
        r = subprocess.run([RAW, "-s", SOCK, "generate", "--raw", "--ids", "-n", "16", "--seed", "5",
                            "--temperature", "0.7", PROMPT], stdout=out, stderr=err, timeout=120)
    if r.returncode != 0:
        p.kill()
        sys.exit("%s: generate failed: %s" % (case, open(os.path.join(DIR, case + ".err")).read()))
    errl = open(os.path.join(DIR, case + ".err")).read().splitlines()
    with open(os.path.join(DIR, case + ".ids"), "w") as f:
        f.write("".join(l + "\n" for l in errl if l.startswith("id ")))
    with open(os.path.join(DIR, case + ".done"), "w") as f:
        f.write("".join(l + "\n" for l in errl if l.startswith("DONE")))
    p.send_signal(signal.SIGTERM)
    while p.poll() is None:
        receive(store, 0.1)
    while receive(store, 0.05) is not None:
        pass
    with open(os.path.join(DIR, "stored-%s.txt" % case), "w") as f:
        f.write("".join(n + "\n" for n, _ in store))
    return store


stored = run("cold", [])
names = dict(stored)
if set(names) != {"kv-pool", "kv-index"}:
    sys.exit("cold run stored %s, expected kv-pool and kv-index" % sorted(names))
pool, index = names["kv-pool"], names["kv-index"]
index_bytes = read_fd(index)

pool_bytes = read_fd(pool)
# Every case but the last gets a copy of the pool (sealed as kvd seals it):
# a kvd that adopts it writes to it, which must not touch the original.


def pool_copy():
    return memfd(pool_bytes, SHRINK_GROW)


cases = []
bad = bytearray(index_bytes)
bad[len(bad) // 2] ^= 0x10
cases.append(("corrupt-index", lambda: [("kv-pool", pool_copy()), ("kv-index", memfd(bytes(bad), ALL_SEALS))]))
cases.append(("unsealed-index", lambda: [("kv-pool", pool_copy()), ("kv-index", memfd(index_bytes, 0))]))
hostile = bytearray(index_bytes)
owner = int.from_bytes(hostile[52:56], "little")
e0 = 64 + ((owner + 7) & ~7)
hostile[e0 + 4:e0 + 8] = hostile[44:48]  # entry 0's page := n_pages
hostile[24:32] = persist_sum(bytes(hostile)).to_bytes(8, "little")
cases.append(("hostile-index", lambda: [("kv-pool", pool_copy()), ("kv-index", memfd(bytes(hostile), ALL_SEALS))]))


def pipe_pool():
    r, w = os.pipe()
    os.close(w)
    return [("kv-pool", r), ("kv-index", memfd(index_bytes, ALL_SEALS))]


cases.append(("pipe-pool", pipe_pool))
cases.append(("unsealed-pool", lambda: [("kv-pool", memfd(pool_bytes, 0)), ("kv-index", memfd(index_bytes, ALL_SEALS))]))
cases.append(("short-pool", lambda: [("kv-pool", memfd(pool_bytes[: len(pool_bytes) // 2], SHRINK_GROW)),
                                     ("kv-index", memfd(index_bytes, ALL_SEALS))]))
cases.append(("index-only", lambda: [("kv-index", memfd(index_bytes, ALL_SEALS))]))

plugin = os.environ.get("KVD_TEST_CUDA_PLUGIN")
for name, make in cases + ([("cuda", lambda: [("kv-pool", pool_copy()), ("kv-index", memfd(index_bytes, ALL_SEALS))])]
                           if plugin else []):
    passed = make()
    for _, fd in run(name, passed, plugin if name == "cuda" else None):
        os.close(fd)
    for _, fd in passed:
        os.close(fd)
# Last, the genuine fds: adopted.
run("valid", [("kv-pool", pool), ("kv-index", index)])
