/*
 * daemon/model/tokenizer_chat_tools.c — tool turns ("tools", "tool_calls",
 * "tool") in each chat family's own tool format, and Mistral's template.
 *
 * The formats are the reference templates' (Qwen 2.5 / 3 for ChatML,
 * Llama 3.1's for Llama 3, Mistral-7B-Instruct-v0.3's for Mistral),
 * written out by hand; families without a tool format of their own get
 * Qwen's texts (<tools>, <tool_call>, <tool_response>) inside their own
 * turns. Most formats need no markers beyond the family's turns, so the
 * tool turns are first rewritten into plain turns (system, user,
 * assistant, and Llama 3's ipython) that tokenizer_chat.c renders; Mistral,
 * whose tool markers are control tokens, is rendered here.
 *
 * The tool and call lists are JSON (parsed with the constraint engine's
 * reader) and written back as Python's json.dumps writes them, the way the
 * templates' tojson does, so a prompt matches the one the model was
 * trained on and a tool loop re-sent turn after turn renders the same
 * tokens (its prefix stays cached).
 */
#include "tokenizer_impl.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar_impl.h"

/* ---- JSON as Python writes it --------------------------------------------- */

static void py_str(struct sbuf *b, const char *s, size_t n)
{
	sb_putc(b, '"');
	for (size_t i = 0; i < n; i++) {
		uint8_t c = (uint8_t)s[i];
		switch (c) {
		case '"': sb_puts(b, "\\\""); break;
		case '\\': sb_puts(b, "\\\\"); break;
		case '\n': sb_puts(b, "\\n"); break;
		case '\r': sb_puts(b, "\\r"); break;
		case '\t': sb_puts(b, "\\t"); break;
		case '\b': sb_puts(b, "\\b"); break;
		case '\f': sb_puts(b, "\\f"); break;
		default:
			if (c < 0x20)
				sb_printf(b, "\\u%04x", c);
			else
				sb_putc(b, (char)c);
		}
	}
	sb_putc(b, '"');
}

static void py_newline(struct sbuf *b, int indent, int level)
{
	sb_putc(b, '\n');
	for (int i = 0; i < indent * level; i++)
		sb_putc(b, ' ');
}

/* v as json.dumps(v, ensure_ascii=False, indent=indent or None) writes it. */
static void py_json(struct sbuf *b, const struct jv *v, int indent, int level)
{
	switch (v->type) {
	case JV_NULL: sb_puts(b, "null"); return;
	case JV_TRUE: sb_puts(b, "true"); return;
	case JV_FALSE: sb_puts(b, "false"); return;
	case JV_NUM: sb_putn(b, v->s, v->n); return;
	case JV_STR: py_str(b, v->s, v->n); return;
	case JV_ARR:
	case JV_OBJ: break;
	}
	bool obj = v->type == JV_OBJ;
	if (v->n == 0) {
		sb_puts(b, obj ? "{}" : "[]");
		return;
	}
	sb_putc(b, obj ? '{' : '[');
	for (uint32_t i = 0; i < v->n; i++) {
		if (i)
			sb_puts(b, indent ? "," : ", ");
		if (indent)
			py_newline(b, indent, level + 1);
		if (obj) {
			py_str(b, v->kids[2 * i].s, v->kids[2 * i].n);
			sb_puts(b, ": ");
			py_json(b, &v->kids[2 * i + 1], indent, level + 1);
		} else {
			py_json(b, &v->kids[i], indent, level + 1);
		}
	}
	if (indent)
		py_newline(b, indent, level);
	sb_putc(b, obj ? '}' : ']');
}

/* {"type": "function", "function": fn} */
static void py_tool(struct sbuf *b, const struct jv *fn, int indent)
{
	if (!indent) {
		sb_puts(b, "{\"type\": \"function\", \"function\": ");
		py_json(b, fn, 0, 0);
		sb_putc(b, '}');
		return;
	}
	sb_puts(b, "{");
	py_newline(b, indent, 1);
	sb_puts(b, "\"type\": \"function\",");
	py_newline(b, indent, 1);
	sb_puts(b, "\"function\": ");
	py_json(b, fn, indent, 1);
	py_newline(b, indent, 0);
	sb_putc(b, '}');
}

