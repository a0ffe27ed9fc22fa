/*
 * client/http/structured.c — structured output and tools in requests.
 *
 * Structured output: kvd constrains decoding itself (kvc_gen_params.
 * constraint); this file maps the fields the OpenAI-compatible servers use
 * onto kvd's constraint kinds:
 *
 *   response_format {"type":"json_schema","json_schema":{"name","schema","strict"}}
 *                                          → JSON Schema (strict or not: kvd always
 *                                            enforces the schema exactly)
 *   response_format {"type":"json_object"} → any JSON object
 *   response_format {"type":"json_object","schema":{...}} (llama.cpp) → JSON Schema
 *   response_format {"type":"text"}        → none
 *   grammar (llama.cpp, GBNF text)         → GBNF, start rule "root"
 *   json_schema (llama.cpp, an object)     → JSON Schema
 *   guided_json (vLLM, object or JSON text) → JSON Schema
 *   guided_regex (vLLM)                    → a regular expression
 *   guided_choice (vLLM, strings)          → one of the strings
 *   guided_grammar (vLLM)                  → GBNF (read as llama.cpp's notation)
 *
 * One request takes one constraint: two of these fields (or one with a
 * forced tool call) are refused with a 400 naming both. kvd checks the
 * grammar or schema; its error ("constraint: LINE:COL: ..." or
 * "constraint: /pointer: ...") becomes a 400 whose error object carries
 * the position (http_constraint_error).
 *
 * Tools: kvd 0.9.0 renders tools, an assistant's calls and tool results in
 * the model family's own tool format from kvd's tool turns
 * (http_tool_turns: "tools", "tool_calls", "tool"). For an older kvd the
 * gateway renders them itself in one generic format — the shape Qwen
 * 2.5/3's own template uses (Hermes-style), which is also what kvd uses
 * for templates without a tool format:
 *
 *   system:    (the system message, then) "# Tools" … <tools> one JSON object
 *              per function </tools> … "return a json object … within
 *              <tool_call></tool_call> XML tags"
 *   assistant: its content, then per call
 *              <tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>
 *   tool:      a user turn <tool_response>\n(content)\n</tool_response>;
 *              consecutive tool messages share one user turn
 *
 * tool_choice "none" keeps the tools in the prompt, so the prompt of a tool
 * loop keeps its cached prefix, and answers in text. With tool_choice
 * "required" or a named function the output is
 * constrained by a JSON Schema of the bare call object, {"name": const,
 * "arguments": the function's parameters} (anyOf over the functions for
 * "required"; with parallel_tool_calls true given, a JSON array of 1 to
 * HTTP_MAX_PARALLEL_CALLS of them), so even a small model returns calls
 * that validate; the gateway reads it as the calls (toolcall.c). From kvd
 * 0.11.0, which names the model's chat format, the call is written in the
 * family's own shape (enum http_call_shape): kvd ends the prompt with the
 * family's opener (Qwen's and the generic "<tool_call>\n", Mistral's
 * [TOOL_CALLS]) and the schema is the family's (Llama 3.1's "parameters",
 * Mistral's array). With "auto"
 * nothing is constrained and the calls are parsed from any family's shape
 * when the model writes one.
 *
 * Like request.c, nothing here knows HTTP or kvd.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "http.h"

#define BAD(e, param, ...) http_fail(e, 400, "invalid_request_error", NULL, param, __VA_ARGS__)
#define BAD_CONSTRAINT(e, param, ...) \
	http_fail(e, 400, "invalid_request_error", "invalid_constraint", param, __VA_ARGS__)

static int oom(struct http_error *e)
{
	http_fail(e, 500, "server_error", NULL, NULL, "out of memory");
	return -ENOMEM;
}

static json_t *opt(json_t *o, const char *k)
{
	json_t *v = json_object_get(o, k);
	return json_is_null(v) ? NULL : v;
}

/* ---- constraints ---------------------------------------------------------------- */

