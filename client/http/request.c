/*
 * client/http/request.c — OpenAI request bodies in, OpenAI JSON out.
 *
 * Untrusted bodies are parsed only by jansson (duplicate keys refused,
 * NUL characters in strings refused) after a scan that refuses nesting
 * deeper than HTTP_MAX_JSON_DEPTH; this file then walks the parsed tree and
 * checks every parameter it understands against what kvd can do today:
 * chat messages with earlier turns (system/developer, user, assistant and
 * tool turns, rendered by kvd's chat template; tool calls and results in
 * structured.c's generic format), 'n' parallel samples, log-probabilities
 * (chat's logprobs/top_logprobs, completions' logprobs), structured output
 * and tools (structured.c), besides the sampling parameters. The rule is
 * "honour exactly or refuse": a parameter whose meaning the gateway cannot
 * reproduce (penalties OpenAI defines differently from kvd's, best_of,
 * echo, suffix, and the vendor extras of vLLM or llama.cpp that change
 * what is generated, such as ignore_eos) gets a 400 naming it, never a
 * silent approximation. Other keys this file does
 * not know are ignored, as every OpenAI-compatible server does, since
 * clients send metadata (user, store, metadata, ...) that does not change
 * the answer. 'cache_salt' (vLLM's) is honoured: it names the cache tenant
 * the request's prompt pages are shared within (server.c).
 *
 * Nothing here knows HTTP or kvd, so tests/fuzz/fuzz_http_request.c can
 * drive the parser alone.
 */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "http.h"

int http_fail(struct http_error *e, int status, const char *type, const char *code, const char *param,
	      const char *fmt, ...)
{
	va_list ap;

	e->status = status;
	e->type = type;
	e->code = code;
	e->line = e->column = 0;
	e->has_pointer = false;
	e->pointer[0] = '\0';
	snprintf(e->param, sizeof(e->param), "%s", param ? param : "");
	va_start(ap, fmt);
	vsnprintf(e->message, sizeof(e->message), fmt, ap);
	va_end(ap);
	return -EINVAL;
}

#define BAD(e, param, ...) http_fail(e, 400, "invalid_request_error", NULL, param, __VA_ARGS__)
#define UNSUPPORTED(e, param, ...) http_fail(e, 400, "invalid_request_error", "unsupported_parameter", param, __VA_ARGS__)

void http_gen_req_clear(struct http_gen_req *r)
{
	free(r->model);
	free(r->cache_salt);
	free(r->system);
	free(r->prompt);
	for (size_t i = 0; i < r->n_messages; i++)
		free((char *)r->messages[i].content);
	free(r->messages);
	for (size_t i = 0; i < r->n_tool_turns; i++)
		free((char *)r->tool_turns[i].content);
	free(r->tool_turns);
	for (size_t i = 0; i < r->n_stop; i++)
		free(r->stop[i]);
	free(r->constraint_text);
	json_decref(r->tools);
	free(r->tool_name);
	memset(r, 0, sizeof(*r));
}

/* The value of key k, or NULL when absent or JSON null (OpenAI treats an
 * explicit null as "not given"). */
static json_t *opt(json_t *o, const char *k)
{
	json_t *v = json_object_get(o, k);
	return json_is_null(v) ? NULL : v;
}

static int take_string(json_t *v, char **ret, size_t *ret_len)
{
	size_t n = json_string_length(v);
	char *s = malloc(n + 1);
	if (!s)
		return -ENOMEM;
	memcpy(s, json_string_value(v), n);
	s[n] = '\0';
	*ret = s;
	if (ret_len)
		*ret_len = n;
	return 0;
}

static int oom(struct http_error *e)
{
	http_fail(e, 500, "server_error", NULL, NULL, "out of memory");
	return -ENOMEM;
}

/* A number in [lo, hi] (lo excluded when lo_open). */
static int get_number(json_t *o, const char *k, double lo, double hi, bool lo_open, bool *has, double *ret,
		      struct http_error *e)
{
	json_t *v = opt(o, k);
	if (!v)
		return 0;
	if (!json_is_number(v))
		return BAD(e, k, "'%s' must be a number", k);
	double d = json_number_value(v);
	if (!isfinite(d) || d > hi || d < lo || (lo_open && d == lo))
		return BAD(e, k, "'%s' is %g; it must be %s %g and <= %g", k, d, lo_open ? ">" : ">=", lo, hi);
	*has = true;
	*ret = d;
	return 0;
}

