/*
 * daemon/model/tokenizer_chat.c — kvd_chat_render(): a conversation as the
 * prompt text of the chat template family the model's file carries
 * (recognised at load, tokenizer_load.c), written out by hand per family as
 * the template would render it.
 */
#include "tokenizer_impl.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "unicode.h"

struct sbuf {
	char *out;
	size_t cap;
	size_t len;
};

static void sb_put(struct sbuf *b, const char *s, size_t n)
{
	if (b->len < b->cap) {
		size_t room = b->cap - b->len;
		memcpy(b->out + b->len, s, n < room ? n : room);
	}
	b->len += n;
}

static void sb_str(struct sbuf *b, const char *s)
{
	sb_put(b, s, strlen(s));
}

/* Python's str.isspace(), which Jinja's trim and str.strip() use. */
static bool py_space(uint32_t cp)
{
	return (cp >= 0x1C && cp <= 0x1F) || (kvd_unicode_flags(cp) & KVD_CPF_SPACE);
}

/* s[0..n) without leading and trailing white space, as str.strip(). */
static const char *py_strip(const char *s, size_t *n)
{
	const unsigned char *u = (const unsigned char *)s;
	size_t a = 0, b = *n;
	while (a < b) {
		uint32_t cp;
		size_t l = kvd_utf8_decode_lenient(u + a, b - a, &cp);
		if (!py_space(cp))
			break;
		a += l;
	}
	while (b > a) {
		size_t k = b - 1;
		while (k > a && (u[k] & 0xC0) == 0x80 && b - k < 4)
			k--;
		uint32_t cp;
		size_t l = kvd_utf8_decode_lenient(u + k, b - k, &cp);
		if (l != b - k || !py_space(cp))
			break;
		b = k;
	}
	*n = b - a;
	return s + a;
}

static void sb_stripped(struct sbuf *b, const char *s)
{
	size_t n = strlen(s);
	s = py_strip(s, &n);
	sb_put(b, s, n);
}

static void sb_eos(struct sbuf *b, const struct kvd_tokenizer *t, const char *fallback)
{
	size_t el;
	if (t->eos >= 0 && t->text_off[t->eos + 1] > t->text_off[t->eos]) {
		const char *e = tok_text(t, t->eos, &el);
		sb_put(b, e, el);
	} else {
		sb_str(b, fallback);
	}
}

/*
 * Llama-2-chat: a leading system message goes into the first user turn as
 * a <<SYS>> block, each user turn is "[INST] content [/INST]" (stripped,
 * with BOS text before every turn but the first), each assistant turn
 * " content </s>". Without <<SYS>> in the template the system text opens
 * the first user turn, followed by a blank line.
 */
static int render_llama2(struct sbuf *b, const struct kvd_tokenizer *t, const struct kvd_chat_msg *msgs,
			 size_t n_msgs)
{
	const char *sys = NULL;
	size_t i = 0, users = 0;
	if (n_msgs && strcmp(msgs[0].role, "system") == 0)
		sys = msgs[i++].content;
	for (; i < n_msgs; i++) {
		if (strcmp(msgs[i].role, "user") == 0) {
			if (users++ > 0) {
				if (t->bos >= 0) {
					size_t bl;
					const char *bos = tok_text(t, t->bos, &bl);
					sb_put(b, bos, bl);
				} else {
					sb_str(b, "<s>");
				}
			}
			sb_str(b, "[INST] ");
			if (sys && users == 1) {
				/* The template strips the combined text: build it first. */
				size_t sl = strlen(sys), cl = strlen(msgs[i].content);
				char *all = malloc(sl + cl + 32);
				if (!all)
					return -ENOMEM;
				int n = sprintf(all, t->l2_sys ? "<<SYS>>\n%s\n<</SYS>>\n\n%s" : "%s\n\n%s", sys,
						msgs[i].content);
				size_t al = (size_t)n;
				const char *s = py_strip(all, &al);
				sb_put(b, s, al);
				free(all);
			} else {
				sb_stripped(b, msgs[i].content);
			}
			sb_str(b, " [/INST]");
		} else if (strcmp(msgs[i].role, "assistant") == 0) {
			sb_str(b, " ");
			sb_stripped(b, msgs[i].content);
			sb_str(b, " ");
			sb_eos(b, t, "</s>");
		}
		/* A system message after the first turn has no place in this format. */
	}
	return 0;
}