/* Set r's constraint (text malloc'd from s, n bytes; s NULL: none). */
static int set_constraint(struct http_gen_req *r, uint32_t kind, const char *param, const char *s, size_t n,
			  struct http_error *e)
{
	free(r->constraint_text);
	r->constraint_text = NULL;
	if (s) {
		if (memchr(s, 0, n))
			return BAD_CONSTRAINT(e, param, "'%s' contains a NUL character", param);
		if (!(r->constraint_text = malloc(n + 1)))
			return oom(e);
		memcpy(r->constraint_text, s, n);
		r->constraint_text[n] = '\0';
	}
	r->constraint = (struct kvc_constraint){ .kind = kind, .text = r->constraint_text, .len = s ? n : 0 };
	r->constraint_param = param;
	return 0;
}

/* A JSON value as the constraint's text (compact JSON). */
static int set_json_constraint(struct http_gen_req *r, uint32_t kind, const char *param, json_t *v,
			       struct http_error *e)
{
	char *s = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY | JSON_PRESERVE_ORDER);
	if (!s)
		return oom(e);
	int x = set_constraint(r, kind, param, s, strlen(s), e);
	free(s);
	return x;
}

static int from_response_format(json_t *v, struct http_gen_req *r, struct http_error *e)
{
	json_t *t = json_object_get(v, "type");

	if (!json_is_object(v) || !json_is_string(t))
		return BAD(e, "response_format", "'response_format' must be an object with a string 'type'");
	const char *type = json_string_value(t);
	if (!strcmp(type, "text"))
		return 0;
	if (!strcmp(type, "json_object")) {
		json_t *schema = opt(v, "schema"); /* llama.cpp's extension */
		if (!schema)
			return set_constraint(r, KVC_CONSTRAINT_JSON_OBJECT, "response_format", NULL, 0, e);
		if (!json_is_object(schema))
			return BAD(e, "response_format.schema", "'response_format.schema' must be a JSON Schema object");
		return set_json_constraint(r, KVC_CONSTRAINT_JSON_SCHEMA, "response_format", schema, e);
	}
	if (!strcmp(type, "json_schema")) {
		json_t *js = opt(v, "json_schema"), *name, *strict, *schema;
		if (!json_is_object(js))
			return BAD(e, "response_format.json_schema",
				   "'response_format' of type json_schema needs a 'json_schema' object");
		if ((name = opt(js, "name")) && !json_is_string(name))
			return BAD(e, "response_format.json_schema.name", "'response_format.json_schema.name' must be a string");
		if ((strict = opt(js, "strict")) && !json_is_boolean(strict))
			return BAD(e, "response_format.json_schema.strict",
				   "'response_format.json_schema.strict' must be a boolean");
		schema = opt(js, "schema");
		if (!schema)
			return BAD(e, "response_format.json_schema.schema", "'response_format.json_schema.schema' is required");
		if (!json_is_object(schema) && !json_is_boolean(schema))
			return BAD(e, "response_format.json_schema.schema",
				   "'response_format.json_schema.schema' must be a JSON Schema (an object)");
		return set_json_constraint(r, KVC_CONSTRAINT_JSON_SCHEMA, "response_format", schema, e);
	}
	return BAD(e, "response_format.type", "'response_format.type' is '%.32s'; it must be text, json_object or json_schema",
		   type);
}

/* The constraint fields, in the order they are looked at. */
static const char *const constraint_fields[] = {
	"response_format", "grammar", "json_schema", "guided_json", "guided_regex", "guided_choice", "guided_grammar",
};
#define N_CONSTRAINT_FIELDS (sizeof(constraint_fields) / sizeof(constraint_fields[0]))

/* Is field k given with a value that asks for something? (null, "" and
 * response_format text ask for nothing, as the servers that define them
 * read them.) */
static bool constraint_given(json_t *o, const char *k)
{
	json_t *v = opt(o, k);
	if (!v || (json_is_string(v) && json_string_length(v) == 0))
		return false;
	if (!strcmp(k, "response_format")) {
		json_t *t = json_object_get(v, "type");
		return !(json_is_string(t) && !strcmp(json_string_value(t), "text"));
	}
	return true;
}