/* A parameter accepted only at its neutral value: absent, null, or equal
 * to what "off" means (false, 0, 1, {} or [] as given). */
static int only_neutral(json_t *o, const char *k, struct http_error *e, const char *why)
{
	json_t *v = opt(o, k);
	if (!v)
		return 0;
	if (json_is_false(v))
		return 0;
	if (json_is_number(v) && json_number_value(v) == 0 && strcmp(k, "n") != 0 && strcmp(k, "best_of") != 0)
		return 0;
	if (json_is_integer(v) && json_integer_value(v) == 1 && (!strcmp(k, "n") || !strcmp(k, "best_of")))
		return 0;
	if ((json_is_object(v) && json_object_size(v) == 0) || (json_is_array(v) && json_array_size(v) == 0))
		return 0;
	return UNSUPPORTED(e, k, "'%s' is not supported by kvd-http: %s", k, why);
}

/* Keys of other servers' APIs that change what is generated. Each is
 * accepted only at the value that means "as without it" (neutral: false,
 * 0, "", [], {} — or true where that is the default). */
static const struct {
	const char *key;
	bool neutral_true;
	const char *why;
} semantic_extras[] = {
	{ "ignore_eos", false, "kvd always stops at the end of the answer" },
	{ "min_tokens", false, "kvd has no minimum length" },
	{ "stop_token_ids", false, "kvd stops on strings ('stop'), not token ids" },
	{ "include_stop_str_in_output", false, "kvd never includes the stop string" },
	{ "skip_special_tokens", true, "kvd never returns special tokens as text" },
	{ "spaces_between_special_tokens", true, "kvd never returns special tokens as text" },
	{ "add_generation_prompt", true, "kvd's chat template always opens the assistant's turn" },
	{ "continue_final_message", false, "the last message must be a user message" },
	{ "add_special_tokens", false, "kvd adds the model's own special tokens" },
	{ "echo", false, "the prompt is not echoed" },
	{ "chat_template", false, "kvd renders the model's own chat template" },
	{ "chat_template_kwargs", false, "kvd renders the model's own chat template" },
	{ "documents", false, "no retrieval documents" },
	{ "structured_outputs", false, "use guided_json, guided_regex, guided_choice or guided_grammar" },
	{ "guided_whitespace_pattern", false, "kvd writes JSON with its own whitespace" },
	{ "guided_decoding_backend", false, "kvd has one constraint engine" },
	{ "bad_words", false, "kvd's sampler bans no words" },
	{ "allowed_token_ids", false, "kvd's sampler takes no token lists" },
	{ "prompt_logprobs", false, "only the generated tokens' log-probabilities" },
	{ "use_beam_search", false, "no beam search" },
	{ "length_penalty", false, "no beam search" },
	{ "truncate_prompt_tokens", false, "kvd refuses a prompt that does not fit instead of cutting it" },
	{ "repetition_penalty", false, "use kvd's 'repeat_penalty'" },
	{ "typical_p", false, "kvd's sampler has no typical sampling" },
	{ "tfs_z", false, "kvd's sampler has no tail-free sampling" },
	{ "mirostat", false, "kvd's sampler has no mirostat" },
	{ "dynatemp_range", false, "kvd's sampler has no dynamic temperature" },
	{ "xtc_probability", false, "kvd's sampler has no XTC" },
	{ "dry_multiplier", false, "kvd's sampler has no DRY penalty" },
	{ "prediction", false, "no predicted outputs" },
	{ "reasoning_effort", false, "the model has no reasoning effort setting" },
	{ "audio", false, "text only" },
	{ "web_search_options", false, "no web search" },
};

static bool is_neutral(json_t *v, bool neutral_true)
{
	if (neutral_true)
		return json_is_true(v);
	return json_is_false(v) || (json_is_number(v) && json_number_value(v) == 0) ||
	       (json_is_string(v) && json_string_length(v) == 0) ||
	       (json_is_object(v) && json_object_size(v) == 0) || (json_is_array(v) && json_array_size(v) == 0);
}

static int refuse_extras(json_t *o, struct http_error *e)
{
	for (size_t i = 0; i < sizeof(semantic_extras) / sizeof(semantic_extras[0]); i++) {
		json_t *v = opt(o, semantic_extras[i].key);
		if (v && !is_neutral(v, semantic_extras[i].neutral_true))
			return UNSUPPORTED(e, semantic_extras[i].key, "'%s' is not supported by kvd-http: %s",
					   semantic_extras[i].key, semantic_extras[i].why);
	}
	return 0;
}

