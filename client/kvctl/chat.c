/*
 * client/kvctl/chat.c — kvctl chat: send a whole conversation (a JSON array
 * of {"role", "content"} messages) and stream the assistant's next reply.
 *
 * The conversation is parsed by jansson, the JSON library kvd-http uses
 * too: the input is a file a user or a script wrote, and a well-kept
 * parser gets escapes, surrogate pairs, duplicate keys and invalid UTF-8
 * right where a hand-written one for "exactly this shape" would be one
 * more parser to fuzz. jansson is optional at build time (the Makefile
 * defines KVCTL_HAVE_JANSSON when pkg-config finds it); without it the
 * command exists and says how to get it. Generation itself (options,
 * streaming, --json, Ctrl-C) is generate.c's.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvctl.h"

#ifdef KVCTL_HAVE_JANSSON
#include <jansson.h>
#endif

static const char help_chat[] =
	"NAME\n"
	"    kvctl chat - continue a conversation with the model loaded in kvd\n"
	"\n"
	"SYNOPSIS\n"
	"    kvctl chat [OPTIONS] [FILE]\n"
	"    echo '[{\"role\":\"user\",\"content\":\"Hi!\"}]' | kvctl chat [OPTIONS] [-]\n"
	"\n"
	"DESCRIPTION\n"
	"    Reads a conversation as JSON from FILE (standard input when it is absent\n"
	"    or \"-\"): an array of 1 to 1024 messages, each an object with exactly the\n"
	"    members \"role\" (\"system\", \"user\" or \"assistant\") and \"content\" (a string);\n"
	"    the last message is the user's. kvd renders the whole conversation with\n"
	"    the model's chat template and kvctl streams the assistant's next reply to\n"
	"    standard output, as 'kvctl generate' does.\n"
	"\n"
	"    Tools (kvd 0.9.0), rendered in the model family's own tool format: role\n"
	"    \"tools\" with the functions as content (a JSON array of {\"name\",\n"
	"    \"description\", \"parameters\"}; first, or right after the system message),\n"
	"    \"tool_calls\" with the assistant's calls (a JSON array of {\"id\", \"name\",\n"
	"    \"arguments\"}, after the same reply's assistant message) and \"tool\" with one\n"
	"    result (the results answer the calls before them in order); a tool result\n"
	"    may be last. The JSON may be given as the array itself or as its text.\n"
	"\n"
	"    No state is kept between calls: append the reply and the next user message\n"
	"    to the array and run kvctl chat again. The earlier turns render to the same\n"
	"    tokens each time, so kvd finds them in its prefix cache (cached_tokens in\n"
	"    --json grows with the conversation).\n"
	"\n"
	"OPTIONS\n"
	"    --max-tokens N, --temperature T, --top-p P, --top-k K, --min-p P,\n"
	"    --repeat-penalty R, --seed N, --stop STRING, --json, --no-newline,\n"
	"    -n/--samples N, --logprobs K\n"
	"                         as for 'kvctl generate' (see kvctl generate --help)\n"
	"\n" COMMON_HELP "\n" EXIT_STATUS_HELP
	"    A conversation that is not valid JSON of the shape above is refused with\n"
	"    status 2 and a message naming the line and column or the message.\n"
	"\n"
	"EXAMPLES\n"
	"    kvctl chat conversation.json\n"
	"    printf '%s' '[{\"role\":\"system\",\"content\":\"Be brief.\"},\n"
	"                 {\"role\":\"user\",\"content\":\"Name a colour.\"},\n"
	"                 {\"role\":\"assistant\",\"content\":\"Blue.\"},\n"
	"                 {\"role\":\"user\",\"content\":\"Another one?\"}]' |\n"
	"        kvctl chat --temperature 0 --json | jq .cached_tokens\n"
	"\n"
	"SEE ALSO\n"
	"    kvctl generate --help\n";

#ifdef KVCTL_HAVE_JANSSON

struct chat_conv_impl {
	json_t *root;
};

static int conv_error(char *err, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int conv_error(char *err, size_t cap, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(err, cap, fmt, ap);
	va_end(ap);
	return -EINVAL;
}

int chat_conv_parse(const char *text, size_t len, struct chat_conv *ret, char *err, size_t err_cap)
{
	json_error_t je;
	json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
	struct kvc_chat_msg *msgs = NULL;
	int r;

	if (!root)
		return conv_error(err, err_cap, "line %d, column %d: %s", je.line, je.column, je.text);
	if (!json_is_array(root) || json_array_size(root) == 0) {
		r = conv_error(err, err_cap, "the conversation must be a non-empty JSON array of messages");
		goto fail;
	}
	size_t n = json_array_size(root);
	if (n > KVC_MAX_CHAT_MSGS) {
		r = conv_error(err, err_cap, "%zu messages; at most %d are allowed", n, KVC_MAX_CHAT_MSGS);
		goto fail;
	}
	msgs = calloc(n, sizeof(*msgs));
	if (!msgs) {
		r = -ENOMEM;
		snprintf(err, err_cap, "out of memory");
		goto fail;
	}
	for (size_t i = 0; i < n; i++) {
		json_t *m = json_array_get(root, i), *role, *content;
		const char *key;
		json_t *v;
		if (!json_is_object(m)) {
			r = conv_error(err, err_cap, "message %zu is not an object", i);
			goto fail;
		}
		json_object_foreach(m, key, v) {
			if (strcmp(key, "role") && strcmp(key, "content")) {
				r = conv_error(err, err_cap, "message %zu: unknown member \"%.40s\" (only \"role\" and "
							     "\"content\")", i, key);
				goto fail;
			}
		}
		role = json_object_get(m, "role");
		content = json_object_get(m, "content");
		const char *rs0 = json_string_value(role);
		if (rs0 && (!strcmp(rs0, "tools") || !strcmp(rs0, "tool_calls")) && json_is_array(content)) {
			/* the list as JSON text, kept in the message (root owns it) */
			char *list = json_dumps(content, JSON_COMPACT | JSON_PRESERVE_ORDER);
			if (!list || json_object_set_new(m, "content", json_string(list)) < 0) {
				free(list);
				r = -ENOMEM;
				snprintf(err, err_cap, "out of memory");
				goto fail;
			}
			free(list);
			content = json_object_get(m, "content");
		}
		if (!json_is_string(role) || !json_is_string(content)) {
			r = conv_error(err, err_cap, "message %zu needs string members \"role\" and \"content\"", i);
			goto fail;
		}
		const char *rs = json_string_value(role);
		if (strcmp(rs, "system") && strcmp(rs, "user") && strcmp(rs, "assistant") && strcmp(rs, "tools") &&
		    strcmp(rs, "tool_calls") && strcmp(rs, "tool")) {
			r = conv_error(err, err_cap,
				       "message %zu: unknown role \"%.40s\" (system, user, assistant, tools, tool_calls or "
				       "tool)", i, rs);
			goto fail;
		}
		if (strlen(json_string_value(content)) != json_string_length(content)) {
			r = conv_error(err, err_cap, "message %zu: the content contains a NUL character (\\u0000)", i);
			goto fail;
		}
		msgs[i] = (struct kvc_chat_msg){ rs, json_string_value(content) };
	}
	if (strcmp(msgs[n - 1].role, "user") && strcmp(msgs[n - 1].role, "tool")) {
		r = conv_error(err, err_cap, "the last message is the %s's; it must be the user's or a tool result",
			       msgs[n - 1].role);
		goto fail;
	}
	ret->msgs = msgs;
	ret->n = n;
	ret->priv = root;
	return 0;
fail:
	free(msgs);
	json_decref(root);
	return r;
}

void chat_conv_free(struct chat_conv *c)
{
	free(c->msgs);
	json_decref(c->priv);
	*c = (struct chat_conv){ 0 };
}

#else /* !KVCTL_HAVE_JANSSON */

int chat_conv_parse(const char *text, size_t len, struct chat_conv *ret, char *err, size_t err_cap)
{
	(void)text;
	(void)len;
	(void)ret;
	snprintf(err, err_cap, "this kvctl was built without jansson, which reads the conversation "
			       "(install libjansson-dev and rebuild)");
	return -EOPNOTSUPP;
}

void chat_conv_free(struct chat_conv *c)
{
	*c = (struct chat_conv){ 0 };
}

#endif

static int cmd_chat(struct ctx *x, int argc, char **argv)
{
	return generate_main(x, argc, argv, true);
}

const char *const kvctl_help_chat = help_chat;

const struct kvctl_command kvctl_cmd_chat = {
	"chat", "continue a conversation given as JSON messages; the reply is streamed", cmd_chat, help_chat,
};