int http_parse_constraint(json_t *o, struct http_gen_req *r, struct http_error *e)
{
	const char *k = NULL;
	json_t *v;
	int x;

	for (size_t i = 0; i < N_CONSTRAINT_FIELDS; i++) {
		if (!constraint_given(o, constraint_fields[i]))
			continue;
		if (k)
			return BAD_CONSTRAINT(e, constraint_fields[i],
					      "'%s' and '%s' cannot both be given: a request takes one constraint", k,
					      constraint_fields[i]);
		k = constraint_fields[i];
	}
	/* response_format is checked even as {"type": "text"} (no constraint) */
	if ((v = opt(o, "response_format")) && (x = from_response_format(v, r, e)) < 0)
		return x;
	if (!k || !strcmp(k, "response_format"))
		return 0;
	v = opt(o, k);
	if (!strcmp(k, "grammar") || !strcmp(k, "guided_grammar") || !strcmp(k, "guided_regex")) {
		if (!json_is_string(v))
			return BAD(e, k, "'%s' must be a string", k);
		return set_constraint(r, !strcmp(k, "guided_regex") ? KVC_CONSTRAINT_REGEX : KVC_CONSTRAINT_GBNF, k,
				      json_string_value(v), json_string_length(v), e);
	}
	if (!strcmp(k, "json_schema") || !strcmp(k, "guided_json")) {
		if (json_is_string(v)) /* vLLM takes the schema as JSON text too */
			return set_constraint(r, KVC_CONSTRAINT_JSON_SCHEMA, k, json_string_value(v), json_string_length(v), e);
		if (!json_is_object(v) && !json_is_boolean(v))
			return BAD(e, k, "'%s' must be a JSON Schema (an object)", k);
		return set_json_constraint(r, KVC_CONSTRAINT_JSON_SCHEMA, k, v, e);
	}
	/* guided_choice */
	size_t i;
	json_t *s;
	if (!json_is_array(v) || json_array_size(v) == 0)
		return BAD(e, k, "'%s' must be a non-empty array of strings", k);
	json_array_foreach(v, i, s) {
		if (!json_is_string(s))
			return BAD(e, k, "'%s' must be a non-empty array of strings", k);
	}
	return set_json_constraint(r, KVC_CONSTRAINT_CHOICE, k, v, e);
}

/* kvd's "constraint: 12:5: msg" or "constraint: #/properties/a: msg". */
void http_constraint_error(const struct http_gen_req *r, const char *msg, struct http_error *e)
{
	const char *param = r->constraint_param ? r->constraint_param : NULL;
	const char *p = msg + strlen("constraint: ");
	unsigned line = 0, col = 0;
	int n = 0;

	BAD_CONSTRAINT(e, param, "%s", msg);
	if (sscanf(p, "%u:%u: %n", &line, &col, &n) == 2 && n > 0) {
		e->line = line;
		e->column = col;
	} else if (p[0] == '/' || p[0] == '#') {
		/* a JSON pointer, plain or as a URI fragment ("#/a/b"): reported plain */
		if (p[0] == '#')
			p++;
		const char *end = strstr(p, ": ");
		size_t len = end ? (size_t)(end - p) : 0;
		if (end && len < sizeof(e->pointer)) {
			memcpy(e->pointer, p, len);
			e->pointer[len] = '\0';
			e->has_pointer = true;
		}
	}
}

/* ---- tools ------------------------------------------------------------------------ */

static bool valid_tool_name(const char *s, size_t n)
{
	if (n == 0 || n > HTTP_MAX_TOOL_NAME)
		return false;
	for (size_t i = 0; i < n; i++)
		if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') || (s[i] >= '0' && s[i] <= '9') ||
		      s[i] == '_' || s[i] == '-' || s[i] == '.'))
			return false;
	return true;
}