int kvd_chat_render(const struct kvd_tokenizer *t, const struct kvd_chat_msg *msgs, size_t n_msgs,
		    int add_assistant, char *out, size_t cap)
{
	if (!msgs && n_msgs)
		return -EINVAL;
	for (size_t i = 0; i < n_msgs; i++) {
		const char *role = msgs[i].role;
		if (!role || !msgs[i].content ||
		    (strcmp(role, "system") && strcmp(role, "user") && strcmp(role, "assistant")))
			return -EINVAL;
	}
	if (!out)
		cap = 0;
	struct sbuf b = { out, cap, 0 };
	int r;

	switch (t->chat) {
	case CHAT_CHATML:
		if (n_msgs && t->chat_system && strcmp(msgs[0].role, "system") != 0) {
			sb_str(&b, "<|im_start|>system\n");
			sb_put(&b, t->chat_system, t->chat_system_len);
			sb_str(&b, "<|im_end|>\n");
		}
		for (size_t i = 0; i < n_msgs; i++) {
			sb_str(&b, "<|im_start|>");
			sb_str(&b, msgs[i].role);
			sb_str(&b, "\n");
			sb_str(&b, msgs[i].content);
			sb_str(&b, "<|im_end|>\n");
		}
		if (add_assistant)
			sb_str(&b, "<|im_start|>assistant\n");
		break;
	case CHAT_LLAMA3:
		for (size_t i = 0; i < n_msgs; i++) {
			sb_str(&b, "<|start_header_id|>");
			sb_str(&b, msgs[i].role);
			sb_str(&b, "<|end_header_id|>\n\n");
			sb_stripped(&b, msgs[i].content);
			sb_str(&b, "<|eot_id|>");
		}
		if (add_assistant)
			sb_str(&b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
		break;
	case CHAT_LLAMA2:
		if ((r = render_llama2(&b, t, msgs, n_msgs)) < 0)
			return r;
		break;
	case CHAT_GEMMA: {
		/* A leading system message becomes the first turn's prefix
		 * (content + "\n\n"); assistant turns are "model" turns, any
		 * other (a later system message) a user turn. Gemma's template
		 * refuses conversations that do not alternate user, assistant,
		 * ...; they are rendered here all the same. */
		size_t i0 = n_msgs && !strcmp(msgs[0].role, "system") ? 1 : 0;
		for (size_t i = i0; i < n_msgs; i++) {
			bool model = !strcmp(msgs[i].role, "assistant");
			sb_str(&b, model ? "<start_of_turn>model\n" : "<start_of_turn>user\n");
			if (i == i0 && i0) {
				sb_str(&b, msgs[0].content);
				sb_str(&b, "\n\n");
			}
			sb_stripped(&b, msgs[i].content);
			sb_str(&b, "<end_of_turn>\n");
		}
		if (add_assistant)
			sb_str(&b, "<start_of_turn>model\n");
		break;
	}
	case CHAT_ZEPHYR:
		for (size_t i = 0; i < n_msgs; i++) {
			sb_str(&b, "<|");
			sb_str(&b, msgs[i].role);
			sb_str(&b, "|>\n");
			sb_str(&b, msgs[i].content);
			if (t->zephyr_end == ZEPHYR_END_EOS)
				sb_eos(&b, t, "</s>");
			else
				sb_str(&b, t->zephyr_end == ZEPHYR_END_PHI3 ? "<|end|>" : "<|endoftext|>");
			sb_str(&b, "\n");
		}
		if (t->zephyr_end == ZEPHYR_END_PHI3) {
			/* Phi-3 closes a conversation without a reply prompt with EOS. */
			if (add_assistant)
				sb_str(&b, "<|assistant|>\n");
			else
				sb_eos(&b, t, "<|endoftext|>");
		} else if (add_assistant && n_msgs) {
			/* Zephyr asks for the reply inside its message loop. */
			sb_str(&b, "<|assistant|>\n");
		}
		break;
	default:
		return -ENOTSUP;
	}
	if (cap)
		out[b.len < cap ? b.len : cap - 1] = '\0';
	return b.len > INT_MAX ? -E2BIG : (int)b.len;
}