/* ---- checking ----------------------------------------------------------------- */

static int why_fail(char *why, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int why_fail(char *why, size_t cap, const char *fmt, ...)
{
	if (why && cap) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(why, cap, fmt, ap);
		va_end(ap);
	}
	return -EINVAL;
}

static bool is_role(const char *role, const char *name)
{
	return !strcmp(role, name);
}

/* Parse a tools (calls = false) or tool_calls list: a non-empty array of
 * objects with a string "name", and "arguments" an object (calls) or
 * "description" a string and "parameters" an object (tools). */
static int parse_list(const char *text, bool calls, struct jdoc **ret, size_t idx, char *why, size_t cap)
{
	struct kvd_grammar_error err = { 0 };
	const char *what = calls ? "tool_calls" : "tools";
	struct jdoc *d = NULL;
	int r = jdoc_parse(text, strlen(text), &d, &err);
	if (r == -ENOMEM)
		return r;
	if (r < 0)
		return why_fail(why, cap, "chat turn %zu (%s) is not JSON: %u:%u: %s", idx, what, err.line, err.col,
				err.msg);
	const struct jv *a = jdoc_root(d);
	if (a->type != JV_ARR || a->n == 0) {
		jdoc_free(d);
		return why_fail(why, cap, "chat turn %zu (%s) must be a non-empty JSON array", idx, what);
	}
	for (uint32_t i = 0; i < a->n; i++) {
		const struct jv *o = &a->kids[i], *name = jv_get(o, "name");
		const struct jv *args = jv_get(o, "arguments"), *id = jv_get(o, "id");
		const struct jv *desc = jv_get(o, "description"), *params = jv_get(o, "parameters");
		const char *bad = o->type != JV_OBJ			   ? "is not an object"
				  : !name || name->type != JV_STR || !name->n ? "has no \"name\" string"
				  : calls && (!args || args->type != JV_OBJ)   ? "has no \"arguments\" object"
				  : calls && id && id->type != JV_STR	   ? "has an \"id\" that is not a string"
				  : !calls && desc && desc->type != JV_STR	   ? "has a \"description\" that is not a string"
				  : !calls && params && params->type != JV_OBJ ? "has \"parameters\" that are not an object"
									       : NULL;
		if (bad) {
			jdoc_free(d);
			return why_fail(why, cap, "chat turn %zu (%s): entry %u %s", idx, what, i, bad);
		}
	}
	*ret = d;
	return 0;
}

int kvd_chat_check(const struct kvd_chat_msg *msgs, size_t n_msgs, char *why, size_t cap)
{
	bool user_seen = false, tools_seen = false;

	if (!msgs && n_msgs)
		return why_fail(why, cap, "no messages");
	for (size_t i = 0; i < n_msgs; i++) {
		const char *role = msgs[i].role;
		if (!role || !msgs[i].content)
			return why_fail(why, cap, "chat turn %zu has no role or no content", i);
		if (is_role(role, "user")) {
			user_seen = true;
		} else if (is_role(role, "tools") || is_role(role, "tool_calls")) {
			bool calls = is_role(role, "tool_calls");
			bool place = i == 0 || (i == 1 && is_role(msgs[0].role, "system"));
			if (!calls && (tools_seen || user_seen || !place || i + 1 >= n_msgs ||
				       !msgs[i + 1].role || !is_role(msgs[i + 1].role, "user")))
				return why_fail(why, cap, "chat turn %zu (tools): %s", i,
						tools_seen  ? "a second list of tools"
						: user_seen ? "the tools come after a user turn"
						: !place    ? "the tools come first, or right after the system message"
							    : "a user turn must follow the tools");
			tools_seen |= !calls;
			struct jdoc *d = NULL;
			int r = parse_list(msgs[i].content, calls, &d, i, why, cap);
			if (r < 0)
				return r;
			jdoc_free(d);
		} else if (is_role(role, "call_open")) {
			const char *before = i ? msgs[i - 1].role : NULL;
			const char *bad = i + 1 != n_msgs ? "is not the last turn"
					  : msgs[i].content[0] ? "has text (it must be empty)"
					  : !tools_seen ? "comes in a conversation without tools"
					  : !before || !(is_role(before, "user") || is_role(before, "tool"))
						  ? "does not follow a user or tool turn"
						  : NULL;
			if (bad)
				return why_fail(why, cap, "chat turn %zu (call_open) %s", i, bad);
		} else if (!is_role(role, "system") && !is_role(role, "assistant") && !is_role(role, "tool")) {
			return why_fail(why, cap, "chat turn %zu has the unknown role '%.32s'", i, role);
		}
	}
	return 0;
}