/* One entry of 'tools' → {"name","description"?,"parameters"} appended to out. */
static int parse_tool(json_t *t, size_t idx, json_t *out, struct http_error *e)
{
	char param[64];
	json_t *type = json_object_get(t, "type"), *f = json_object_get(t, "function");

	snprintf(param, sizeof(param), "tools[%zu]", idx);
	if (!json_is_object(t) || !json_is_string(type) || strcmp(json_string_value(type), "function") != 0)
		return http_fail(e, 400, "invalid_request_error", "unsupported_parameter", param,
				 "'%s' must be {\"type\": \"function\", \"function\": {...}} (the only tool type)", param);
	snprintf(param, sizeof(param), "tools[%zu].function", idx);
	if (!json_is_object(f))
		return BAD(e, param, "'%s' must be an object", param);
	json_t *name = json_object_get(f, "name"), *desc = opt(f, "description"), *params = opt(f, "parameters");
	snprintf(param, sizeof(param), "tools[%zu].function.name", idx);
	if (!json_is_string(name) || !valid_tool_name(json_string_value(name), json_string_length(name)))
		return BAD(e, param, "'%s' must be 1 to %d letters, digits, '_', '-' or '.'", param, HTTP_MAX_TOOL_NAME);
	for (size_t i = 0; i < json_array_size(out); i++)
		if (json_equal(json_object_get(json_array_get(out, i), "name"), name))
			return BAD(e, param, "two tools are named '%s'", json_string_value(name));
	snprintf(param, sizeof(param), "tools[%zu].function.description", idx);
	if (desc && !json_is_string(desc))
		return BAD(e, param, "'%s' must be a string", param);
	snprintf(param, sizeof(param), "tools[%zu].function.parameters", idx);
	if (params && !json_is_object(params))
		return BAD(e, param, "'%s' must be a JSON Schema object", param);
	/* name, description, parameters: the order the tools block shows */
	json_t *fn = json_pack("{s:O}", "name", name);
	if (fn && desc)
		json_object_set(fn, "description", desc);
	if (fn)
		json_object_set_new(fn, "parameters", params ? json_incref(params)
								: json_pack("{s:s, s:{}}", "type", "object", "properties"));
	if (!fn)
		return oom(e);
	return json_array_append_new(out, fn) < 0 ? oom(e) : 0;
}

/* The schema of one call object of function fn, its arguments under key. */
static json_t *call_schema(json_t *fn, const char *key)
{
	return json_pack("{s:s, s:{s:{s:O}, s:O}, s:[s,s], s:b}", "type", "object", "properties", "name", "const",
			 json_object_get(fn, "name"), key, json_object_get(fn, "parameters"), "required", "name", key,
			 "additionalProperties", 0);
}

bool http_forced_array(const struct http_gen_req *r)
{
	return r->parallel_forced || r->call_shape == HTTP_CALL_MISTRAL;
}

enum http_call_shape http_call_shape_for(unsigned server_version, const char *chat_format)
{
	if (server_version < HTTP_CALL_OPEN_VERSION || !chat_format[0])
		return HTTP_CALL_BARE;
	if (!strcmp(chat_format, "llama3"))
		return HTTP_CALL_LLAMA3;
	if (!strcmp(chat_format, "mistral"))
		return HTTP_CALL_MISTRAL;
	return HTTP_CALL_TAGGED; /* Qwen's own, and the generic format of the others */
}

/* required / named: the output is one call (or a list of them), constrained by its schema. */
static int set_call_constraint(struct http_gen_req *r, struct http_error *e)
{
	const char *key = r->call_shape == HTTP_CALL_LLAMA3 ? "parameters" : "arguments";
	json_t *schema = NULL, *fn;
	size_t i;

	if (r->tool_mode == HTTP_TOOLS_NAMED) {
		json_array_foreach(r->tools, i, fn) {
			if (!strcmp(json_string_value(json_object_get(fn, "name")), r->tool_name))
				schema = call_schema(fn, key);
		}
	} else if (json_array_size(r->tools) == 1) {
		schema = call_schema(json_array_get(r->tools, 0), key);
	} else {
		json_t *any = json_array();
		json_array_foreach(r->tools, i, fn) {
			if (any && json_array_append_new(any, call_schema(fn, key)) < 0) {
				json_decref(any);
				any = NULL;
			}
		}
		schema = any ? json_pack("{s:o}", "anyOf", any) : NULL;
	}
	if (schema && http_forced_array(r)) /* one or more calls, as a JSON array */
		schema = json_pack("{s:s, s:o, s:i, s:i}", "type", "array", "items", schema, "minItems", 1, "maxItems",
				   r->parallel_forced ? HTTP_MAX_PARALLEL_CALLS : 1);
	if (!schema)
		return oom(e);
	int x = set_json_constraint(r, KVC_CONSTRAINT_JSON_SCHEMA, "tools", schema, e);
	json_decref(schema);
	return x;
}

