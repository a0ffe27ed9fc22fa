"""tests/integration/http_tools_family.py BASE_URL FAMILY KVCTL — tools in one
chat family's own format through kvd-http (t_http_tools_family.sh runs it
per family against a tiny random-weight model with that family's template,
t_constrained_gemma.sh with FAMILY gemma on Gemma 3 270M, whose template has
no tool format: the generic one; $KVD_SOCKET names kvd's socket for kvctl).

Checked (any failure raises):
  - rendering: a conversation with a system message, tools, a user
    message, an assistant tool call and its result has as many prompt
    tokens as the family's reference rendering of it, written out here from
    the reference template (Qwen 2.5's, Llama 3.1's, Mistral v0.3's; for
    Gemma, kvd's generic format in Gemma's turns) and
    tokenized by kvd with special tokens parsed (kvctl tokenize --special)
  - tool_choice naming a function: one call of it whose arguments validate
    against its parameters (jsonschema), finish_reason tool_calls; streamed,
    the argument deltas join to arguments that validate; the call is
    written in the family's shape: the prompt has the tokens of the
    reference rendering up to where the call's JSON begins (Qwen's and the
    generic format's "<tool_call>\n", Mistral's [TOOL_CALLS], nothing for
    Llama 3.1, whose call object has "parameters")
  - tool_choice required: one call of one of the tools, validating,
    streamed the same
  - tool_choice required with parallel_tool_calls true: 1 to 8 calls, each
    of a given tool with arguments that validate; streamed the same
  - round trip: the call and its result sent back are answered, and the
    same request again reads its prompt from the prefix cache
  - tool_choice auto: each family's call shape, written by the model (held
    to it by guided_choice), comes back as tool_calls, streamed and not:
    Qwen's <tool_call> block, Llama 3.1's {"name", "parameters"} objects
    joined by "; ", Mistral's JSON array of calls
"""
import json
import subprocess
import sys

import jsonschema
import openai

base, family, kvctl = sys.argv[1], sys.argv[2], sys.argv[3]
client = openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0)
model = client.models.list().data[0].id
EOS = "<|im_end|>"  # the tiny models' EOS token


def ok(msg):
    print(f"ok: {family}: {msg}", flush=True)


CITY = {"enum": ["Paris", "Rome"]}
TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": CITY, "days": {"type": "integer", "minimum": 1,
                                                                               "maximum": 7}},
                       "required": ["city", "days"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "get_time", "description": "Time in a city",
        "parameters": {"type": "object", "properties": {"city": CITY}, "required": ["city"],
                       "additionalProperties": False}}},
]
PARAMS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
ARGS = {"city": "Paris", "days": 2}
CONVO = [{"role": "system", "content": "Be brief."},
         {"role": "user", "content": "Weather in Paris for 2 days?"},
         {"role": "assistant", "content": None, "tool_calls": [
             {"id": "call_abcdefghi", "type": "function",
              "function": {"name": "get_weather", "arguments": json.dumps(ARGS)}}]},
         {"role": "tool", "tool_call_id": "call_abcdefghi", "content": "21 C"}]


def dumps(v, indent=None):
    return json.dumps(v, ensure_ascii=False, indent=indent)


# ---- the references, from the templates' text -----------------------------------------
def qwen():
    block = ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided "
             "with function signatures within <tools></tools> XML tags:\n<tools>" +
             "".join("\n" + dumps(t) for t in TOOLS) +
             "\n</tools>\n\nFor each function call, return a json object with function name and arguments "
             "within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
             "<args-json-object>}\n</tool_call>")
    return ("<|im_start|>system\nBe brief.\n\n" + block + "<|im_end|>\n"
            "<|im_start|>user\nWeather in Paris for 2 days?<|im_end|>\n"
            "<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": " + dumps(ARGS) +
            "}\n</tool_call><|im_end|>\n"
            "<|im_start|>user\n<tool_response>\n21 C\n</tool_response><|im_end|>\n<|im_start|>assistant\n")


def llama3():
    h = lambda role: "<|start_header_id|>" + role + "<|end_header_id|>\n\n"
    tools = "".join(dumps(t, indent=4) + "\n\n" for t in TOOLS)
    return (h("system") + "Environment: ipython\nCutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n"
            "Be brief.<|eot_id|>" + h("user") +
            "Given the following functions, please respond with a JSON for a function call with its proper "
            "arguments that best answers the given prompt.\n\nRespond in the format {\"name\": function name, "
            "\"parameters\": dictionary of argument name and its value}.Do not use variables.\n\n" + tools +
            "Weather in Paris for 2 days?<|eot_id|>" + h("assistant") +
            "{\"name\": \"get_weather\", \"parameters\": " + dumps(ARGS) + "}<|eot_id|>" +
            h("ipython") + dumps("21 C") + "<|eot_id|>" + h("assistant"))