bool tok_chat_has_tools(const struct kvd_chat_msg *msgs, size_t n_msgs)
{
	for (size_t i = 0; i < n_msgs; i++)
		if (is_role(msgs[i].role, "tools") || is_role(msgs[i].role, "tool_calls") || is_role(msgs[i].role, "tool") ||
		    is_role(msgs[i].role, "call_open"))
			return true;
	return false;
}

/* ---- rewriting into plain turns (every family but Mistral) ------------------------ */

/* The plain turns: roles static, contents owned. */
struct plain {
	struct kvd_chat_msg *m;
	bool *verbatim;
	size_t n;
	int err;
};

static void plain_push(struct plain *p, const char *role, struct sbuf *text, bool verbatim)
{
	if (text->oom || !text->p) {
		if (!text->p && !text->oom && (text->p = strdup("")))
			goto push;
		p->err = -ENOMEM;
		sb_free(text);
		return;
	}
push:
	p->m[p->n] = (struct kvd_chat_msg){ role, text->p };
	p->verbatim[p->n++] = verbatim;
	*text = (struct sbuf){ 0 };
}

/* Append text to the last plain turn, after sep. */
static void plain_join(struct plain *p, const char *sep, struct sbuf *text)
{
	struct sbuf all = { 0 };
	sb_puts(&all, p->m[p->n - 1].content);
	sb_puts(&all, sep);
	sb_putn(&all, text->p ? text->p : "", text->len);
	sb_free(text);
	if (all.oom) {
		sb_free(&all);
		p->err = -ENOMEM;
		return;
	}
	free((char *)p->m[p->n - 1].content);
	p->m[p->n - 1].content = all.p;
}

static const char qwen_head[] =
	"# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
	"You are provided with function signatures within <tools></tools> XML tags:\n<tools>";
static const char qwen_tail[] =
	"\n</tools>\n\nFor each function call, return a json object with function name and arguments "
	"within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
	"<args-json-object>}\n</tool_call>";
static const char llama3_sys[] = "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n";
static const char llama3_user[] =
	"Given the following functions, please respond with a JSON for a function call with its proper "
	"arguments that best answers the given prompt.\n\nRespond in the format {\"name\": function name, "
	"\"parameters\": dictionary of argument name and its value}.Do not use variables.\n\n";

static const struct jv *call_name(const struct jv *c)
{
	return jv_get(c, "name");
}

/* The generic (Qwen) calls: <tool_call> blocks, one per line. */
static void generic_calls(struct sbuf *b, const struct jv *calls)
{
	for (uint32_t i = 0; i < calls->n; i++) {
		const struct jv *c = &calls->kids[i];
		if (i)
			sb_putc(b, '\n');
		sb_puts(b, "<tool_call>\n{\"name\": \"");
		sb_putn(b, call_name(c)->s, call_name(c)->n);
		sb_puts(b, "\", \"arguments\": ");
		py_json(b, jv_get(c, "arguments"), 0, 0);
		sb_puts(b, "}\n</tool_call>");
	}
}

/* Llama 3.1's call: the assistant's whole turn; several joined by "; ". */
static void llama3_calls(struct sbuf *b, const struct jv *calls)
{
	for (uint32_t i = 0; i < calls->n; i++) {
		const struct jv *c = &calls->kids[i];
		if (i)
			sb_puts(b, "; ");
		sb_puts(b, "{\"name\": \"");
		sb_putn(b, call_name(c)->s, call_name(c)->n);
		sb_puts(b, "\", \"parameters\": ");
		py_json(b, jv_get(c, "arguments"), 0, 0);
		sb_putc(b, '}');
	}
}