/* Refuse nesting deeper than HTTP_MAX_JSON_DEPTH before jansson sees it
 * (strings skipped, escapes included). */
static int check_depth(const char *body, size_t len, struct http_error *e)
{
	unsigned depth = 0;
	bool in_str = false;

	for (size_t i = 0; i < len; i++) {
		char ch = body[i];
		if (in_str) {
			if (ch == '\\')
				i++;
			else if (ch == '"')
				in_str = false;
		} else if (ch == '"') {
			in_str = true;
		} else if (ch == '{' || ch == '[') {
			if (++depth > HTTP_MAX_JSON_DEPTH)
				return BAD(e, NULL, "the request body nests deeper than %d levels", HTTP_MAX_JSON_DEPTH);
		} else if ((ch == '}' || ch == ']') && depth) {
			depth--;
		}
	}
	return 0;
}

static int parse_stop(json_t *o, struct http_gen_req *r, struct http_error *e)
{
	json_t *v = opt(o, "stop");
	if (!v)
		return 0;
	json_t *one[1] = { v };
	json_t **items = one;
	size_t n = 1;
	if (json_is_array(v)) {
		n = json_array_size(v);
		if (n > HTTP_MAX_STOP)
			return BAD(e, "stop", "'stop' has %zu entries; at most %d are allowed", n, HTTP_MAX_STOP);
		items = NULL;
	} else if (!json_is_string(v)) {
		return BAD(e, "stop", "'stop' must be a string or an array of strings");
	}
	for (size_t i = 0; i < n; i++) {
		json_t *s = items ? items[i] : json_array_get(v, i);
		if (!json_is_string(s))
			return BAD(e, "stop", "'stop' must be a string or an array of strings");
		size_t len = json_string_length(s);
		if (len == 0 || len > HTTP_MAX_STOP_BYTES)
			return BAD(e, "stop", "each stop string must be 1 to %d bytes long", HTTP_MAX_STOP_BYTES);
		if (take_string(s, &r->stop[r->n_stop], NULL) < 0)
			return oom(e);
		r->n_stop++;
	}
	return 0;
}

/* The text of a message's content: a string, or an array of
 * {"type":"text","text":...} parts, concatenated. */
int http_content_text(json_t *c, size_t idx, char **ret, size_t *ret_len, struct http_error *e)
{
	char param[48];

	snprintf(param, sizeof(param), "messages[%zu].content", idx);
	if (json_is_string(c))
		return take_string(c, ret, ret_len) < 0 ? oom(e) : 0;
	if (!json_is_array(c))
		return BAD(e, param, "'%s' must be a string or an array of text parts", param);
	size_t total = 0, i;
	json_t *part;
	json_array_foreach(c, i, part) {
		json_t *type = json_object_get(part, "type"), *text = json_object_get(part, "text");
		if (!json_is_string(type) || strcmp(json_string_value(type), "text") != 0)
			return UNSUPPORTED(e, param, "only text parts are supported in '%s'", param);
		if (!json_is_string(text))
			return BAD(e, param, "a text part of '%s' needs a string 'text'", param);
		total += json_string_length(text);
	}
	char *s = malloc(total + 1);
	if (!s)
		return oom(e);
	size_t off = 0;
	json_array_foreach(c, i, part) {
		json_t *text = json_object_get(part, "text");
		memcpy(s + off, json_string_value(text), json_string_length(text));
		off += json_string_length(text);
	}
	s[off] = '\0';
	*ret = s;
	*ret_len = off;
	return 0;
}

/* The turns of a conversation as kvd receives them (owned texts). */
struct turns {
	struct kvc_chat_msg *m;
	size_t *len;
	size_t n;
	bool last_is_tool; /* the last turn holds tool responses (more join it) */
};

static int turns_push(struct turns *t, const char *role, char *text, size_t len)
{
	t->m[t->n] = (struct kvc_chat_msg){ role, text };
	t->len[t->n++] = len;
	t->last_is_tool = false;
	return 0;
}

/* Append text to the last turn, after a newline. */
static int turns_join(struct turns *t, char *text, size_t len, struct http_error *e)
{
	size_t old = t->len[t->n - 1];
	char *s = realloc((char *)t->m[t->n - 1].content, old + 1 + len + 1);
	if (!s) {
		free(text);
		return oom(e);
	}
	s[old] = '\n';
	memcpy(s + old + 1, text, len + 1);
	free(text);
	t->m[t->n - 1].content = s;
	t->len[t->n - 1] = old + 1 + len;
	return 0;
}

