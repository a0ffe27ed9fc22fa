/*
 * client/http/toolcall.c — a model's text read back as OpenAI tool calls.
 *
 * With tool_choice "required" or a named function the output was
 * constrained to one call object, {"name": ..., "arguments": {...}}
 * (structured.c; Llama 3.1's key is "parameters"), and the whole text is
 * that call (the family's opener, "<tool_call>\n", is the prompt's end,
 * not text); Mistral's, after its [TOOL_CALLS] token, is a JSON array of
 * that one call; with parallel_tool_calls true given, a JSON array of such
 * calls. With "auto" the text is free and
 * read in every family's shape: each <tool_call>{...}</tool_call> block
 * naming one of the request's tools is a call (a last block whose closing
 * tag the model never wrote counts when its JSON is whole; Qwen, and the
 * generic format), and the text outside the blocks, trimmed, is the
 * message's content (null when nothing is left); a text without blocks
 * that is JSON alone — an array of calls (Mistral's, after its
 * [TOOL_CALLS] token, which is not text) or call objects joined by ';'
 * (Llama 3.1's {"name", "parameters"}) — is its calls when every part is a
 * call of one of the tools. parallel_tool_calls
 * false keeps the first call only. A text with no call is answered as
 * plain content with the usual finish reason; one with calls has
 * finish_reason "tool_calls" and message.tool_calls, each with an id
 * "call_" + 24 random letters and digits and its arguments as JSON text.
 *
 * Streaming: with a forced call, a first delta with the call's index, id,
 * type and name as soon as the model has written {"name": "...",
 * "arguments": then the arguments as they come (all but a tail that may
 * be the call object's closing brace), then the finish chunk: what OpenAI
 * streams. With "auto" the text streams as content as it comes, up to the
 * first <tool_call> (a tail that could still become one waits for the
 * next token; a text that opens with '{' or '[' is held from the start);
 * a forced list of calls is held likewise; from there on the text is held
 * until the request ends
 * (whether it holds calls is known only then) and each call is sent the
 * same way: per call a first delta with its index, id, type and name
 * and empty arguments, then the arguments in deltas of at most
 * TOOL_ARGS_CHUNK bytes, then the finish chunk. The deltas of a call's
 * arguments joined are exactly the non-streamed answer's arguments.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include <microhttpd.h>

#include "kvclient.h"
#include "server_impl.h"

#define TOOL_ARGS_CHUNK 32   /* bytes of arguments per streamed delta */
#define TOOL_ID_CHARS   24   /* random characters after "call_" */

static const char open_tag[] = "<tool_call>", close_tag[] = "</tool_call>";