static int rewrite(const struct kvd_tokenizer *t, const struct kvd_chat_msg *msgs, size_t n, const struct jv *tools,
		   struct plain *p)
{
	bool llama3 = t->chat == CHAT_LLAMA3;
	size_t i0 = n && is_role(msgs[0].role, "system") ? 1 : 0;
	bool first_user = true;
	const char *prev = NULL; /* role of the message before, as given */

	/* The system turn. */
	struct sbuf s = { 0 };
	if (llama3) {
		size_t sl = i0 ? strlen(msgs[0].content) : 0;
		const char *sys = i0 ? chat_strip(msgs[0].content, &sl) : "";
		if (tools)
			sb_puts(&s, "Environment: ipython\n");
		sb_puts(&s, llama3_sys);
		sb_putn(&s, sys, sl);
		plain_push(p, "system", &s, true);
	} else if (tools) {
		if (i0) {
			sb_puts(&s, msgs[0].content);
			sb_puts(&s, "\n\n");
		} else if (t->chat == CHAT_CHATML && t->chat_system) {
			sb_putn(&s, t->chat_system, t->chat_system_len);
			sb_puts(&s, "\n\n");
		}
		sb_puts(&s, qwen_head);
		for (uint32_t k = 0; k < tools->n; k++) {
			sb_putc(&s, '\n');
			py_tool(&s, &tools->kids[k], 0);
		}
		sb_puts(&s, qwen_tail);
		plain_push(p, "system", &s, false);
	} else if (i0) {
		sb_puts(&s, msgs[0].content);
		plain_push(p, "system", &s, false);
	}

	for (size_t i = i0; i < n && !p->err; prev = msgs[i++].role) {
		const char *role = msgs[i].role;
		struct sbuf b = { 0 };
		if (is_role(role, "tools"))
			continue;
		if (llama3 && tools && first_user) {
			first_user = false;
			if (!is_role(role, "user"))
				return -EINVAL; /* the template puts the tools into the first user turn */
			size_t cl = strlen(msgs[i].content);
			const char *c = chat_strip(msgs[i].content, &cl);
			sb_puts(&b, llama3_user);
			for (uint32_t k = 0; k < tools->n; k++) {
				py_tool(&b, &tools->kids[k], 4);
				sb_puts(&b, "\n\n");
			}
			sb_putn(&b, c, cl);
			plain_push(p, "user", &b, true);
		} else if (is_role(role, "tool_calls")) {
			struct jdoc *d = NULL;
			int r = jdoc_parse(msgs[i].content, strlen(msgs[i].content), &d, &(struct kvd_grammar_error){ 0 });
			if (r < 0)
				return r == -ENOMEM ? r : -EINVAL;
			(llama3 ? llama3_calls : generic_calls)(&b, jdoc_root(d));
			jdoc_free(d);
			/* the same reply's text: Llama 3.1 renders the call alone,
			 * Qwen the text and then the calls */
			bool joined = prev && is_role(prev, "assistant");
			if (joined && llama3) {
				free((char *)p->m[--p->n].content);
				plain_push(p, "assistant", &b, true);
			} else if (joined && p->m[p->n - 1].content[0]) {
				plain_join(p, "\n", &b);
			} else if (joined) {
				free((char *)p->m[--p->n].content);
				plain_push(p, "assistant", &b, false);
			} else {
				plain_push(p, "assistant", &b, llama3);
			}
		} else if (is_role(role, "tool") && llama3) {
			py_str(&b, msgs[i].content, strlen(msgs[i].content));
			plain_push(p, "ipython", &b, true);
		} else if (is_role(role, "tool")) {
			sb_puts(&b, "<tool_response>\n");
			sb_puts(&b, msgs[i].content);
			sb_puts(&b, "\n</tool_response>");
			if (prev && is_role(prev, "tool"))
				plain_join(p, "\n", &b);
			else
				plain_push(p, "user", &b, false);
		} else {
			first_user &= !is_role(role, "user");
			sb_puts(&b, msgs[i].content);
			plain_push(p, role[0] == 's' ? "system" : role[0] == 'u' ? "user" : "assistant", &b, false);
		}
	}
	return p->err;
}