/* One message's role (system/developer, user, assistant, tool) as kvd's. */
static int message_role(json_t *msg, size_t i, const char **ret, struct http_error *e)
{
	json_t *role = json_object_get(msg, "role");
	char param[48];

	snprintf(param, sizeof(param), "messages[%zu].role", i);
	if (!json_is_object(msg) || !json_is_string(role))
		return BAD(e, param, "each message must be an object with a string 'role'");
	const char *rs = json_string_value(role);
	if (!strcmp(rs, "system") || !strcmp(rs, "developer"))
		*ret = "system";
	else if (!strcmp(rs, "user"))
		*ret = "user"; /* static: the body is freed after parsing */
	else if (!strcmp(rs, "assistant"))
		*ret = "assistant";
	else if (!strcmp(rs, "tool"))
		*ret = "tool";
	else if (!strcmp(rs, "function"))
		return UNSUPPORTED(e, param, "'function' messages are not supported: use 'tool' messages");
	else
		return BAD(e, param, "unknown role '%.32s'", rs);
	return 0;
}

/* The text kvd gets for message i of role (tool calls and responses
 * rendered, structured.c). */
static int message_text(json_t *msg, size_t i, const char *role, char **ret, size_t *ret_len, struct http_error *e)
{
	json_t *c = json_object_get(msg, "content"), *tc = opt(msg, "tool_calls");
	char param[48], *text = NULL;
	size_t len = 0;
	int x;

	snprintf(param, sizeof(param), "messages[%zu].content", i);
	bool calls = !strcmp(role, "assistant") && json_is_array(tc) && json_array_size(tc);
	if (tc && !strcmp(role, "assistant") && !json_is_array(tc)) {
		snprintf(param, sizeof(param), "messages[%zu].tool_calls", i);
		return BAD(e, param, "'%s' must be an array", param);
	}
	if ((!c || json_is_null(c)) && !calls)
		return BAD(e, param, "'%s' is required", param);
	if (c && !json_is_null(c) && (x = http_content_text(c, i, &text, &len, e)) < 0)
		return x;
	if (text && strlen(text) != len) {
		free(text);
		return BAD(e, param, "'%s' contains a NUL character", param);
	}
	if (!text && !(text = strdup("")))
		return oom(e);
	char *r = NULL;
	x = 0;
	if (calls)
		x = http_render_tool_calls(msg, i, text, len, &r, &len, e);
	else if (!strcmp(role, "tool"))
		x = http_render_tool_response(text, len, &r, &len, e);
	else
		r = text;
	if (r != text)
		free(text);
	if (x < 0)
		return x;
	*ret = r;
	*ret_len = len;
	return 0;
}

/*
 * messages → the request's prompt. kvd renders every turn with the model's
 * chat template itself. A conversation of one optional leading system (or
 * developer) message and one user message goes as system + prompt, which
 * any kvd understands; anything longer goes as the whole list of turns
 * (kvc_gen_params.messages), re-sent with each request, so its earlier
 * turns come from kvd's prefix cache and usage.cached_tokens grows turn by
 * turn with no state here. kvd knows system, user and assistant turns: the
 * gateway renders tools into the system turn, an assistant's tool_calls
 * into its text, and tool results as a user turn (structured.c's generic
 * format; consecutive results share one turn). An assistant message last
 * (a reply prefill) cannot be expressed and is refused by name.
 */