def mistral():
    def fn(f):
        return ", ".join(('"%s": "%s"' % (k, v)) if isinstance(v, str) else ('"%s": %s' % (k, dumps(v)))
                         for k, v in f.items() if k != "return")
    tools = ", ".join('{"type": "function", "function": {' + fn(t["function"]) + "}}" for t in TOOLS)
    call = dumps({"name": "get_weather", "arguments": ARGS})[:-1] + ', "id": "abcdefghi"}'
    # the system message only joins a last user message; here a tool result is last
    return ("[AVAILABLE_TOOLS] [" + tools + "][/AVAILABLE_TOOLS][INST] Weather in Paris for 2 days?[/INST]"
            "[TOOL_CALLS] [" + call + "]" + EOS +
            '[TOOL_RESULTS] {"content": 21 C, "call_id": "abcdefghi"}[/TOOL_RESULTS]')


def gemma():
    # no tool format of its own: the generic texts (Qwen's) in Gemma's turns;
    # the system message opens the first user turn, contents are trimmed
    block = qwen().split("<|im_start|>system\nBe brief.\n\n", 1)[1].split("<|im_end|>", 1)[0]
    call = ("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": " + dumps(ARGS) + "}\n</tool_call>")
    return ("<start_of_turn>user\nBe brief.\n\n" + block + "\n\nWeather in Paris for 2 days?<end_of_turn>\n"
            "<start_of_turn>model\n" + call + "<end_of_turn>\n"
            "<start_of_turn>user\n<tool_response>\n21 C\n</tool_response><end_of_turn>\n<start_of_turn>model\n")


want = {"qwen3": qwen, "llama3": llama3, "mistral": mistral, "gemma": gemma}[family]()
bos = ["--bos"] if family == "gemma" else []  # Gemma's prompts start with BOS
tok = subprocess.run([kvctl, "tokenize", "--special", "--json", *bos, "-"], input=want.encode(), capture_output=True,
                     check=True)
want_n = json.loads(tok.stdout)["count"]
r = client.chat.completions.create(model=model, messages=CONVO, tools=TOOLS, tool_choice="none", max_tokens=1)
assert r.usage.prompt_tokens == want_n, (r.usage.prompt_tokens, want_n, want)
ok(f"a conversation with tools, a call and its result: {want_n} prompt tokens, as the reference rendering")


# ---- forced calls ------------------------------------------------------------------------
def check_call(name, args_text):
    assert name in PARAMS, name
    jsonschema.validate(json.loads(args_text), PARAMS[name])


def streamed(**kw):
    calls, finish = {}, None
    for ch in client.chat.completions.create(model=model, stream=True, **kw):
        if not ch.choices:
            continue
        c = ch.choices[0]
        for d in c.delta.tool_calls or []:
            e = calls.setdefault(d.index, {"id": None, "name": None, "args": ""})
            if d.id:
                e["id"], e["name"] = d.id, d.function.name
            e["args"] += d.function.arguments or ""
        finish = c.finish_reason or finish
    return [calls[i] for i in sorted(calls)], finish


named = {"type": "function", "function": {"name": "get_weather"}}
msgs = CONVO[:2]


def opened():
    # the reference rendering of msgs with the call's opener: the rendering
    # with the call in it, cut where the call's JSON begins
    if family == "mistral":  # the system message joins the user turn, last here
        return want.split("[INST]", 1)[0] + "[INST] Be brief.\n\nWeather in Paris for 2 days?[/INST][TOOL_CALLS]"
    return want[:want.index('{"name": "get_weather", "' + ("parameters" if family == "llama3" else "arguments"))]


tok = subprocess.run([kvctl, "tokenize", "--special", "--json", *bos, "-"], input=opened().encode(),
                     capture_output=True, check=True)
open_n = json.loads(tok.stdout)["count"]
r = client.chat.completions.create(model=model, messages=msgs, tools=TOOLS, tool_choice=named, max_tokens=800,
                                   temperature=0)
assert r.usage.prompt_tokens == open_n, (r.usage.prompt_tokens, open_n, opened())
ch = r.choices[0]
assert ch.finish_reason == "tool_calls" and len(ch.message.tool_calls) == 1, ch
call = ch.message.tool_calls[0]
assert call.function.name == "get_weather", call
check_call(call.function.name, call.function.arguments)
s_calls, s_finish = streamed(messages=msgs, tools=TOOLS, tool_choice=named, max_tokens=800, temperature=0)
assert s_finish == "tool_calls" and len(s_calls) == 1 and s_calls[0]["name"] == "get_weather", s_calls
assert json.loads(s_calls[0]["args"]) == json.loads(call.function.arguments), (s_calls, call)
ok(f"named: get_weather({json.dumps(json.loads(call.function.arguments))}) validates, streamed the same; "
   f"its prompt ({open_n} tokens) ends with the family's call opener")

