#!/usr/bin/env python3
"""burst.py URL N MAX_TOKENS [TIMEOUT_S]: N concurrent completions against kvd-http.

Prints one JSON line: {"codes": {status: count}, "errors": {code: count},
"wall_s": ...}. Every request is a distinct short prompt; all are started
at once (a barrier) on their own connection.
"""
import collections
import http.client
import json
import sys
import threading
import time
import urllib.parse

url, n, max_tokens = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
timeout = float(sys.argv[4]) if len(sys.argv) > 4 else 60
u = urllib.parse.urlparse(url)
codes = collections.Counter()
errors = collections.Counter()
lock = threading.Lock()
barrier = threading.Barrier(n)


def one(i):
    body = json.dumps({"prompt": f"Request {i}: count from one to", "max_tokens": max_tokens, "temperature": 0})
    try:
        c = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
        c.connect()
        barrier.wait(timeout=timeout)
        c.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        r = c.getresponse()
        data = r.read()
        status = r.status
        code = None
        if status != 200:
            try:
                code = json.loads(data)["error"].get("code")
            except Exception:
                code = "unparsed"
        elif not json.loads(data)["choices"][0]["text"] and max_tokens > 0:
            code = "empty"
        c.close()
    except Exception as e:  # a refused or cut connection
        status, code = 0, type(e).__name__
    with lock:
        codes[status] += 1
        if code:
            errors[f"{status}:{code}"] += 1


t0 = time.time()
ts = [threading.Thread(target=one, args=(i,)) for i in range(n)]
for t in ts:
    t.start()
for t in ts:
    t.join()
print(json.dumps({"codes": {str(k): v for k, v in sorted(codes.items())}, "errors": dict(errors),
                  "wall_s": round(time.time() - t0, 2)}))