static int parse_messages(json_t *o, struct http_gen_req *r, struct http_error *e)
{
	json_t *m = json_object_get(o, "messages");
	struct turns t = { 0 };
	int x = 0;

	if (!m)
		return BAD(e, "messages", "'messages' is required");
	if (!json_is_array(m) || json_array_size(m) == 0)
		return BAD(e, "messages", "'messages' must be a non-empty array");
	size_t n = json_array_size(m);
	if (n > HTTP_MAX_MESSAGES)
		return BAD(e, "messages", "'messages' has %zu entries; at most %d are allowed", n, HTTP_MAX_MESSAGES);
	t.m = calloc(n + 1, sizeof(*t.m));
	t.len = calloc(n + 1, sizeof(*t.len));
	if (!t.m || !t.len) {
		x = oom(e);
		goto done;
	}
	for (size_t i = 0; i < n && x == 0; i++) {
		json_t *msg = json_array_get(m, i);
		const char *role = NULL;
		char *text = NULL;
		size_t len = 0;
		if ((x = message_role(msg, i, &role, e)) < 0 || (x = message_text(msg, i, role, &text, &len, e)) < 0)
			break;
		if (!strcmp(role, "tool") && t.last_is_tool) {
			x = turns_join(&t, text, len, e);
		} else {
			x = turns_push(&t, !strcmp(role, "tool") ? "user" : role, text, len);
			t.last_is_tool = !strcmp(role, "tool");
		}
	}
	if (x < 0)
		goto done;
	if (r->tools) {
		/* the tools go at the end of the system turn (a new one if none) */
		char *block = http_render_tools_block(r);
		if (!block) {
			x = oom(e);
			goto done;
		}
		size_t bl = strlen(block);
		if (!strcmp(t.m[0].role, "system")) {
			char *s = realloc((char *)t.m[0].content, t.len[0] + 2 + bl + 1);
			if (!s) {
				free(block);
				x = oom(e);
				goto done;
			}
			memcpy(s + t.len[0], "\n\n", 2);
			memcpy(s + t.len[0] + 2, block, bl + 1);
			free(block);
			t.m[0].content = s;
			t.len[0] += 2 + bl;
		} else {
			memmove(t.m + 1, t.m, t.n * sizeof(*t.m));
			memmove(t.len + 1, t.len, t.n * sizeof(*t.len));
			t.m[0] = (struct kvc_chat_msg){ "system", block };
			t.len[0] = bl;
			t.n++;
		}
	}
	if (strcmp(t.m[t.n - 1].role, "user") != 0) {
		x = UNSUPPORTED(e, "messages",
				"the last message must be a user or tool message (an assistant message last, to be "
				"continued, is not supported)");
		goto done;
	}
	if (t.n == 1 || (t.n == 2 && !strcmp(t.m[0].role, "system"))) {
		if (t.n == 2)
			r->system = (char *)t.m[0].content;
		r->prompt = (char *)t.m[t.n - 1].content;
		r->prompt_len = t.len[t.n - 1];
		t.n = 0;
	} else {
		r->messages = t.m;
		r->n_messages = t.n;
		t.m = NULL;
		t.n = 0;
	}
	x = http_tool_turns(m, r, e);
done:
	for (size_t i = 0; i < t.n; i++)
		free((char *)t.m[i].content);
	free(t.m);
	free(t.len);
	return x;
}

static int parse_prompt(json_t *o, struct http_gen_req *r, struct http_error *e)
{
	json_t *p = json_object_get(o, "prompt");
	if (!p)
		return BAD(e, "prompt", "'prompt' is required");
	if (json_is_array(p)) {
		if (json_array_size(p) != 1)
			return UNSUPPORTED(e, "prompt", "'prompt' must be a string or an array of exactly one string "
					   "(batched prompts are not supported)");
		p = json_array_get(p, 0);
	}
	if (!json_is_string(p))
		return UNSUPPORTED(e, "prompt", "'prompt' must be text (token arrays are not supported)");
	return take_string(p, &r->prompt, &r->prompt_len) < 0 ? oom(e) : 0;
}

/* n, and log-probabilities: chat's 'logprobs' (boolean) and 'top_logprobs'
 * (0 .. HTTP_MAX_TOP_LOGPROBS, only with logprobs true); completions'
 * 'logprobs' (the number of alternatives, 0 .. HTTP_MAX_TOP_LOGPROBS; 0
 * still returns the chosen tokens' own). */
static int parse_choices(int ep, json_t *o, struct http_gen_req *r, struct http_error *e)
{
	json_t *v;

	if ((v = opt(o, "n"))) {
		if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > HTTP_MAX_N)
			return BAD(e, "n", "'n' must be an integer from 1 to %d (kvd forks at most %d samples of one prompt)",
				   HTTP_MAX_N, HTTP_MAX_N);
		r->n = (uint32_t)json_integer_value(v);
	}
	if (ep == HTTP_EP_CHAT) {
		if ((v = opt(o, "logprobs"))) {
			if (!json_is_boolean(v))
				return BAD(e, "logprobs", "'logprobs' must be a boolean");
			r->logprobs = json_is_true(v);
		}
		if ((v = opt(o, "top_logprobs"))) {
			if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > HTTP_MAX_TOP_LOGPROBS)
				return BAD(e, "top_logprobs", "'top_logprobs' must be an integer from 0 to %d",
					   HTTP_MAX_TOP_LOGPROBS);
			if (!r->logprobs)
				return BAD(e, "top_logprobs", "'top_logprobs' needs 'logprobs': true");
			r->top_logprobs = (uint32_t)json_integer_value(v);
		}
	} else if ((v = opt(o, "logprobs"))) {
		if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > HTTP_MAX_TOP_LOGPROBS)
			return BAD(e, "logprobs", "'logprobs' must be an integer from 0 to %d", HTTP_MAX_TOP_LOGPROBS);
		r->logprobs = true;
		r->top_logprobs = (uint32_t)json_integer_value(v);
	}
	return 0;
}

