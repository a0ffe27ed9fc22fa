"""tests/integration/http_structured.py BASE_URL — structured output, tools
and the route table of kvd-http, driven by t_http_structured.sh against the
default model (SmolLM2-135M-Instruct), greedy.

Checked (prints "ok: ..." per check, "skipped: ..." for a part this build
cannot run; any failure raises):
  - routes: an unknown path is 404 unknown_url; a known path with another
    method is 405 with an Allow header naming the path's methods
  - two constraints in one request (and a constraint with a forced tool
    call) are a 400 invalid_constraint naming both; a response_format type
    other than text/json_object/json_schema is a 400 naming it
  - tools are rendered in the documented generic format: a conversation
    with tools, an assistant tool call and two tool results gives the same
    prompt tokens and the same answer as the same text sent as plain
    system/user/assistant messages
  - tool_choice auto: a <tool_call> block the model writes comes back as
    tool_calls (id call_..., finish_reason tool_calls), streamed as a first
    delta with id and name and argument deltas that join to the same
    arguments; text without a call streams token by token
  - with kvd 0.7.0 (structured output): response_format json_schema on a
    suite of schemas — every output that ends with "stop" parses and
    validates (jsonschema), one cut by max_tokens says "length";
    json_object; a GBNF grammar; guided_choice; guided_regex; json_schema
    on /v1/completions; an invalid schema is a 400 with the pointer, an
    invalid grammar a 400 with line and column; tool_choice required and
    named through the openai package, streamed (the arguments in deltas as
    they are generated) and not, with a round trip (the call's result sent
    back, the model answers)
"""
import json
import re
import sys
import urllib.error
import urllib.request

import jsonschema
import openai

base = sys.argv[1]
client = openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0)
model = client.models.list().data[0].id


def ok(msg):
    print("ok: " + msg, flush=True)


def skip(msg):
    print("skipped: " + msg, flush=True)


def req(method, path, body=None):
    data = json.dumps(body).encode() if body is not None else None
    r = urllib.request.Request(base + path, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(r, timeout=120) as resp:
            return resp.status, resp.headers, json.load(resp)
    except urllib.error.HTTPError as e:
        return e.code, e.headers, json.load(e)


def chat(body, **kw):
    b = {"model": model, "temperature": 0, "max_tokens": 120}
    b.update(body)
    b.update(kw)
    return req("POST", "/v1/chat/completions", b)


def sse(body):
    """The events of a streamed chat request (parsed), up to [DONE]."""
    b = {"model": model, "temperature": 0, "max_tokens": 120, "stream": True}
    b.update(body)
    r = urllib.request.Request(base + "/v1/chat/completions", data=json.dumps(b).encode(),
                               headers={"Content-Type": "application/json"})
    events = []
    with urllib.request.urlopen(r, timeout=120) as resp:
        for line in resp:
            line = line.decode().strip()
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                return events
            events.append(json.loads(line[6:]))
    raise AssertionError("stream without [DONE]")


USER = [{"role": "user", "content": "Tell me about a person."}]
TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Get the current weather in a city",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "maxLength": 40},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "get_time", "description": "Get the local time in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40}},
                       "required": ["city"], "additionalProperties": False}}},
]
PARAMS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}

# ---- routes --------------------------------------------------------------------------
st, h, j = req("GET", "/v1/nope")
assert st == 404 and j["error"]["code"] == "unknown_url", (st, j)
for method, path, allow in [("GET", "/v1/chat/completions", "POST"), ("POST", "/v1/models", "GET"),
                            ("DELETE", "/health", "GET"), ("PUT", "/v1/models/x", "GET")]:
    st, h, j = req(method, path, {} if method != "GET" else None)
    assert st == 405 and h.get("Allow") == allow and j["error"]["code"] == "method_not_allowed", (method, path, st,
                                                                                                  dict(h), j)
ok("route table: unknown path 404; a wrong method 405 with Allow (POST for generation, GET for the rest)")

# ---- refusals that need no model -------------------------------------------------------
for extra, second in [({"response_format": {"type": "json_object"}, "grammar": 'root ::= "a"'}, "grammar"),
                      ({"guided_regex": "a+", "guided_choice": ["a", "b"]}, "guided_choice"),
                      ({"json_schema": {"type": "object"}, "guided_json": {"type": "object"}}, "guided_json")]:
    st, _, j = chat({"messages": USER, **extra})
    first = [k for k in extra if k != second][0]
    e = j["error"]
    assert st == 400 and e["code"] == "invalid_constraint" and e["param"] == second, (extra, st, j)
    assert f"'{first}'" in e["message"] and f"'{second}'" in e["message"], e