/* ---- Mistral ------------------------------------------------------------------- */

/* A call's id as Mistral's template wants it: 9 letters and digits, the
 * last 9 of the given id, else the call's number. */
static void mistral_id(const struct jv *id, size_t ordinal, char out[10])
{
	size_t k = 0;
	if (id && id->type == JV_STR)
		for (size_t i = id->n; i-- > 0 && k < 9;)
			if ((id->s[i] >= 'a' && id->s[i] <= 'z') || (id->s[i] >= 'A' && id->s[i] <= 'Z') ||
			    (id->s[i] >= '0' && id->s[i] <= '9'))
				out[8 - k++] = id->s[i];
	if (k < 9)
		snprintf(out, 10, "%09zu", ordinal % 1000000000u);
	out[9] = '\0';
}

static void put_sbuf(struct render *b, struct sbuf *s)
{
	if (s->oom)
		b->err = -ENOMEM;
	else if (s->len)
		chat_put(b, s->p, s->len);
	sb_free(s);
}

/* The [AVAILABLE_TOOLS] block: each function's members as the template
 * writes them (strings unquoted in quotes, the rest as JSON). */
static void mistral_tools(struct render *b, const struct jv *tools)
{
	struct sbuf s = { 0 };
	chat_mark(b, MK_AVAIL_TOOLS);
	sb_puts(&s, " [");
	for (uint32_t k = 0; k < tools->n; k++) {
		const struct jv *fn = &tools->kids[k];
		sb_puts(&s, "{\"type\": \"function\", \"function\": {");
		bool first = true;
		for (uint32_t m = 0; m < fn->n; m++) {
			const struct jv *key = &fn->kids[2 * m], *val = &fn->kids[2 * m + 1];
			if (key->n == 6 && !memcmp(key->s, "return", 6))
				continue;
			if (!first)
				sb_puts(&s, ", ");
			first = false;
			sb_printf(&s, "\"%s\": ", key->s);
			if (val->type == JV_STR)
				sb_printf(&s, "\"%s\"", val->s);
			else
				py_json(&s, val, 0, 0);
		}
		sb_puts(&s, k + 1 < tools->n ? "}}, " : "}}]");
	}
	put_sbuf(b, &s);
	chat_mark(b, MK_AVAIL_TOOLS_END);
}