static int parse_fields(int ep, json_t *o, struct http_gen_req *r, struct http_error *e)
{
	json_t *v;
	int x;

	r->endpoint = ep;
	if ((v = opt(o, "model"))) {
		if (!json_is_string(v) || json_string_length(v) == 0 || json_string_length(v) >= HTTP_MAX_MODEL_ID)
			return BAD(e, "model", "'model' must be a non-empty string shorter than %d bytes", HTTP_MAX_MODEL_ID);
		if (take_string(v, &r->model, NULL) < 0)
			return oom(e);
	}
	if ((v = opt(o, "stream"))) {
		if (!json_is_boolean(v))
			return BAD(e, "stream", "'stream' must be a boolean");
		r->stream = json_is_true(v);
	}
	if ((v = opt(o, "speculative"))) { /* kvd's own: false opts out of speculative decoding */
		if (!json_is_boolean(v))
			return BAD(e, "speculative", "'speculative' must be a boolean");
		r->no_speculate = json_is_false(v);
	}
	if ((v = opt(o, "stream_options"))) {
		if (!r->stream)
			return BAD(e, "stream_options", "'stream_options' is only allowed when 'stream' is true");
		if (!json_is_object(v))
			return BAD(e, "stream_options", "'stream_options' must be an object");
		json_t *u = opt(v, "include_usage");
		if (u && !json_is_boolean(u))
			return BAD(e, "stream_options.include_usage", "'stream_options.include_usage' must be a boolean");
		r->include_usage = u && json_is_true(u);
	}
	/* max_completion_tokens is the current name, max_tokens the old one */
	const char *mt = opt(o, "max_completion_tokens") && ep == HTTP_EP_CHAT ? "max_completion_tokens" : "max_tokens";
	if ((v = opt(o, mt))) {
		if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > UINT32_MAX)
			return BAD(e, mt, "'%s' must be a positive integer", mt);
		r->has_max_tokens = true;
		r->max_tokens = (uint32_t)json_integer_value(v);
	}
	if ((x = get_number(o, "temperature", 0, 2, false, &r->has_temperature, &r->temperature, e)) < 0 ||
	    (x = get_number(o, "top_p", 0, 1, true, &r->has_top_p, &r->top_p, e)) < 0 ||
	    (x = get_number(o, "min_p", 0, 1, false, &r->has_min_p, &r->min_p, e)) < 0 ||
	    (x = get_number(o, "repeat_penalty", 0, 100, true, &r->has_repeat_penalty, &r->repeat_penalty, e)) < 0)
		return x;
	if (r->has_min_p && r->min_p >= 1)
		return BAD(e, "min_p", "'min_p' must be below 1");
	if ((v = opt(o, "top_k"))) {
		if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX)
			return BAD(e, "top_k", "'top_k' must be a non-negative integer");
		r->has_top_k = true;
		r->top_k = (int32_t)json_integer_value(v);
	}
	if ((v = opt(o, "seed"))) {
		if (!json_is_integer(v))
			return BAD(e, "seed", "'seed' must be an integer");
		r->has_seed = true;
		r->seed = (uint64_t)json_integer_value(v);
	}
	if ((v = opt(o, "priority"))) {
		if (!json_is_integer(v) || json_integer_value(v) < KVC_MIN_PRIORITY ||
		    json_integer_value(v) > KVC_MAX_PRIORITY)
			return BAD(e, "priority", "'priority' must be an integer from %d to %d (lower runs first)",
				   KVC_MIN_PRIORITY, KVC_MAX_PRIORITY);
		r->priority = (int32_t)json_integer_value(v);
	}
	if ((x = parse_stop(o, r, e)) < 0)
		return x;
	if ((x = parse_choices(ep, o, r, e)) < 0)
		return x;

	/* What kvd cannot do: refused by name. */
	if ((x = only_neutral(o, "presence_penalty", e, "kvd's repeat_penalty is a different, multiplicative rule; "
				   "use 'repeat_penalty'")) < 0 ||
	    (x = only_neutral(o, "frequency_penalty", e, "kvd's repeat_penalty is a different, multiplicative rule; "
				   "use 'repeat_penalty'")) < 0 ||
	    (x = only_neutral(o, "logit_bias", e, "kvd's sampler takes no per-token biases")) < 0 ||
	    (x = only_neutral(o, "functions", e, "use 'tools'")) < 0 ||
	    (x = only_neutral(o, "function_call", e, "use 'tool_choice'")) < 0)
		return x;
	if ((x = http_parse_constraint(o, r, e)) < 0)
		return x;
	if (ep == HTTP_EP_CHAT && (x = http_parse_tools(o, r, e)) < 0)
		return x;
	if (ep == HTTP_EP_COMPLETIONS) {
		if ((x = only_neutral(o, "tools", e, "tools are for /v1/chat/completions")) < 0)
			return x;
		if ((v = opt(o, "tool_choice")) && !(json_is_string(v) && !strcmp(json_string_value(v), "none")))
			return UNSUPPORTED(e, "tool_choice", "tools are for /v1/chat/completions");
	}
	if ((x = refuse_extras(o, e)) < 0)
		return x;
	if ((v = opt(o, "cache_salt"))) {
		size_t n = json_is_string(v) ? json_string_length(v) : 0;

		if (!json_is_string(v) || n == 0 || n > HTTP_MAX_CACHE_SALT || memchr(json_string_value(v), 0, n))
			return BAD(e, "cache_salt", "'cache_salt' must be a string of 1 to %d bytes without NUL",
				   HTTP_MAX_CACHE_SALT);
		if (!(r->cache_salt = strdup(json_string_value(v))))
			return BAD(e, NULL, "out of memory");
	}
	if (ep == HTTP_EP_COMPLETIONS) {
		if ((x = only_neutral(o, "best_of", e, "kvd returns every sample it makes: use 'n'")) < 0)
			return x;
		if ((v = opt(o, "suffix")) && !(json_is_string(v) && json_string_length(v) == 0))
			return UNSUPPORTED(e, "suffix", "'suffix' (fill-in-the-middle) is not supported by kvd-http");
		return parse_prompt(o, r, e);
	}
	return parse_messages(o, r, e);
}