int http_set_call_shape(struct http_gen_req *r, enum http_call_shape shape, struct http_error *e)
{
	if (r->tool_mode != HTTP_TOOLS_REQUIRED && r->tool_mode != HTTP_TOOLS_NAMED)
		return 0;
	if (shape == r->call_shape && r->constraint.kind)
		return 0;
	r->call_shape = shape;
	/* the family's text before a call ends the prompt: kvd writes it */
	bool opener = r->tool_turns && ((shape == HTTP_CALL_TAGGED && !r->parallel_forced) || shape == HTTP_CALL_MISTRAL);
	if (opener && !r->call_open_turn) {
		char *none = strdup("");
		if (!none)
			return oom(e);
		r->tool_turns[r->n_tool_turns++] = (struct kvc_chat_msg){ "call_open", none };
		r->call_open_turn = true;
	} else if (!opener && r->call_open_turn) {
		free((char *)r->tool_turns[--r->n_tool_turns].content);
		r->call_open_turn = false;
	}
	return set_call_constraint(r, e);
}

static int parse_tool_choice(json_t *o, struct http_gen_req *r, struct http_error *e)
{
	json_t *v = opt(o, "tool_choice");

	if (!v)
		return 0; /* auto with tools, none without */
	if (json_is_string(v)) {
		const char *s = json_string_value(v);
		if (!strcmp(s, "none"))
			r->tool_mode = HTTP_TOOLS_NONE;
		else if (!strcmp(s, "required") && r->tools)
			r->tool_mode = HTTP_TOOLS_REQUIRED;
		else if (!strcmp(s, "auto") && r->tools)
			r->tool_mode = HTTP_TOOLS_AUTO;
		else if (!strcmp(s, "auto") || !strcmp(s, "required"))
			return BAD(e, "tool_choice", "'tool_choice' \"%s\" needs 'tools'", s);
		else
			return BAD(e, "tool_choice", "'tool_choice' must be \"none\", \"auto\", \"required\" or "
				   "{\"type\": \"function\", \"function\": {\"name\": ...}}");
		return 0;
	}
	json_t *type = json_object_get(v, "type"), *f = json_object_get(v, "function");
	json_t *name = json_object_get(f, "name");
	if (!json_is_object(v) || !json_is_string(type) || strcmp(json_string_value(type), "function") != 0 ||
	    !json_is_string(name))
		return BAD(e, "tool_choice", "'tool_choice' must be \"none\", \"auto\", \"required\" or "
			   "{\"type\": \"function\", \"function\": {\"name\": ...}}");
	bool found = false;
	size_t i;
	json_t *fn;
	json_array_foreach(r->tools, i, fn) {
		found |= json_equal(json_object_get(fn, "name"), name);
	}
	if (!found)
		return BAD(e, "tool_choice", "'tool_choice' names '%.64s', which is not in 'tools'", json_string_value(name));
	if (!(r->tool_name = strdup(json_string_value(name))))
		return oom(e);
	r->tool_mode = HTTP_TOOLS_NAMED;
	return 0;
}

