#!/usr/bin/env python3
"""tests/http/openai_check.py — kvd-http driven by the official `openai` package.

Usage: openai_check.py BASE_URL API_KEY MODEL

Each check prints "ok: ..." or raises (exit status 1 with the traceback):
  - non-streaming chat: text, finish_reason, usage with cached_tokens
  - streaming chat with stream_options.include_usage: the streamed text
    equals the non-streamed one (greedy), and the usage chunk comes last
  - a repeated system prompt is found in kvd's prefix cache (cached_tokens)
  - text completions, streaming and not, equal to each other
  - seed makes a sampled answer reproducible; max_completion_tokens bounds
    it; content as text parts equals the same content as a string
  - stop strings end the text before the stop string
  - a multi-turn conversation, re-sent whole with each new turn (earlier
    user and assistant turns): every turn finds all full KV pages of the
    previous prompt in kvd's prefix cache, so cached_tokens grows turn by
    turn; streamed and non-streamed turns give the same text
  - 32 concurrent greedy streams each equal their solo run
  - errors as the client library's exception classes: 400 for a (legacy)
    function message, a conversation ending in an assistant message, n > 16 and
    top_logprobs without logprobs; 404 for an unknown model; 401 for a
    wrong key (n and log-probabilities themselves: samples_check.py)
"""
import sys
import threading

import openai

base, key, model = sys.argv[1:4]
client = openai.OpenAI(base_url=base, api_key=key, max_retries=0, timeout=120)


def ok(msg):
    print("ok:", msg, flush=True)


SYS = ("You are a concise assistant for a systems engineering team. Answer in one short sentence, "
       "without lists, and never invent facts you are not sure about.")


def chat(user, stream=False, **kw):
    msgs = [{"role": "system", "content": SYS}, {"role": "user", "content": user}]
    return client.chat.completions.create(model=model, messages=msgs, stream=stream, **kw)


# ---- non-streaming chat
r = chat("What is the capital of France?", max_tokens=24, temperature=0)
text = r.choices[0].message.content
assert r.object == "chat.completion" and r.choices[0].message.role == "assistant", r
assert text and r.choices[0].finish_reason in ("stop", "length"), r
assert r.usage.completion_tokens >= 1 and r.usage.prompt_tokens > 20, r.usage
assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
ok(f"chat: {text!r} ({r.usage.prompt_tokens} prompt tokens)")

# ---- streaming chat, same request: same text, usage last
chunks = list(chat("What is the capital of France?", stream=True, max_tokens=24, temperature=0,
                   stream_options={"include_usage": True}))
streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
assert streamed == text, (streamed, text)
assert chunks[0].choices[0].delta.role == "assistant"
finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
assert finish == [r.choices[0].finish_reason], finish
assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == r.usage.completion_tokens
assert all(c.usage is None for c in chunks[:-1])
# the system prompt (and more) was just computed: it is found in the prefix cache
assert chunks[-1].usage.prompt_tokens_details.cached_tokens >= 16, chunks[-1].usage
ok(f"streamed chat equals the non-streamed text; usage chunk last; "
   f"cached_tokens {chunks[-1].usage.prompt_tokens_details.cached_tokens} of {chunks[-1].usage.prompt_tokens}")

r2 = chat("Name one planet.", max_tokens=8, temperature=0)
assert r2.usage.prompt_tokens_details.cached_tokens >= 16, r2.usage
ok(f"a shared system prompt is reused: cached_tokens {r2.usage.prompt_tokens_details.cached_tokens}")

# ---- a multi-turn conversation: the whole history goes with every turn and
# kvd renders it with the model's template; the earlier turns come from the
# prefix cache. BLOCK is kvd's default block_size (tokens per KV page): the
# cache holds full pages, so at most the previous prompt's last partial page
# is computed again.
BLOCK = 16
conv = [{"role": "system", "content": SYS}]
prev_prompt, prev_cached, grown, cached_seen = 0, -1, [], []
for turn, question in enumerate(["Name a colour.", "Name another one.", "And a third one?", "Which of them is darkest?"]):
    conv.append({"role": "user", "content": question})
    r = client.chat.completions.create(model=model, messages=conv, max_tokens=16, temperature=0)
    answer = r.choices[0].message.content
    cached, prompt = r.usage.prompt_tokens_details.cached_tokens, r.usage.prompt_tokens
    if turn > 0:
        assert prompt > prev_prompt, (turn, prompt, prev_prompt)
        assert cached >= prev_prompt // BLOCK * BLOCK, (turn, cached, prev_prompt, r.usage)
        assert cached >= prev_cached, (turn, cached, prev_cached)
        # the same turn streamed: same text, and now its own prompt is cached
        chunks = list(client.chat.completions.create(model=model, messages=conv, max_tokens=16, temperature=0,
                                                     stream=True, stream_options={"include_usage": True}))
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == answer, (chunks, answer)
        assert chunks[-1].usage.prompt_tokens == prompt
        assert chunks[-1].usage.prompt_tokens_details.cached_tokens >= prompt // BLOCK * BLOCK, chunks[-1].usage
    grown.append(f"{cached}/{prompt}")
    conv.append({"role": "assistant", "content": answer})
    prev_prompt, prev_cached = prompt, cached
    cached_seen.append(cached)