int http_parse_gen_request(int ep, const char *body, size_t len, struct http_gen_req *ret, struct http_error *err)
{
	json_error_t je;
	struct http_gen_req r;

	memset(&r, 0, sizeof(r));
	if (len == 0)
		return BAD(err, NULL, "the request body is empty; a JSON object is expected");
	if (check_depth(body, len, err) < 0)
		return -EINVAL;
	json_t *o = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
	if (!o)
		return BAD(err, NULL, "the request body is not valid JSON: %s (at byte %d)", je.text, je.position);
	int x;
	if (!json_is_object(o))
		x = BAD(err, NULL, "the request body must be a JSON object");
	else
		x = parse_fields(ep, o, &r, err);
	json_decref(o);
	if (x < 0) {
		http_gen_req_clear(&r);
		return x;
	}
	*ret = r;
	return 0;
}

/* ---- responses ------------------------------------------------------------------ */

/* A JSON string from text that should be UTF-8; bytes that are not become
 * U+FFFD, so one bad byte from the model cannot make a response invalid. */
static json_t *text_value(const char *s, size_t n)
{
	json_t *v = json_stringn(s, n);
	if (v)
		return v;
	char *t = malloc(n * 3 + 1);
	if (!t)
		return NULL;
	size_t o = 0;
	for (size_t i = 0; i < n;) {
		unsigned char c = (unsigned char)s[i];
		size_t k = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
		json_t *probe = k && i + k <= n && c ? json_stringn(s + i, k) : NULL;
		if (probe) {
			memcpy(t + o, s + i, k);
			o += k;
			i += k;
			json_decref(probe);
		} else {
			memcpy(t + o, "\xef\xbf\xbd", 3);
			o += 3;
			i++;
		}
	}
	v = json_stringn(t, o);
	free(t);
	return v;
}

json_t *http_text_json(const char *s, size_t n)
{
	return text_value(s, n);
}

static char *dump(json_t *o)
{
	if (!o)
		return NULL;
	char *s = json_dumps(o, JSON_COMPACT);
	json_decref(o);
	return s;
}

/* The message may quote the request's bytes (jansson's parse errors do)
 * and be cut inside a UTF-8 sequence: text_value() keeps it valid JSON. */
