/*
 * client/http/toolcall.c — a model's text read back as OpenAI tool calls.
 *
 * With tool_choice "required" or a named function the output was
 * constrained to one bare call object, {"name": ..., "arguments": {...}}
 * (structured.c), and the whole text is that call. With "auto" the text is
 * free: each <tool_call>{...}</tool_call> block naming one of the request's
 * tools is a call (a last block whose closing tag the model never wrote
 * counts when its JSON is whole), and the text outside the blocks, trimmed,
 * is the message's content (null when nothing is left). parallel_tool_calls
 * false keeps the first call only. A text with no call is answered as
 * plain content with the usual finish reason; one with calls has
 * finish_reason "tool_calls" and message.tool_calls, each with an id
 * "call_" + 24 random letters and digits and its arguments as JSON text.
 *
 * Streaming: with "auto" the text streams as content as it comes, up to
 * the first <tool_call> (a tail that could still become one waits for the
 * next token); from there on, and with a forced call all of it, the text
 * is held until the request ends (whether it is a call is known only
 * then). Calls are then sent as OpenAI streams them: per call a first delta with its index, id, type and name
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

/* JSON text s (n bytes) as a call of one of q's tools, appended to calls;
 * false when it is not one. */
static bool add_call(const struct http_gen_req *q, const char *s, size_t n, json_t *calls)
{
	json_t *o = json_loadb(s, n, 0, NULL);
	json_t *name = json_object_get(o, "name"), *args = json_object_get(o, "arguments");
	bool ok = false;

	if (!args)
		args = json_object_get(o, "parameters"); /* a model's variant of the format */
	if (json_is_string(name) && json_is_object(args) && known_tool(q, json_string_value(name))) {
		/* ASCII (\u escapes), so a stream can cut it anywhere */
		char *a = json_dumps(args, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_ENSURE_ASCII);
		char id[6 + TOOL_ID_CHARS];
		call_id(id);
		json_t *call = a ? json_pack("{s:s, s:s, s:{s:O, s:s}}", "id", id, "type", "function", "function", "name",
					     name, "arguments", a)
				 : NULL;
		ok = call && json_array_append_new(calls, call) == 0;
		free(a);
	}
	json_decref(o);
	return ok;
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
	if (q->tool_mode == HTTP_TOOLS_REQUIRED || q->tool_mode == HTTP_TOOLS_NAMED) {
		if (!add_call(q, text, len, calls))
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

/* auto: send the text that cannot be part of a call as content — all of
 * it up to a <tool_call>, or up to a tail that could still become one. */
static int flush_content(struct conn *c)
{
	const size_t tag = sizeof(open_tag) - 1;
	const char *t = c->tool_text + c->tool_sent;
	size_t n = c->tool_len - c->tool_sent, send;

	if (c->tool_seen || n == 0)
		return 0;
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
	return c->req.tool_mode == HTTP_TOOLS_AUTO ? flush_content(c) : 0;
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
	if ((r = parse_calls(&c->req, text, len, &calls, &content, &clen)) < 0)
		return r;
	const char *finish = json_array_size(calls) ? "tool_calls" : http_finish_reason(res->finish_reason);
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
			r = delta_chunk(c, json_pack("{s:[{s:I, s:O, s:s, s:{s:O, s:s}}]}", "tool_calls", "index", (json_int_t)i,
						     "id", json_object_get(call, "id"), "type", "function", "function",
						     "name", json_object_get(f, "name"), "arguments", ""),
					NULL);
		for (size_t off = 0, n = strlen(args); r == 0 && off < n; off += TOOL_ARGS_CHUNK) {
			size_t k = n - off < TOOL_ARGS_CHUNK ? n - off : TOOL_ARGS_CHUNK;
			json_t *piece = json_stringn(args + off, k); /* ASCII: any cut is whole characters */
			r = delta_chunk(c, json_pack("{s:[{s:I, s:{s:o}}]}", "tool_calls", "index", (json_int_t)i, "function",
						     "arguments", piece),
					NULL);
		}
	}
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