assert cached_seen[-1] >= cached_seen[0] + 3 * BLOCK, cached_seen
ok(f"multi-turn conversation, re-sent each turn: cached/prompt tokens {' -> '.join(grown)}")

# ---- seed: a sampled (not greedy) answer is reproducible; max_completion_tokens bounds it;
# content given as text parts is the same message
kw = dict(max_completion_tokens=12, temperature=1.0, top_p=0.9, seed=1234)
a1 = chat("Tell me a story.", **kw)
a2 = client.chat.completions.create(model=model, messages=[
    {"role": "system", "content": [{"type": "text", "text": SYS}]},
    {"role": "user", "content": [{"type": "text", "text": "Tell me "}, {"type": "text", "text": "a story."}]}], **kw)
assert a1.choices[0].message.content == a2.choices[0].message.content, (a1, a2)
assert a1.usage.completion_tokens <= 12 and a1.choices[0].finish_reason in ("length", "stop")
others = {chat("Tell me a story.", **dict(kw, seed=sd)).choices[0].message.content for sd in (1, 2, 3)}
assert len(others | {a1.choices[0].message.content}) > 1, "the seed changes nothing"
ok(f"seed 1234 at temperature 1 gives the same {a1.usage.completion_tokens} tokens twice (text parts too); other seeds differ")

# ---- text completions
c = client.completions.create(model=model, prompt="Once upon a time", max_tokens=20, temperature=0)
ctext = c.choices[0].text
assert c.object == "text_completion" and ctext and c.usage.prompt_tokens >= 3
cs = "".join(x.choices[0].text for x in client.completions.create(
    model=model, prompt="Once upon a time", max_tokens=20, temperature=0, stream=True) if x.choices)
assert cs == ctext, (cs, ctext)
ok(f"completions: {ctext!r}, streamed the same")

# ---- stop strings: cut before the first occurrence
assert len(ctext) > 4
word = ctext.strip().split()[1] if len(ctext.strip().split()) > 1 else ctext.strip()[:2]
s = client.completions.create(model=model, prompt="Once upon a time", max_tokens=20, temperature=0, stop=[word])
assert s.choices[0].finish_reason == "stop", s
assert s.choices[0].text == ctext[:ctext.index(word)], (s.choices[0].text, ctext, word)
ss = list(chat("What is the capital of France?", stream=True, max_tokens=24, temperature=0, stop="Paris"))
st = "".join(x.choices[0].delta.content or "" for x in ss if x.choices)
if "Paris" in text:
    assert st == text[:text.index("Paris")], (st, text)
    assert [x.choices[0].finish_reason for x in ss if x.choices and x.choices[0].finish_reason] == ["stop"]
ok(f"stop strings: {word!r} -> {s.choices[0].text!r}; 'Paris' -> {st!r}")

# ---- 32 concurrent greedy streams == solo runs
N = 32
prompts = [f"Write one sentence about the number {i * 7 + 3}." for i in range(N)]


def run(i, out):
    st = client.chat.completions.create(model=model, messages=[{"role": "user", "content": prompts[i]}],
                                        max_tokens=20, temperature=0, stream=True)
    out[i] = "".join(x.choices[0].delta.content or "" for x in st if x.choices)


solo = [None] * N
for i in range(N):
    run(i, solo)
conc = [None] * N
threads = [threading.Thread(target=run, args=(i, conc)) for i in range(N)]
for t in threads:
    t.start()
for t in threads:
    t.join()
bad = [i for i in range(N) if solo[i] != conc[i] or not solo[i]]
assert not bad, [(i, solo[i], conc[i]) for i in bad]
ok(f"{N} concurrent streams each equal their solo run")

# ---- errors, as the client library sees them
def expect(exc, fn, what):
    try:
        fn()
    except exc as e:
        ok(f"{what}: {type(e).__name__} {e.status_code}: {e.body.get('message', '')[:80] if isinstance(e.body, dict) else e}")
        return e
    raise AssertionError(f"{what}: no {exc.__name__}")


e = expect(openai.BadRequestError, lambda: client.chat.completions.create(
    model=model, messages=[{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]),
    "a conversation ending in an assistant message")
assert e.body.get("param") == "messages", e.body
e = expect(openai.BadRequestError, lambda: client.chat.completions.create(
    model=model, messages=[{"role": "user", "content": "a"}, {"role": "function", "content": "b", "name": "f"},
                           {"role": "user", "content": "c"}]), "a (legacy) function message")
assert e.body.get("param") == "messages[1].role", e.body
e = expect(openai.BadRequestError, lambda: client.chat.completions.create(
    model=model, n=17, messages=[{"role": "user", "content": "a"}]), "n = 17")
assert e.body.get("param") == "n"
e = expect(openai.BadRequestError, lambda: client.chat.completions.create(
    model=model, top_logprobs=2, messages=[{"role": "user", "content": "a"}]), "top_logprobs without logprobs")
assert e.body.get("param") == "top_logprobs"
expect(openai.NotFoundError, lambda: client.chat.completions.create(
    model="no-such-model", messages=[{"role": "user", "content": "a"}]), "unknown model")
bad_key = openai.OpenAI(base_url=base, api_key="wrong-" + key, max_retries=0)
expect(openai.AuthenticationError, lambda: bad_key.models.list(), "wrong API key")
assert [m.id for m in client.models.list()] == [model]
ok("models.list names the served model")