/* "call_" and TOOL_ID_CHARS random letters and digits. */
static void call_id(char out[6 + TOOL_ID_CHARS])
{
	static const char abc[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
	unsigned char rnd[TOOL_ID_CHARS];

	if (getrandom(rnd, sizeof(rnd), GRND_NONBLOCK) != (ssize_t)sizeof(rnd)) {
		uint64_t x = (uint64_t)time(NULL) ^ (uint64_t)(uintptr_t)out;
		for (size_t i = 0; i < sizeof(rnd); i++) {
			x = x * 6364136223846793005ull + 1442695040888963407ull;
			rnd[i] = (unsigned char)(x >> 56);
		}
	}
	memcpy(out, "call_", 5);
	for (size_t i = 0; i < TOOL_ID_CHARS; i++)
		out[5 + i] = abc[rnd[i] % (sizeof(abc) - 1)];
	out[5 + TOOL_ID_CHARS] = '\0';
}

static bool known_tool(const struct http_gen_req *q, const char *name)
{
	size_t i;
	json_t *fn;

	json_array_foreach(q->tools, i, fn) {
		if (!strcmp(json_string_value(json_object_get(fn, "name")), name))
			return true;
	}
	return false;
}

static bool json_ws(char ch)
{
	return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r';
}

/*
 * The head of a call as the forced constraint writes it (and models mostly
 * do): {"name": "NAME", "arguments": (or Llama 3.1's "parameters":) — any
 * JSON whitespace between tokens. 1 with the name's offset and length and
 * the offset where the arguments object begins; 0 when s (n bytes so far)
 * may still become one; -1 when it cannot.
 */
static int call_head(const char *s, size_t n, size_t *ret_name, size_t *ret_name_len, size_t *ret_args)
{
	static const char *const before[] = { "{", "\"name\"", ":", "\"" }, *const after[] = { "\"", ",", "\"arguments\"", ":" };
	static const char params[] = "\"parameters\"";
	size_t i = 0;

	for (int part = 0; part < 2; part++) {
		const char *const *lit = part ? after : before;
		for (size_t k = 0; k < 4; k++) {
			const char *want = lit[k];
			while (i < n && json_ws(s[i]) && !(part == 1 && k == 0)) /* none inside the name's quotes */
				i++;
			if (part == 1 && k == 2 && i + 1 < n && s[i + 1] == 'p')
				want = params;
			size_t len = strlen(want);
			if (n - i < len)
				return memcmp(s + i, want, n - i) == 0 ? 0 : -1;
			if (memcmp(s + i, want, len) != 0)
				return -1;
			i += len;
		}
		if (part == 0) { /* the name: a tool name has no escapes */
			*ret_name = i;
			while (i < n && s[i] != '"') {
				char ch = s[i++];
				if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
				      ch == '_' || ch == '-' || ch == '.'))
					return -1;
			}
			if (i == n)
				return 0;
			*ret_name_len = i - *ret_name;
		}
	}
	while (i < n && json_ws(s[i]))
		i++;
	if (i == n)
		return 0;
	if (s[i] != '{')
		return -1;
	*ret_args = i;
	return 1;
}

/* Where a call's arguments end: before the trailing whitespace, the call
 * object's closing brace and the whitespace before it, and, for a call in
 * a list (Mistral's forced one), the list's closing bracket before those
 * (from is the arguments' start, or what was sent of them). */
static size_t args_end(const char *s, size_t n, size_t from, bool listed)
{
	size_t e = n;

	while (e > from && json_ws(s[e - 1]))
		e--;
	if (listed && e > from && s[e - 1] == ']') {
		e--;
		while (e > from && json_ws(s[e - 1]))
			e--;
	}
	if (e > from && s[e - 1] == '}')
		e--;
	while (e > from && json_ws(s[e - 1]))
		e--;
	return e;
}

/* JSON text s (n bytes) as a call of one of q's tools, appended to calls;
 * false when it is not one. The arguments are the model's own text of
 * them (what a stream sends), or when the call is not in the usual
 * shape, their compact JSON. */
static bool add_call(const struct http_gen_req *q, const char *s, size_t n, json_t *calls)
{
	json_t *o = json_loadb(s, n, 0, NULL);
	json_t *name = json_object_get(o, "name"), *args = json_object_get(o, "arguments");
	bool ok = false;

	if (!args)
		args = json_object_get(o, "parameters"); /* a model's variant of the format */
	if (json_is_string(name) && json_is_object(args) && known_tool(q, json_string_value(name))) {
		size_t nm = 0, nl = 0, as = 0;
		json_t *a = NULL;
		if (call_head(s, n, &nm, &nl, &as) == 1) {
			size_t end = args_end(s, n, as, false);
			json_t *raw = json_loadb(s + as, end - as, 0, NULL);
			if (raw && json_equal(raw, args))
				a = http_text_json(s + as, end - as);
			json_decref(raw);
		}
		if (!a) {
			char *d = json_dumps(args, JSON_COMPACT | JSON_PRESERVE_ORDER);
			a = d ? json_string(d) : NULL;
			free(d);
		}
		char id[6 + TOOL_ID_CHARS];
		call_id(id);
		json_t *call = a ? json_pack("{s:s, s:s, s:{s:O, s:o}}", "id", id, "type", "function", "function", "name",
					     name, "arguments", a)
				 : NULL;
		ok = call && json_array_append_new(calls, call) == 0;
	}
	json_decref(o);
	return ok;
}