r = client.chat.completions.create(model=model, messages=msgs, tools=TOOLS, tool_choice="required", max_tokens=800,
                                   temperature=0)
ch = r.choices[0]
assert ch.finish_reason == "tool_calls" and len(ch.message.tool_calls) == 1, ch
one = ch.message.tool_calls[0]
check_call(one.function.name, one.function.arguments)
s_calls, s_finish = streamed(messages=msgs, tools=TOOLS, tool_choice="required", max_tokens=800, temperature=0)
assert s_finish == "tool_calls" and len(s_calls) == 1 and s_calls[0]["name"] == one.function.name and \
    json.loads(s_calls[0]["args"]) == json.loads(one.function.arguments), (s_calls, one)
ok(f"required: {one.function.name}({json.dumps(json.loads(one.function.arguments))}) validates, streamed the same")

r = client.chat.completions.create(model=model, messages=msgs, tools=TOOLS, tool_choice="required",
                                   parallel_tool_calls=True, max_tokens=2400, temperature=0)
ch = r.choices[0]
assert ch.finish_reason == "tool_calls" and 1 <= len(ch.message.tool_calls) <= 8, ch
for c in ch.message.tool_calls:
    check_call(c.function.name, c.function.arguments)
s_calls, s_finish = streamed(messages=msgs, tools=TOOLS, tool_choice="required", parallel_tool_calls=True,
                             max_tokens=2400, temperature=0)
assert s_finish == "tool_calls" and [(c["name"], json.loads(c["args"])) for c in s_calls] == \
    [(c.function.name, json.loads(c.function.arguments)) for c in ch.message.tool_calls], (s_calls, ch)
ok(f"required with parallel_tool_calls: {len(s_calls)} call(s) "
   f"({', '.join(c.function.name for c in ch.message.tool_calls)}) validate, streamed the same")

# ---- a round trip --------------------------------------------------------------------------
loop = msgs + [{"role": "assistant", "content": None, "tool_calls": [
    {"id": call.id, "type": "function", "function": {"name": call.function.name,
                                                     "arguments": call.function.arguments}}]},
    {"role": "tool", "tool_call_id": call.id, "content": "21 C"}]
a = client.chat.completions.create(model=model, messages=loop, tools=TOOLS, max_tokens=8, temperature=0)
b = client.chat.completions.create(model=model, messages=loop, tools=TOOLS, max_tokens=8, temperature=0)
cached = b.usage.prompt_tokens_details.cached_tokens if b.usage.prompt_tokens_details else 0
assert a.choices[0].finish_reason and cached > 0, (a, b.usage)
ok(f"round trip answered; sent again, {cached} of {b.usage.prompt_tokens} prompt tokens from the cache")

# ---- auto: every family's call shape is parsed --------------------------------------------
SHAPES = [
    ("qwen", '<tool_call>\n{"name": "get_time", "arguments": {"city": "Paris"}}\n</tool_call>',
     [("get_time", {"city": "Paris"})]),
    ("llama3", '{"name": "get_weather", "parameters": {"city": "Rome", "days": 3}}; '
               '{"name": "get_time", "parameters": {"city": "Rome"}}',
     [("get_weather", {"city": "Rome", "days": 3}), ("get_time", {"city": "Rome"})]),
    ("mistral", '[{"name": "get_time", "arguments": {"city": "Rome"}, "id": "abcdefghi"}]',
     [("get_time", {"city": "Rome"})]),
]
for shape, text, want_calls in SHAPES:
    extra = {"guided_choice": [text]}
    r = client.chat.completions.create(model=model, messages=msgs, tools=TOOLS, max_tokens=200, temperature=0,
                                       extra_body=extra)
    ch = r.choices[0]
    got = [(c.function.name, json.loads(c.function.arguments)) for c in ch.message.tool_calls or []]
    assert ch.finish_reason == "tool_calls" and got == want_calls and not ch.message.content, (shape, ch)
    s_calls, s_finish = streamed(messages=msgs, tools=TOOLS, max_tokens=200, temperature=0, extra_body=extra)
    assert s_finish == "tool_calls" and [(c["name"], json.loads(c["args"])) for c in s_calls] == want_calls, \
        (shape, s_calls)
ok("auto: Qwen's <tool_call>, Llama 3.1's '; '-joined objects and Mistral's call array parsed, streamed too")