static int render_mistral(struct render *b, const struct kvd_chat_msg *msgs, size_t n, const struct jv *tools)
{
	size_t i0 = n && is_role(msgs[0].role, "system") ? 1 : 0, last_user = n, ordinal = 0, call_base = 0,
	       n_calls = 0, result = 0;
	struct jdoc *calls = NULL;

	for (size_t i = i0; i < n; i++)
		if (is_role(msgs[i].role, "user"))
			last_user = i;
	for (size_t i = i0; i < n && !b->err; i++) {
		const char *role = msgs[i].role, *c = msgs[i].content;
		struct sbuf s = { 0 };
		char id[10];
		if (is_role(role, "user")) {
			if (tools && i == last_user)
				mistral_tools(b, tools);
			chat_mark(b, MK_INST);
			chat_str(b, " ");
			if (i + 1 == n && i0) {
				chat_str(b, msgs[0].content);
				chat_str(b, "\n\n");
			}
			chat_str(b, c);
			chat_mark(b, MK_INST_END);
		} else if (is_role(role, "assistant")) {
			if (i + 1 < n && is_role(msgs[i + 1].role, "tool_calls"))
				continue; /* the template writes a reply with calls as its calls alone */
			size_t cl = strlen(c);
			const char *p = chat_strip(c, &cl);
			chat_str(b, " ");
			chat_put(b, p, cl);
			chat_mark(b, MK_EOS);
		} else if (is_role(role, "tool_calls")) {
			jdoc_free(calls);
			calls = NULL;
			int r = jdoc_parse(c, strlen(c), &calls, &(struct kvd_grammar_error){ 0 });
			if (r < 0)
				return r == -ENOMEM ? r : -EINVAL;
			const struct jv *a = jdoc_root(calls);
			call_base = ordinal;
			n_calls = a->n;
			result = 0;
			chat_mark(b, MK_TOOL_CALLS);
			sb_puts(&s, " [");
			for (uint32_t k = 0; k < a->n; k++) {
				const struct jv *call = &a->kids[k];
				mistral_id(jv_get(call, "id"), ordinal++, id);
				sb_puts(&s, "{\"name\": ");
				py_str(&s, call_name(call)->s, call_name(call)->n);
				sb_puts(&s, ", \"arguments\": ");
				py_json(&s, jv_get(call, "arguments"), 0, 0);
				sb_printf(&s, ", \"id\": \"%s\"}%s", id, k + 1 < a->n ? ", " : "]");
			}
			put_sbuf(b, &s);
			chat_mark(b, MK_EOS);
		} else if (is_role(role, "tool")) {
			const struct jv *a = calls ? jdoc_root(calls) : NULL;
			mistral_id(a && result < n_calls ? jv_get(&a->kids[result], "id") : NULL, call_base + result, id);
			result++;
			chat_mark(b, MK_TOOL_RESULTS);
			chat_str(b, " {\"content\": ");
			chat_str(b, c);
			chat_str(b, ", \"call_id\": \"");
			chat_str(b, id);
			chat_str(b, "\"}");
			chat_mark(b, MK_TOOL_RESULTS_END);
		}
		/* a system message after the first has no place in this format */
	}
	jdoc_free(calls);
	return b->err;
}

/* ---- entry --------------------------------------------------------------------- */

/* What the family writes before a call's JSON, for a reply that begins
 * with a call (a last "call_open" turn). */
static void call_opener(struct render *b)
{
	switch (b->t->chat) {
	case CHAT_MISTRAL: chat_mark(b, MK_TOOL_CALLS); break; /* then its array of calls */
	case CHAT_LLAMA3: break;                               /* the call object is the reply */
	case CHAT_LLAMA2: chat_str(b, " <tool_call>\n"); break; /* a reply starts after " " */
	default: chat_str(b, "<tool_call>\n"); break;         /* Qwen's, and the generic format */
	}
}

int tok_chat_render_tools(struct render *b, const struct kvd_chat_msg *msgs, size_t n_msgs, bool add_assistant)
{
	struct jdoc *td = NULL;
	const struct jv *tools = NULL;
	int r;
	bool open_call = n_msgs && is_role(msgs[n_msgs - 1].role, "call_open");

	if (open_call) { /* the reply's start: after the prompt for it */
		n_msgs--;
		add_assistant = true;
	}

	b->tools = tok_chat_has_tools(msgs, n_msgs);
	for (size_t i = 0; i < n_msgs && !td; i++)
		if (is_role(msgs[i].role, "tools")) {
			r = jdoc_parse(msgs[i].content, strlen(msgs[i].content), &td, &(struct kvd_grammar_error){ 0 });
			if (r < 0)
				return r == -ENOMEM ? r : -EINVAL;
			tools = jdoc_root(td);
		}
	if (b->t->chat == CHAT_MISTRAL) {
		r = render_mistral(b, msgs, n_msgs, tools);
		jdoc_free(td);
		if (r == 0 && open_call)
			call_opener(b);
		return r ? r : b->err;
	}
	struct plain p = { .m = calloc(n_msgs + 1, sizeof(*p.m)), .verbatim = calloc(n_msgs + 1, sizeof(bool)) };
	r = p.m && p.verbatim ? rewrite(b->t, msgs, n_msgs, tools, &p) : -ENOMEM;
	if (r == 0)
		r = tok_chat_render_plain(b, p.m, p.n, add_assistant, p.verbatim);
	if (r == 0 && open_call) {
		call_opener(b);
		r = b->err;
	}
	for (size_t i = 0; i < p.n; i++)
		free((char *)p.m[i].content);
	free(p.m);
	free(p.verbatim);
	jdoc_free(td);
	return r;
}