/* Mistral's forced call is a list of one: where its object starts in s
 * (n bytes so far), past the whitespace and '[' before it; 0 for the other
 * shapes; n while s may still be that lead. */
static size_t listed_lead(const struct http_gen_req *q, const char *s, size_t n)
{
	size_t i = 0;

	if (q->call_shape != HTTP_CALL_MISTRAL || q->parallel_forced)
		return 0;
	while (i < n && json_ws(s[i]))
		i++;
	if (i < n && s[i] == '[')
		for (i++; i < n && json_ws(s[i]); i++)
			;
	return i;
}

/* The single forced call's text without the list around it (Mistral's):
 * s[*ret_a .. *ret_e). */
static void listed_span(const struct http_gen_req *q, const char *s, size_t n, size_t *ret_a, size_t *ret_e)
{
	size_t a = listed_lead(q, s, n), e = n;

	if (a) { /* only Mistral's forced call has a lead */
		while (e > a && json_ws(s[e - 1]))
			e--;
		if (e > a && s[e - 1] == ']')
			e--;
	}
	*ret_a = a;
	*ret_e = e;
}

static void append(char **buf, size_t *len, const char *s, size_t n)
{
	char *p = *buf ? realloc(*buf, *len + n + 1) : malloc(n + 1);
	if (!p)
		return; /* out of memory: the content loses this piece */
	memcpy(p + *len, s, n);
	*len += n;
	p[*len] = '\0';
	*buf = p;
}

/* s[0..n) from the first character that is not JSON whitespace, after a
 * call marker a model may write as text ([TOOL_CALLS], <|python_tag|>). */
static const char *skip_lead(const char *s, size_t *n)
{
	static const char *const marks[] = { "[TOOL_CALLS]", "<|python_tag|>" };
	for (int pass = 0; pass < 2; pass++) {
		while (*n && json_ws(*s))
			s++, (*n)--;
		for (size_t k = 0; pass == 0 && k < 2; k++)
			if (*n >= strlen(marks[k]) && !memcmp(s, marks[k], strlen(marks[k])))
				s += strlen(marks[k]), *n -= strlen(marks[k]);
	}
	return s;
}

/*
 * The call shapes that are JSON alone, the whole text: a JSON array of
 * calls (Mistral's, after its [TOOL_CALLS] token; a forced answer with
 * parallel_tool_calls), or call objects one after another, ';' between
 * them (Llama 3.1's {"name", "parameters"}). All or nothing: false, with
 * calls as before, when any part is not a call of one of q's tools. At
 * most max calls are kept.
 */
