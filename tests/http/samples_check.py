#!/usr/bin/env python3
"""tests/http/samples_check.py — kvd-http's n and log-probabilities, driven by the official `openai` package.

Usage: samples_check.py BASE_URL API_KEY MODEL KVCTL KVD_SOCKET

Each check prints "ok: ..." or raises (exit status 1 with the traceback):
  - chat with n = 3 and a seed: three choices, indices 0..2, reproducible;
    choice 0 is the n = 1 answer with that seed; usage counts the prompt once
    and the tokens of every choice; streamed (with include_usage) it gives
    the same three texts, each choice with its own finish chunk
  - chat with logprobs and top_logprobs = 5 (greedy): one entry per
    generated token, the tokens spell the content, bytes are the token's
    UTF-8, each top_logprobs has 5 entries in decreasing order headed by the
    chosen token; streamed, the same entries arrive with the chunks
  - completions with n = 2 and logprobs = 3, streaming and not: tokens,
    token_logprobs, top_logprobs, text_offset per choice, consistent with
    the text; greedy, the values equal what `kvctl generate --logprobs 3
    --json` reports for the same prompt (the gateway passes kvd's numbers
    through exactly; tests/integration/t_samples.sh checks kvd's against
    the NumPy reference)
  - n = 16 (the most) is served; n = 17, top_logprobs = 21, completions'
    logprobs = 21 and best_of = 2 are 400 errors naming the parameter
"""
import json
import subprocess
import sys

import openai

base, key, model, kvctl, sock = sys.argv[1:6]
client = openai.OpenAI(base_url=base, api_key=key, max_retries=0, timeout=120)


def ok(msg):
    print("ok:", msg, flush=True)


MSGS = [{"role": "user", "content": "Write one sentence about the sea."}]

# ---- chat, n = 3, seeded
kw = dict(model=model, messages=MSGS, max_tokens=20, temperature=0.9, seed=5)
a = client.chat.completions.create(n=3, **kw)
b = client.chat.completions.create(n=3, **kw)
one = client.chat.completions.create(**kw)
assert [c.index for c in a.choices] == [0, 1, 2], a
texts = [c.message.content for c in a.choices]
assert texts == [c.message.content for c in b.choices], "n = 3 with a seed is not reproducible"
assert texts[0] == one.choices[0].message.content, (texts[0], one.choices[0].message.content)
assert len(set(texts)) >= 2, texts
assert all(c.finish_reason in ("stop", "length") for c in a.choices)
assert a.usage.prompt_tokens == one.usage.prompt_tokens, (a.usage, one.usage)
assert one.usage.completion_tokens <= a.usage.completion_tokens <= 3 * 20, a.usage
chunks = list(client.chat.completions.create(n=3, stream=True, stream_options={"include_usage": True}, **kw))
streamed, finish, roles = ["", "", ""], {}, set()
for ch in chunks:
    for c in ch.choices:
        if c.delta.role:
            roles.add(c.index)
        streamed[c.index] += c.delta.content or ""
        if c.finish_reason:
            finish[c.index] = c.finish_reason
assert roles == {0, 1, 2}, roles
assert streamed == texts, (streamed, texts)
assert finish == {c.index: c.finish_reason for c in a.choices}, finish
assert chunks[-1].usage and chunks[-1].usage.completion_tokens == a.usage.completion_tokens, chunks[-1]
ok(f"chat n = 3, seed 5: {texts}; choice 0 = the n = 1 answer; reproducible; the same streamed; "
   f"usage {a.usage.prompt_tokens} + {a.usage.completion_tokens}")

# ---- chat, log-probabilities
kw = dict(model=model, messages=[{"role": "user", "content": "Count from one to twenty in words."}],
          max_tokens=8, temperature=0, logprobs=True, top_logprobs=5)
r = client.chat.completions.create(**kw)
content = r.choices[0].logprobs.content
assert r.choices[0].finish_reason == "length", r
assert len(content) == r.usage.completion_tokens == 8, (len(content), r.usage)
assert "".join(t.token for t in content) == r.choices[0].message.content, (content, r.choices[0].message.content)
for t in content:
    assert t.logprob <= 0 and len(t.top_logprobs) == 5, t
    assert bytes(t.bytes) == t.token.encode(), t
    lps = [x.logprob for x in t.top_logprobs]
    assert lps == sorted(lps, reverse=True), lps
    assert t.top_logprobs[0].token == t.token and t.top_logprobs[0].logprob == t.logprob, t  # greedy
s = list(client.chat.completions.create(stream=True, **kw))
got = [e for ch in s for c in ch.choices if c.logprobs and c.logprobs.content for e in c.logprobs.content]
assert [(e.token, e.logprob) for e in got] == [(e.token, e.logprob) for e in content], got
ok(f"chat logprobs: {len(content)} tokens {[t.token for t in content]}, first {content[0].logprob:.4f}, "
   f"top-5 sorted, headed by the greedy choice; the same streamed")

# ---- completions, n = 2 and logprobs = 3
PROMPT = "The three primary colours are red, yellow and"
kw = dict(model=model, prompt=PROMPT, max_tokens=6, temperature=0, logprobs=3)
r = client.completions.create(n=2, **kw)
assert [c.index for c in r.choices] == [0, 1]
for c in r.choices:
    lp = c.logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 6, lp
    assert "".join(lp.tokens) == c.text, (lp.tokens, c.text)
    off = 0
    for t, o, top in zip(lp.tokens, lp.text_offset, lp.top_logprobs):
        assert o == off, (o, off)
        off += len(t.encode())
        assert len(top) == 3 and max(top.values()) == top.get(t), (t, top)
s = list(client.completions.create(n=2, stream=True, **kw))
for i in (0, 1):
    toks = [t for ch in s for c in ch.choices if c.index == i and c.logprobs for t in c.logprobs.tokens]
    assert toks == r.choices[i].logprobs.tokens, (i, toks)
kv = json.loads(subprocess.run([kvctl, "--socket", sock, "generate", "--raw", "--temperature", "0", "--max-tokens", "6",
                                "--logprobs", "3", "--json", PROMPT], capture_output=True, text=True, check=True).stdout)
assert kv["text"] == r.choices[0].text, (kv["text"], r.choices[0].text)
for e, v in zip(kv["logprobs"], r.choices[0].logprobs.token_logprobs):
    assert abs(e["logprob"] - v) < 1e-5, (e, v)
ok(f"completions n = 2, logprobs 3: {r.choices[0].text!r}, tokens {r.choices[0].logprobs.tokens}, "
   f"token_logprobs equal kvctl's; text_offset consistent; the same streamed")

# ---- limits
r = client.chat.completions.create(model=model, messages=MSGS, max_tokens=2, n=16, temperature=1.0)
assert len(r.choices) == 16
ok("n = 16 served")


def expect400(fn, param):
    try:
        fn()
    except openai.BadRequestError as e:
        assert e.body.get("param") == param, e.body
        ok(f"{param}: 400 {e.body.get('message', '')[:90]}")
        return
    raise AssertionError(f"{param}: no 400")


expect400(lambda: client.chat.completions.create(model=model, messages=MSGS, n=17), "n")
expect400(lambda: client.chat.completions.create(model=model, messages=MSGS, logprobs=True, top_logprobs=21),
          "top_logprobs")
expect400(lambda: client.completions.create(model=model, prompt="x", logprobs=21), "logprobs")
expect400(lambda: client.completions.create(model=model, prompt="x", best_of=2), "best_of")