st, _, j = chat({"messages": USER, "guided_json": {"type": "object"}, "tools": TOOLS, "tool_choice": "required"})
assert st == 400 and j["error"]["code"] == "invalid_constraint" and "tool_choice" in j["error"]["message"] and \
    "guided_json" in j["error"]["message"], j
st, _, j = chat({"messages": USER, "response_format": {"type": "xml"}})
assert st == 400 and j["error"]["param"] == "response_format.type", j
st, _, j = chat({"messages": USER, "tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}})
assert st == 400 and j["error"]["param"] == "tool_choice", j
ok("two constraints (or one with a forced tool call): 400 invalid_constraint naming both; bad type / unknown tool: 400")

# ---- the rendering of tools, calls and results ------------------------------------------
args = '{"city": "Paris", "unit": "celsius"}'
convo = [{"role": "system", "content": "You are a helpful assistant."},
         {"role": "user", "content": "What is the weather and the time in Paris?"},
         {"role": "assistant", "content": None, "tool_calls": [
             {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": args}},
             {"id": "call_2", "type": "function", "function": {"name": "get_time", "arguments": '{"city": "Paris"}'}}]},
         {"role": "tool", "tool_call_id": "call_1", "content": "22 degrees, sunny"},
         {"role": "tool", "tool_call_id": "call_2", "content": "14:05"}]
block = ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
         "You are provided with function signatures within <tools></tools> XML tags:\n<tools>" +
         "".join("\n" + json.dumps(t) for t in TOOLS) +
         "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
         "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
         "<args-json-object>}\n</tool_call>")
plain = [{"role": "system", "content": "You are a helpful assistant.\n\n" + block},
         {"role": "user", "content": "What is the weather and the time in Paris?"},
         {"role": "assistant", "content":
          '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n</tool_call>\n'
          '<tool_call>\n{"name": "get_time", "arguments": {"city": "Paris"}}\n</tool_call>'},
         {"role": "user", "content": "<tool_response>\n22 degrees, sunny\n</tool_response>\n"
          "<tool_response>\n14:05\n</tool_response>"}]
st, _, a = chat({"messages": convo, "tools": TOOLS, "max_tokens": 24})
assert st == 200, a
st, _, b = chat({"messages": plain, "max_tokens": 24})
assert st == 200, b
assert a["usage"]["prompt_tokens"] == b["usage"]["prompt_tokens"], (a["usage"], b["usage"])
ca, cb = a["choices"][0]["message"], b["choices"][0]["message"]
assert ca.get("content") == cb["content"] or ca.get("tool_calls"), (ca, cb)
ok(f"tools, an assistant's two tool calls and two tool results render as the generic format "
   f"({a['usage']['prompt_tokens']} prompt tokens, as the same text in plain turns)")

# ---- tool_choice auto: calls the model writes are parsed ---------------------------------
echo = [{"role": "user", "content": 'Reply with exactly this text and nothing else: <tool_call>\n'
         '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n</tool_call>'}]
st, _, j = chat({"messages": echo, "tools": TOOLS, "max_tokens": 60})
assert st == 200, j
ch = j["choices"][0]
calls = ch["message"].get("tool_calls")
if not calls:
    raise AssertionError(f"auto: the model's <tool_call> was not parsed: {ch}")
assert ch["finish_reason"] == "tool_calls", ch
assert re.fullmatch(r"call_[A-Za-z0-9]{24}", calls[0]["id"]) and calls[0]["type"] == "function", calls
assert calls[0]["function"]["name"] == "get_weather", calls
assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Paris", "unit": "celsius"}, calls
events = sse({"messages": echo, "tools": TOOLS, "max_tokens": 60})
deltas = [c["delta"] for e in events for c in e["choices"]]
tc = [d["tool_calls"][0] for d in deltas if d.get("tool_calls")]
assert tc and tc[0]["id"].startswith("call_") and tc[0]["function"]["name"] == "get_weather", deltas
assert len(tc) >= 2 and all("id" not in t for t in tc[1:]), tc
assert "".join(t["function"]["arguments"] for t in tc) == calls[0]["function"]["arguments"], tc
assert events[-1]["choices"][0]["finish_reason"] == "tool_calls", events[-1]
events = sse({"messages": [{"role": "user", "content": "Write two sentences about the sea."}], "tools": TOOLS,
              "max_tokens": 30})
pieces = [c["delta"]["content"] for e in events for c in e["choices"] if c["delta"].get("content")]
finish = [c["finish_reason"] for e in events for c in e["choices"] if c.get("finish_reason")]
assert len(pieces) >= 5 and finish in (["stop"], ["length"]), (pieces, finish)
ok(f"tool_choice auto without a call: the text streams as it comes ({len(pieces)} content deltas)")
ok(f"tool_choice auto: the model's <tool_call> block comes back as tool_calls ({calls[0]['function']['arguments']}), "
   f"streamed as a first delta with id and name and {len(tc) - 1} argument deltas")

# ---- structured output (kvd 0.7.0) ---------------------------------------------------------
st, _, j = chat({"messages": USER, "response_format": {"type": "json_object"}, "max_tokens": 80})
if st == 400 and j["error"].get("code") == "unsupported_parameter":
    skip(f"structured output and forced tool calls: {j['error']['message']}")
    sys.exit(0)
assert st == 200, j
text = j["choices"][0]["message"]["content"]
if j["choices"][0]["finish_reason"] == "stop":
    assert isinstance(json.loads(text), dict), text
ok(f"response_format json_object: {text[:60]!r} ({j['choices'][0]['finish_reason']})")

SCHEMAS = [
    {"type": "object", "properties": {"name": {"type": "string", "maxLength": 30},
                                      "age": {"type": "integer", "minimum": 0, "maximum": 120}},
     "required": ["name", "age"], "additionalProperties": False},
    {"type": "object", "properties": {"colour": {"enum": ["red", "green", "blue"]}, "ok": {"type": "boolean"}},
     "required": ["colour", "ok"], "additionalProperties": False},
    {"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string", "maxLength": 12},
                                               "minItems": 1, "maxItems": 3}},
     "required": ["tags"], "additionalProperties": False},
    {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                      "where": {"type": "object", "properties": {
                                          "lat": {"type": "number"}, "lon": {"type": "number"}},
                                          "required": ["lat", "lon"], "additionalProperties": False}},
     "required": ["city", "where"], "additionalProperties": False},
    {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "minItems": 2, "maxItems": 4},
    {"anyOf": [{"type": "object", "properties": {"kind": {"const": "cat"}, "lives": {"type": "integer",
                                                                                    "minimum": 1, "maximum": 9}},
                "required": ["kind", "lives"], "additionalProperties": False},
               {"type": "object", "properties": {"kind": {"const": "dog"}}, "required": ["kind"],
                "additionalProperties": False}]},
]
stops = 0
for i, schema in enumerate(SCHEMAS):
    st, _, j = chat({"messages": USER, "max_tokens": 160,
                     "response_format": {"type": "json_schema",
                                         "json_schema": {"name": f"s{i}", "schema": schema, "strict": True}}})
    assert st == 200, (schema, j)
    ch = j["choices"][0]
    if ch["finish_reason"] == "stop":
        jsonschema.validate(json.loads(ch["message"]["content"]), schema)
        stops += 1