char *http_error_json(const struct http_error *e)
{
	json_t *msg = text_value(e->message, strlen(e->message));
	json_t *o = json_pack("{s:o, s:s, s:s?, s:s?}", "message", msg, "type", e->type ? e->type : "invalid_request_error",
			      "param", e->param[0] ? e->param : NULL, "code", e->code);
	/* where a grammar or schema is wrong */
	if (o && e->line) {
		json_object_set_new(o, "line", json_integer(e->line));
		json_object_set_new(o, "column", json_integer(e->column));
	}
	if (o && e->has_pointer)
		json_object_set_new(o, "pointer", text_value(e->pointer, strlen(e->pointer)));
	return dump(o ? json_pack("{s:o}", "error", o) : NULL);
}

const char *http_finish_reason(int kvc_finish)
{
	/* enum kvc_finish: 1 eos, 2 length, 3 stop */
	return kvc_finish == 2 ? "length" : "stop";
}

static json_t *usage_json(const struct http_usage *u)
{
	return json_pack("{s:I, s:I, s:I, s:{s:I}}", "prompt_tokens", (json_int_t)u->prompt_tokens, "completion_tokens",
			 (json_int_t)u->completion_tokens, "total_tokens",
			 (json_int_t)u->prompt_tokens + (json_int_t)u->completion_tokens, "prompt_tokens_details",
			 "cached_tokens", (json_int_t)u->cached_tokens);
}

char *http_response_json(int ep, const char *id, long created, const char *model, const char *text, size_t text_len,
			 const char *finish, const struct http_usage *u)
{
	json_t *t = text_value(text, text_len);
	json_t *choice;

	if (!t)
		return NULL;
	if (ep == HTTP_EP_CHAT)
		choice = json_pack("{s:i, s:{s:s, s:o}, s:n, s:s}", "index", 0, "message", "role", "assistant", "content",
				   t, "logprobs", "finish_reason", finish);
	else
		choice = json_pack("{s:i, s:o, s:n, s:s}", "index", 0, "text", t, "logprobs", "finish_reason", finish);
	if (!choice)
		return NULL;
	return dump(json_pack("{s:s, s:s, s:I, s:s, s:[o], s:o}", "id", id, "object",
			      ep == HTTP_EP_CHAT ? "chat.completion" : "text_completion", "created", (json_int_t)created,
			      "model", model, "choices", choice, "usage", usage_json(u)));
}

char *http_chunk_sse(int ep, const char *id, long created, const char *model, bool role_only, const char *text,
		     size_t text_len, const char *finish, const struct http_usage *usage, bool with_usage_null,
		     size_t *ret_len)
{
	json_t *o = json_pack("{s:s, s:s, s:I, s:s}", "id", id, "object",
			      ep == HTTP_EP_CHAT ? "chat.completion.chunk" : "text_completion", "created",
			      (json_int_t)created, "model", model);
	json_t *choices = json_array();
	if (!o || !choices)
		goto fail;
	json_object_set_new(o, "choices", choices);
	if (usage) {
		json_object_set_new(o, "usage", usage_json(usage));
	} else {
		json_t *c;
		if (ep == HTTP_EP_CHAT) {
			json_t *delta = json_object();
			if (!delta)
				goto fail;
			if (role_only) {
				json_object_set_new(delta, "role", json_string("assistant"));
				json_object_set_new(delta, "content", json_string(""));
			} else if (!finish) {
				json_object_set_new(delta, "content", text_value(text, text_len));
			}
			c = json_pack("{s:i, s:o, s:n, s:s?}", "index", 0, "delta", delta, "logprobs", "finish_reason",
				      finish);
		} else {
			c = json_pack("{s:i, s:o, s:n, s:s?}", "index", 0, "text", text_value(finish ? "" : text,
				      finish ? 0 : text_len), "logprobs", "finish_reason", finish);
		}
		if (!c || json_array_append_new(choices, c) < 0)
			goto fail;
		if (with_usage_null)
			json_object_set_new(o, "usage", json_null());
	}
	char *s = dump(o);
	if (!s)
		return NULL;
	size_t n = strlen(s);
	char *out = malloc(n + 9);
	if (!out) {
		free(s);
		return NULL;
	}
	memcpy(out, "data: ", 6);
	memcpy(out + 6, s, n);
	memcpy(out + 6 + n, "\n\n", 3);
	free(s);
	*ret_len = n + 8;
	return out;
fail:
	json_decref(o);
	return NULL;
}