int http_parse_tools(json_t *o, struct http_gen_req *r, struct http_error *e)
{
	json_t *v = opt(o, "tools"), *t;
	size_t i;
	int x;

	r->parallel_tool_calls = true;
	bool parallel_given = false;
	if ((v = opt(o, "parallel_tool_calls"))) {
		if (!json_is_boolean(v))
			return BAD(e, "parallel_tool_calls", "'parallel_tool_calls' must be a boolean");
		r->parallel_tool_calls = json_is_true(v);
		parallel_given = r->parallel_tool_calls;
	}
	v = opt(o, "tools");
	if (v && (!json_is_array(v) || json_array_size(v) > HTTP_MAX_TOOLS))
		return BAD(e, "tools", "'tools' must be an array of at most %d functions", HTTP_MAX_TOOLS);
	if (v && json_array_size(v)) {
		if (!(r->tools = json_array()))
			return oom(e);
		json_array_foreach(v, i, t) {
			if ((x = parse_tool(t, i, r->tools, e)) < 0)
				return x;
		}
		r->tool_mode = HTTP_TOOLS_AUTO;
	}
	if ((x = parse_tool_choice(o, r, e)) < 0)
		return x;
	if (r->tool_mode == HTTP_TOOLS_NONE)
		return 0; /* "none": the tools stay in the prompt (a tool loop's prefix stays cached), text comes back */
	if (r->n > 1 || r->logprobs)
		return http_fail(e, 400, "invalid_request_error", "unsupported_parameter", r->n > 1 ? "n" : "logprobs",
				 "'%s' is not supported together with 'tools'", r->n > 1 ? "n" : "logprobs");
	if (r->tool_mode == HTTP_TOOLS_AUTO)
		return 0;
	if (r->constraint.kind)
		return BAD_CONSTRAINT(e, r->constraint_param,
				      "'%s' and 'tool_choice' %s cannot both be given: a forced tool call is itself "
				      "the constraint", r->constraint_param,
				      r->tool_mode == HTTP_TOOLS_REQUIRED ? "\"required\"" : "naming a function");
	/* A forced answer is one call unless parallel_tool_calls true is asked
	 * for: then one or more (a small model asked for "one or more" may
	 * well write more than were wanted, up to HTTP_MAX_PARALLEL_CALLS). */
	r->parallel_forced = parallel_given;
	r->call_shape = HTTP_CALL_BARE; /* until the kvd that answers names its family */
	return set_call_constraint(r, e);
}

/* ---- rendering into the conversation --------------------------------------------- */

/* malloc'd a + b (b may be NULL). */
static char *concat(const char *a, size_t an, const char *b, size_t bn, size_t *ret_len)
{
	char *s = malloc(an + bn + 1);
	if (!s)
		return NULL;
	memcpy(s, a, an);
	if (bn)
		memcpy(s + an, b, bn);
	s[an + bn] = '\0';
	*ret_len = an + bn;
	return s;
}

char *http_render_tools_block(const struct http_gen_req *r)
{
	static const char head[] =
		"# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
		"You are provided with function signatures within <tools></tools> XML tags:\n<tools>";
	static const char tail[] =
		"\n</tools>\n\nFor each function call, return a json object with function name and arguments "
		"within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
		"<args-json-object>}\n</tool_call>";
	size_t total = sizeof(head) + sizeof(tail), i;
	json_t *fn;
	char *out = NULL, *lines[HTTP_MAX_TOOLS];
	size_t n = 0;

	json_array_foreach(r->tools, i, fn) {
		json_t *t = json_pack("{s:s, s:O}", "type", "function", "function", fn);
		lines[n] = t ? json_dumps(t, JSON_PRESERVE_ORDER) : NULL;
		json_decref(t);
		if (!lines[n])
			goto done;
		total += strlen(lines[n++]) + 1;
	}
	if (!(out = malloc(total)))
		goto done;
	size_t off = 0;
	memcpy(out, head, sizeof(head) - 1);
	off = sizeof(head) - 1;
	for (i = 0; i < n; i++) {
		out[off++] = '\n';
		memcpy(out + off, lines[i], strlen(lines[i]));
		off += strlen(lines[i]);
	}
	memcpy(out + off, tail, sizeof(tail));
done:
	for (i = 0; i < n; i++)
		free(lines[i]);
	return out;
}