assert stops >= len(SCHEMAS) - 1, f"only {stops} of {len(SCHEMAS)} schema outputs completed"
st, _, j = chat({"messages": USER, "max_tokens": 3,
                 "response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMAS[0]}}})
assert st == 200 and j["choices"][0]["finish_reason"] == "length", j
ok(f"response_format json_schema: {stops}/{len(SCHEMAS)} outputs ended 'stop' and validate; cut at 3 tokens: 'length'")

st, _, j = chat({"messages": [{"role": "user", "content": "Is the sky blue?"}],
                 "grammar": 'root ::= answer "."\nanswer ::= "yes" | "no"'})
assert st == 200 and j["choices"][0]["message"]["content"] in ("yes.", "no."), j
assert j["choices"][0]["finish_reason"] == "stop", j
st, _, j = chat({"messages": [{"role": "user", "content": "Pick a colour."}], "guided_choice": ["red", "green", "blue"]})
assert st == 200 and j["choices"][0]["message"]["content"] in ("red", "green", "blue"), j
st, _, j = chat({"messages": [{"role": "user", "content": "Pick a colour."}], "response_format": {"type": "text"},
                 "guided_choice": ["cyan", "magenta"]})
assert st == 200 and j["choices"][0]["message"]["content"] in ("cyan", "magenta"), j
st, _, j = chat({"messages": [{"role": "user", "content": "Give me a phone number."}],
                 "guided_regex": "[0-9]{3}-[0-9]{4}"})
assert st == 200 and re.fullmatch(r"[0-9]{3}-[0-9]{4}", j["choices"][0]["message"]["content"]), j
st, _, j = req("POST", "/v1/completions", {"model": model, "prompt": "A person as JSON:", "temperature": 0,
                                            "max_tokens": 160, "json_schema": SCHEMAS[0]})
assert st == 200, j
if j["choices"][0]["finish_reason"] == "stop":
    jsonschema.validate(json.loads(j["choices"][0]["text"]), SCHEMAS[0])
ok("grammar (GBNF), guided_choice (also beside response_format text), guided_regex on chat; json_schema on "
   "/v1/completions")

st, _, j = chat({"messages": USER, "response_format": {"type": "json_schema", "json_schema": {
    "name": "bad", "schema": {"type": "object", "properties": {"a": {"type": "number", "multipleOf": 3}}}}}})
e = j.get("error", {})
assert st == 400 and e.get("code") == "invalid_constraint" and e.get("param") == "response_format", (st, j)
assert e.get("pointer", "").startswith("/properties/a"), e
pointer = e["pointer"]
st, _, j = chat({"messages": USER, "grammar": 'root ::= "a" |\n  undefined-rule'})
e = j.get("error", {})
assert st == 400 and e.get("code") == "invalid_constraint" and e.get("param") == "grammar", (st, j)
assert isinstance(e.get("line"), int) and e["line"] >= 1 and isinstance(e.get("column"), int), e
ok(f"invalid schema: 400 with pointer {pointer}; invalid GBNF: 400 line {e['line']} column {e['column']}")

# ---- forced tool calls through the openai package -----------------------------------------
ask = [{"role": "user", "content": "What is the weather in Paris, in celsius?"}]
st, _, j = chat({"messages": ask, "tools": TOOLS, "tool_choice": "required", "max_tokens": 5})
assert st == 200 and j["choices"][0]["finish_reason"] == "length" and not j["choices"][0]["message"].get("tool_calls"), j
events = sse({"messages": ask, "tools": TOOLS, "tool_choice": "required", "max_tokens": 5})
assert events[-1]["choices"][0]["finish_reason"] == "length", events[-1]
ok("a forced call cut by max_tokens: finish_reason 'length', no tool_calls (streamed: 'length' too)")
for choice in ["required", {"type": "function", "function": {"name": "get_time"}}]:
    r = client.chat.completions.create(model=model, messages=ask, tools=TOOLS, tool_choice=choice, temperature=0,
                                       max_tokens=120)
    c = r.choices[0]
    assert c.finish_reason == "tool_calls" and c.message.tool_calls, c
    call = c.message.tool_calls[0]
    if isinstance(choice, dict):
        assert call.function.name == "get_time", call
    jsonschema.validate(json.loads(call.function.arguments), PARAMS[call.function.name])
    # streamed: the same call, in deltas
    name, arguments, cid, finish, n_args = None, "", None, None, 0
    for chunk in client.chat.completions.create(model=model, messages=ask, tools=TOOLS, tool_choice=choice,
                                                temperature=0, max_tokens=120, stream=True):
        for sc in chunk.choices:
            for d in sc.delta.tool_calls or []:
                cid = cid or d.id
                name = name or (d.function.name if d.function else None)
                arguments += (d.function.arguments or "") if d.function else ""
                n_args += bool(d.function and d.function.arguments)
            finish = sc.finish_reason or finish
    assert finish == "tool_calls" and cid and cid.startswith("call_"), (finish, cid)
    assert name == call.function.name and arguments == call.function.arguments, (name, arguments, call)
    assert n_args >= 4, f"the arguments came in {n_args} deltas, not as they were generated"
    # the round trip: the result goes back, the model answers in text
    msgs = ask + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": call.id, "type": "function", "function": {"name": call.function.name,
                                                         "arguments": call.function.arguments}}]},
        {"role": "tool", "tool_call_id": call.id, "content": "22 degrees, sunny" if call.function.name ==
         "get_weather" else "14:05"}]
    r2 = client.chat.completions.create(model=model, messages=msgs, tools=TOOLS, tool_choice="none", temperature=0,
                                        max_tokens=40)
    assert r2.choices[0].message.content and r2.usage.prompt_tokens_details.cached_tokens > 0, r2
    ok(f"tool_choice {json.dumps(choice)}: {call.function.name}({json.dumps(json.loads(call.function.arguments))}) "
       f"validates, streamed the same in {n_args} argument deltas; round trip answered with {r2.usage.prompt_tokens_details.cached_tokens} cached tokens")