static bool json_calls(const struct http_gen_req *q, const char *s, size_t n, json_t *calls, size_t max)
{
	size_t before = json_array_size(calls);
	bool ok = true;

	s = skip_lead(s, &n);
	while (n && json_ws(s[n - 1]))
		n--;
	if (n == 0 || (s[0] != '[' && s[0] != '{'))
		return false;
	if (s[0] == '[') {
		json_t *a = json_loadb(s, n, 0, NULL), *v;
		size_t i;
		ok = json_is_array(a) && json_array_size(a);
		json_array_foreach(a, i, v) {
			char *t = ok ? json_dumps(v, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
			ok = t && (json_array_size(calls) - before >= max || add_call(q, t, strlen(t), calls));
			free(t);
		}
		json_decref(a);
	} else {
		while (ok && n) {
			json_error_t err;
			json_t *o = json_loadb(s, n, JSON_DISABLE_EOF_CHECK, &err);
			size_t used = o ? (size_t)err.position : 0;
			json_decref(o);
			ok = used > 0 && used <= n &&
			     (json_array_size(calls) - before >= max || add_call(q, s, used, calls));
			s += used, n -= used;
			while (n && (json_ws(*s) || *s == ';'))
				s++, n--;
		}
	}
	if (!ok)
		while (json_array_size(calls) > before)
			json_array_remove(calls, json_array_size(calls) - 1);
	return ok && json_array_size(calls) > before;
}

/* text → calls (an array, empty when none) and the content outside them
 * (malloc'd, trimmed; NULL when nothing is left). -ENOMEM. */
static int parse_calls(const struct http_gen_req *q, const char *text, size_t len, json_t **ret_calls,
		       char **ret_content, size_t *ret_content_len)
{
	json_t *calls = json_array();
	char *content = NULL;
	size_t clen = 0;

	if (!calls)
		return -ENOMEM;
	if (q->parallel_forced) {
		if (!json_calls(q, text, len, calls, HTTP_MAX_PARALLEL_CALLS))
			append(&content, &clen, text, len);
	} else if (q->tool_mode == HTTP_TOOLS_REQUIRED || q->tool_mode == HTTP_TOOLS_NAMED) {
		size_t a, e;
		listed_span(q, text, len, &a, &e);
		if (!add_call(q, text + a, e - a, calls))
			append(&content, &clen, text, len);
	} else if (!memmem(text, len, open_tag, sizeof(open_tag) - 1)) {
		/* no <tool_call> block: the JSON-only shapes, or plain content */
		if (!json_calls(q, text, len, calls, q->parallel_tool_calls ? HTTP_MAX_TOOLS : 1))
			append(&content, &clen, text, len);
	} else {
		const char *p = text, *end = text + len;
		while (p < end) {
			const char *o = memmem(p, (size_t)(end - p), open_tag, sizeof(open_tag) - 1);
			if (!o) {
				append(&content, &clen, p, (size_t)(end - p));
				break;
			}
			const char *body = o + sizeof(open_tag) - 1;
			const char *c = memmem(body, (size_t)(end - body), close_tag, sizeof(close_tag) - 1);
			const char *body_end = c ? c : end;
			bool more = q->parallel_tool_calls || json_array_size(calls) == 0;
			append(&content, &clen, p, (size_t)(o - p));
			if (more && !add_call(q, body, (size_t)(body_end - body), calls))
				append(&content, &clen, o, (size_t)((c ? c + sizeof(close_tag) - 1 : end) - o));
			p = c ? c + sizeof(close_tag) - 1 : end;
		}
	}
	if (json_array_size(calls) == 0) {
		/* no call: the caller answers with the text as it came */
		free(content);
		content = NULL;
	}
	/* the content beside calls, trimmed; nothing left is none */
	size_t a = 0;
	while (content && a < clen && strchr(" \t\r\n", content[a]))
		a++;
	while (content && clen > a && strchr(" \t\r\n", content[clen - 1]))
		clen--;
	if (content && clen == a) {
		free(content);
		content = NULL;
	} else if (content) {
		memmove(content, content + a, clen - a);
		clen -= a;
		content[clen] = '\0';
	}
	*ret_calls = calls;
	*ret_content = content;
	*ret_content_len = content ? clen : 0;
	return 0;
}

char *tools_response(struct conn *c, const struct kvc_result *res)
{
	struct http_usage u;
	json_t *calls = NULL;
	char *content = NULL, *out = NULL;
	size_t clen = 0;

	add_usage(c, res, &u);
	const char *text = c->out ? c->out : "";
	const char *finish = http_finish_reason(res->finish_reason);
	if (parse_calls(&c->req, text, c->out_len, &calls, &content, &clen) < 0 || json_array_size(calls) == 0) {
		json_decref(calls);
		return http_response_json(HTTP_EP_CHAT, c->id, c->created, c->model, text, c->out_len, finish, &u);
	}
	char *base = http_response_json(HTTP_EP_CHAT, c->id, c->created, c->model, "", 0, "tool_calls", &u);
	json_t *o = base ? json_loads(base, 0, NULL) : NULL;
	json_t *msg = json_object_get(json_array_get(json_object_get(o, "choices"), 0), "message");
	if (msg) {
		json_object_set_new(msg, "content", content ? http_text_json(content, clen) : json_null());
		json_object_set(msg, "tool_calls", calls);
		out = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
	}
	json_decref(o);
	json_decref(calls);
	free(base);
	free(content);
	return out;
}

/* One chunk "data: {...}\n\n" whose choice has this delta (stolen) and finish. */
static int delta_chunk(struct conn *c, json_t *delta, const char *finish)
{
	json_t *o = json_pack("{s:s, s:s, s:I, s:s, s:[{s:i, s:o, s:n, s:s?}]}", "id", c->id, "object",
			      "chat.completion.chunk", "created", (json_int_t)c->created, "model", c->model, "choices",
			      "index", 0, "delta", delta, "logprobs", "finish_reason", finish);
	if (o && c->req.include_usage)
		json_object_set_new(o, "usage", json_null());
	char *s = o ? json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
	json_decref(o);
	if (!s)
		return -ENOMEM;
	int r = out_append(c, "data: ", 6);
	if (r == 0)
		r = out_append(c, s, strlen(s));
	if (r == 0)
		r = out_append(c, "\n\n", 2);
	free(s);
	return r;
}

/* One delta of call i's arguments: n bytes of text. */
static int args_delta(struct conn *c, size_t i, const char *text, size_t n)
{
	return delta_chunk(c, json_pack("{s:[{s:I, s:{s:o}}]}", "tool_calls", "index", (json_int_t)i, "function",
					"arguments", http_text_json(text, n)),
			   NULL);
}

/* The first delta of call i: its id, type and name, empty arguments. */
static int head_delta(struct conn *c, size_t i, const char *id, json_t *name)
{
	return delta_chunk(c, json_pack("{s:[{s:I, s:s, s:s, s:{s:o, s:s}}]}", "tool_calls", "index", (json_int_t)i, "id",
					id, "type", "function", "function", "name", name, "arguments", ""),
			   NULL);
}

/* forced: once the call's head is in, its first delta; then the arguments
 * as they come, all but a tail that may be the call object's end. A text
 * not in that shape is held to the end (and parsed whole there). */
static int stream_forced(struct conn *c)
{
	const char *t = c->tool_text;
	int r = 0;

	if (c->tool_seen)
		return 0;
	if (!c->call_open) {
		size_t nm = 0, nl = 0, as = 0, lead = listed_lead(&c->req, t, c->tool_len);
		if (lead == c->tool_len)
			return 0;
		int h = call_head(t + lead, c->tool_len - lead, &nm, &nl, &as);
		nm += lead;
		as += lead;
		char name[HTTP_MAX_TOOL_NAME + 1];
		if (h == 0)
			return 0;
		if (h < 0 || nl > HTTP_MAX_TOOL_NAME) {
			c->tool_seen = true;
			return 0;
		}
		memcpy(name, t + nm, nl);
		name[nl] = '\0';
		if (!known_tool(&c->req, name)) {
			c->tool_seen = true;
			return 0;
		}
		call_id(c->tool_call_id);
		c->call_open = true;
		c->tool_sent = as;
		if ((r = head_delta(c, 0, c->tool_call_id, json_string(name))) < 0)
			return r;
	}
	size_t end = args_end(t, c->tool_len, c->tool_sent, c->req.call_shape == HTTP_CALL_MISTRAL);
	if (end > c->tool_sent) {
		r = args_delta(c, 0, t + c->tool_sent, end - c->tool_sent);
		c->tool_sent = end;
	}
	return r;
}

/* The end of a forced call streamed as it came: the rest of its arguments,
 * and "tool_calls" when the whole text is the call (else it was cut). */
static int finish_forced(struct conn *c, const struct kvc_result *res, const char **ret_finish)
{
	json_t *calls = json_array();
	int r = 0;

	if (!calls)
		return -ENOMEM;
	size_t end = args_end(c->tool_text, c->tool_len, c->tool_sent, c->req.call_shape == HTTP_CALL_MISTRAL), a, e;
	if (end > c->tool_sent)
		r = args_delta(c, 0, c->tool_text + c->tool_sent, end - c->tool_sent);
	listed_span(&c->req, c->tool_text, c->tool_len, &a, &e);
	bool whole = add_call(&c->req, c->tool_text + a, e - a, calls);
	*ret_finish = whole ? "tool_calls" : http_finish_reason(res->finish_reason);
	json_decref(calls);
	return r;
}

/* auto: send the text that cannot be part of a call as content — all of
 * it up to a <tool_call>, or up to a tail that could still become one. */
static int flush_content(struct conn *c)
{
	const size_t tag = sizeof(open_tag) - 1;
	const char *t = c->tool_text + c->tool_sent;
	size_t n = c->tool_len - c->tool_sent, send;

	if (c->tool_seen || n == 0)
		return 0;
	if (c->tool_sent == 0) {
		/* a text that opens with JSON (or a call marker) may be calls in
		 * the JSON-only shapes: held to the end */
		size_t rest = n;
		const char *lead = skip_lead(t, &rest);
		if (rest == 0)
			return 0;
		if (*lead == '{' || *lead == '[') {
			c->tool_seen = true;
			return 0;
		}
	}
	const char *o = memmem(t, n, open_tag, tag);
	if (o) {
		send = (size_t)(o - t);
		c->tool_seen = true;
	} else {
		size_t k = n < tag - 1 ? n : tag - 1;
		while (k && memcmp(t + n - k, open_tag, k) != 0)
			k--;
		send = n - k;
	}
	if (!send)
		return 0;
	c->tool_sent += send;
	return delta_chunk(c, json_pack("{s:o}", "content", http_text_json(t, send)), NULL);
}

int tools_stream_event(struct conn *c, const struct kvc_event *ev)
{
	char *p = c->tool_text ? realloc(c->tool_text, c->tool_len + ev->text_len + 1) : malloc(ev->text_len + 1);
	if (!p)
		return -ENOMEM;
	memcpy(p + c->tool_len, ev->text, ev->text_len);
	c->tool_len += ev->text_len;
	p[c->tool_len] = '\0';
	c->tool_text = p;
	if (c->req.parallel_forced)
		c->tool_seen = true; /* a list of calls: sent call by call at the end */
	return c->req.tool_mode == HTTP_TOOLS_AUTO ? flush_content(c) : stream_forced(c);
}

int tools_stream_finish(struct conn *c, const struct kvc_result *res)
{
	struct http_usage u;
	json_t *calls = NULL, *call;
	char *content = NULL;
	size_t clen = 0, i;
	/* what is left after the content already sent */
	const char *text = c->tool_text ? c->tool_text + c->tool_sent : "";
	size_t len = c->tool_len - c->tool_sent;
	int r;

	add_usage(c, res, &u);
	const char *finish = NULL;
	if (c->call_open) {
		r = finish_forced(c, res, &finish);
		goto end;
	}
	if ((r = parse_calls(&c->req, text, len, &calls, &content, &clen)) < 0)
		return r;
	finish = json_array_size(calls) ? "tool_calls" : http_finish_reason(res->finish_reason);
	if (json_array_size(calls) == 0) {
		if (len) /* no call: the text as it came */
			r = delta_chunk(c, json_pack("{s:o}", "content", http_text_json(text, len)), NULL);
	} else if (content) {
		r = delta_chunk(c, json_pack("{s:o}", "content", http_text_json(content, clen)), NULL);
	}
	json_array_foreach(calls, i, call) {
		json_t *f = json_object_get(call, "function");
		const char *args = json_string_value(json_object_get(f, "arguments"));
		if (r == 0)
			r = head_delta(c, i, json_string_value(json_object_get(call, "id")), json_incref(json_object_get(f, "name")));
		for (size_t off = 0, n = strlen(args), k; r == 0 && off < n; off += k) {
			k = n - off < TOOL_ARGS_CHUNK ? n - off : TOOL_ARGS_CHUNK;
			while (off + k < n && k > 1 && ((unsigned char)args[off + k] & 0xc0) == 0x80)
				k--; /* whole UTF-8 characters */
			r = args_delta(c, i, args + off, k);
		}
	}
end:
	if (r == 0)
		r = delta_chunk(c, json_object(), finish);
	if (r == 0 && c->req.include_usage) {
		size_t n = 0;
		char *sse = http_chunk_sse(HTTP_EP_CHAT, c->id, c->created, c->model, false, NULL, 0, NULL, &u, false, &n);
		r = out_take(c, sse, n);
	}
	json_decref(calls);
	free(content);
	return r;
}