int http_render_tool_calls(json_t *msg, size_t idx, const char *content, size_t len, char **ret, size_t *ret_len,
			   struct http_error *e)
{
	json_t *calls = opt(msg, "tool_calls"), *call;
	char param[64];
	size_t i, n = len;
	char *s = concat(content, len, NULL, 0, &n);

	if (!s)
		return oom(e);
	json_array_foreach(calls, i, call) {
		json_t *f = json_object_get(call, "function");
		json_t *name = json_object_get(f, "name"), *args = json_object_get(f, "arguments");
		snprintf(param, sizeof(param), "messages[%zu].tool_calls[%zu]", idx, i);
		if (!json_is_object(f) || !json_is_string(name) || !(json_is_string(args) || json_is_object(args))) {
			free(s);
			return BAD(e, param, "'%s' must be {\"type\": \"function\", \"function\": {\"name\", \"arguments\"}}",
				   param);
		}
		/* arguments come as JSON text: written back as the object the model wrote */
		json_t *a = json_is_string(args) ? json_loadb(json_string_value(args), json_string_length(args), 0, NULL)
						  : json_incref(args);
		json_t *obj = json_pack("{s:O, s:o}", "name", name, "arguments", a ? a : json_incref(args));
		char *j = obj ? json_dumps(obj, JSON_PRESERVE_ORDER) : NULL;
		json_decref(obj);
		if (!j) {
			free(s);
			return oom(e);
		}
		char *block = malloc(strlen(j) + 32);
		if (block)
			sprintf(block, "%s<tool_call>\n%s\n</tool_call>", n ? "\n" : "", j);
		free(j);
		char *t = block ? concat(s, n, block, strlen(block), &n) : NULL;
		free(block);
		free(s);
		if (!(s = t))
			return oom(e);
	}
	*ret = s;
	*ret_len = n;
	return 0;
}

int http_render_tool_response(const char *content, size_t len, char **ret, size_t *ret_len, struct http_error *e)
{
	static const char open[] = "<tool_response>\n", close[] = "\n</tool_response>";
	char *s = malloc(sizeof(open) + len + sizeof(close));

	if (!s)
		return oom(e);
	memcpy(s, open, sizeof(open) - 1);
	memcpy(s + sizeof(open) - 1, content, len);
	memcpy(s + sizeof(open) - 1 + len, close, sizeof(close));
	*ret = s;
	*ret_len = sizeof(open) - 1 + len + sizeof(close) - 1;
	return 0;
}

/* ---- the conversation in kvd's tool roles (kvd 0.9.0) ------------------------------ */

static bool has_tool_turns(json_t *m, const struct http_gen_req *r)
{
	size_t i;
	json_t *msg;

	if (r->tools)
		return true;
	json_array_foreach(m, i, msg) {
		json_t *role = json_object_get(msg, "role");
		if ((json_is_string(role) && !strcmp(json_string_value(role), "tool")) ||
		    json_array_size(opt(msg, "tool_calls")))
			return true;
	}
	return false;
}

/* An assistant message's tool_calls as kvd's list: [{"id", "name",
 * "arguments": {...}}]; its ids into ids (a JSON array). */
static char *calls_turn(json_t *calls, size_t idx, json_t *ids, struct http_error *e)
{
	json_t *out = json_array(), *call;
	char *s = NULL;
	size_t i;

	json_array_clear(ids);
	if (!out) {
		oom(e);
		return NULL;
	}
	json_array_foreach(calls, i, call) {
		json_t *f = json_object_get(call, "function"), *id = json_object_get(call, "id");
		json_t *args = json_object_get(f, "arguments");
		json_t *a = json_is_string(args) ? json_loadb(json_string_value(args), json_string_length(args), 0, NULL)
						 : json_incref(args);
		if (!json_is_object(a)) {
			json_decref(a);
			json_decref(out);
			char param[112];
			snprintf(param, sizeof(param), "messages[%zu].tool_calls[%zu].function.arguments", idx, i);
			BAD(e, param, "'%s' must be a JSON object (or its text)", param);
			return NULL;
		}
		json_t *o = json_pack("{s:O?, s:O, s:o}", "id", json_is_string(id) ? id : NULL, "name",
				      json_object_get(f, "name"), "arguments", a);
		if (!o || json_array_append_new(out, o) < 0 ||
		    json_array_append_new(ids, json_is_string(id) ? json_incref(id) : json_null()) < 0) {
			json_decref(out);
			oom(e);
			return NULL;
		}
	}
	s = json_dumps(out, JSON_COMPACT | JSON_PRESERVE_ORDER);
	json_decref(out);
	if (!s)
		oom(e);
	return s;
}

/* Where tool message msg's result goes among the calls ids (their count
 * when its id names none). */
static size_t result_rank(json_t *msg, json_t *ids)
{
	json_t *id = json_object_get(msg, "tool_call_id"), *v;
	size_t i;

	json_array_foreach(ids, i, v) {
		if (json_is_string(id) && json_equal(v, id))
			return i;
	}
	return json_array_size(ids);
}

static int push_turn(struct http_gen_req *r, const char *role, char *text, struct http_error *e)
{
	if (!text)
		return oom(e);
	r->tool_turns[r->n_tool_turns++] = (struct kvc_chat_msg){ role, text };
	return 0;
}

int http_tool_turns(json_t *m, struct http_gen_req *r, struct http_error *e)
{
	size_t n = json_array_size(m), i = 0;
	json_t *ids = NULL;
	int x = 0;

	if (!has_tool_turns(m, r))
		return 0;
	/* per message its text and calls, the tools, a closing call_open */
	if (!(r->tool_turns = calloc(2 * n + 2, sizeof(*r->tool_turns))) || !(ids = json_array()))
		return oom(e);
	json_t *role0 = json_object_get(json_array_get(m, 0), "role");
	const char *r0 = json_string_value(role0);
	bool sys0 = r0 && (!strcmp(r0, "system") || !strcmp(r0, "developer"));
	for (i = 0; i < n && x == 0; i++) {
		json_t *msg = json_array_get(m, i), *c = json_object_get(msg, "content");
		const char *role = json_string_value(json_object_get(msg, "role"));
		char *text = NULL;
		size_t len = 0;
		if (i == (sys0 ? 1u : 0u) && r->tools &&
		    (x = push_turn(r, "tools", json_dumps(r->tools, JSON_COMPACT | JSON_PRESERVE_ORDER), e)) < 0)
			break;
		if (c && !json_is_null(c) && (x = http_content_text(c, i, &text, &len, e)) < 0)
			break;
		if (!text && !(text = strdup(""))) {
			x = oom(e);
			break;
		}
		if (!strcmp(role, "tool")) {
			free(text);
			/* a run of results, in the order of the calls they answer */
			size_t j = i;
			while (j < n && !strcmp(json_string_value(json_object_get(json_array_get(m, j), "role")), "tool"))
				j++;
			for (size_t rank = 0; rank <= json_array_size(ids) && x == 0; rank++)
				for (size_t k = i; k < j && x == 0; k++) {
					json_t *t = json_array_get(m, k);
					if (result_rank(t, ids) != rank)
						continue;
					char *tt = NULL;
					size_t tl = 0;
					json_t *tc = json_object_get(t, "content");
					if (tc && !json_is_null(tc) && (x = http_content_text(tc, k, &tt, &tl, e)) < 0)
						break;
					x = push_turn(r, "tool", tt ? tt : strdup(""), e);
				}
			i = j - 1;
			continue;
		}
		const char *kr = !strcmp(role, "assistant") ? "assistant" : !strcmp(role, "user") ? "user" : "system";
		if ((x = push_turn(r, kr, text, e)) < 0)
			break;
		json_t *calls = opt(msg, "tool_calls");
		if (!strcmp(kr, "assistant") && json_array_size(calls)) {
			char *ct = calls_turn(calls, i, ids, e);
			x = ct ? push_turn(r, "tool_calls", ct, e) : -EINVAL;
		}
	}
	json_decref(ids);
	return x;
}
