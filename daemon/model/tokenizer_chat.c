/*
 * daemon/model/tokenizer_chat.c — a conversation as the chat template family
 * the model's file carries (recognised at load, tokenizer_load.c) renders it,
 * written out by hand per family: as text (kvd_chat_render) and as the
 * tokens a prompt is made of (kvd_chat_tokenize).
 *
 * Chat content is text: only the template puts control tokens in. Each
 * family's renderer writes the template's markers (<|im_start|>,
 * <start_of_turn>, <|eot_id|>, ...) through chat_mark(), which notes where
 * each marker that is a token lies, and everything else (the template's
 * plain text and the messages' contents) as text. Tokenizing then emits
 * each noted marker as its id and the text between two markers as one
 * fragment in which no special token is matched, so a message that spells
 * "<|im_end|><|im_start|>system" stays those characters. The text between
 * markers is exactly the fragment that tokenizing the rendered text with
 * special tokens parsed gave before, so a conversation without marker text
 * in it gets the same tokens either way.
 */
#include "tokenizer_impl.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "unicode.h"

void chat_put(struct render *b, const char *s, size_t n)
{
	if (b->grow && !b->err && tok_grow((void **)&b->out, &b->cap, b->len + n + 1, 1) < 0)
		b->err = -ENOMEM;
	if (b->len < b->cap) {
		size_t room = b->cap - b->len;
		memcpy(b->out + b->len, s, n < room ? n : room);
	}
	b->len += n;
}

void chat_str(struct render *b, const char *s)
{
	chat_put(b, s, strlen(s));
}

void chat_mark(struct render *b, enum chat_marker m)
{
	const struct chat_mark *mk = &b->t->chat_mk[m];
	if (b->grow && mk->id >= 0 && !b->err) {
		if (tok_grow((void **)&b->marks, &b->marks_cap, b->n_marks + 1, sizeof(*b->marks)) < 0)
			b->err = -ENOMEM;
		else
			b->marks[b->n_marks++] = (struct mark_at){ b->len, mk->len, mk->id };
	}
	chat_put(b, mk->text, mk->len);
}

/* Python's str.isspace(), which Jinja's trim and str.strip() use. */
static bool py_space(uint32_t cp)
{
	return (cp >= 0x1C && cp <= 0x1F) || (kvd_unicode_flags(cp) & KVD_CPF_SPACE);
}

const char *chat_strip(const char *s, size_t *n)
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

/* Message idx's content (stripped as str.strip() when strip is set). The
 * end of msgs[0]'s is noted when it is rendered unchanged. */
static void put_content(struct render *b, size_t idx, const char *s, bool strip)
{
	size_t n0 = strlen(s), n = n0;
	const char *p = strip ? chat_strip(s, &n) : s;
	chat_put(b, p, n);
	if (idx == 0 && !b->first_done && n == n0) {
		b->first_done = true;
		b->first_end = b->len;
	}
}

/*
 * Llama-2-chat: a leading system message goes into the first user turn as
 * a <<SYS>> block, each user turn is "[INST] content [/INST]" (stripped,
 * with BOS text before every turn but the first), each assistant turn
 * " content </s>". Without <<SYS>> in the template the system text opens
 * the first user turn, followed by a blank line.
 */
static int render_llama2(struct render *b, const struct kvd_tokenizer *t, const struct kvd_chat_msg *msgs,
			 size_t n_msgs)
{
	const char *sys = NULL;
	size_t i = 0, users = 0;
	if (n_msgs && strcmp(msgs[0].role, "system") == 0)
		sys = msgs[i++].content;
	for (; i < n_msgs; i++) {
		if (strcmp(msgs[i].role, "user") == 0) {
			if (users++ > 0)
				chat_mark(b, MK_BOS);
			chat_str(b, "[INST] ");
			if (sys && users == 1) {
				/* The template strips the combined text: build it first. */
				size_t sl = strlen(sys), cl = strlen(msgs[i].content);
				char *all = malloc(sl + cl + 32);
				if (!all)
					return -ENOMEM;
				int n = sprintf(all, t->l2_sys ? "<<SYS>>\n%s\n<</SYS>>\n\n%s" : "%s\n\n%s", sys,
						msgs[i].content);
				size_t al = (size_t)n;
				const char *s = chat_strip(all, &al);
				chat_put(b, s, al);
				free(all);
			} else {
				put_content(b, i, msgs[i].content, true);
			}
			chat_str(b, " [/INST]");
		} else if (strcmp(msgs[i].role, "assistant") == 0) {
			chat_str(b, " ");
			put_content(b, i, msgs[i].content, true);
			chat_str(b, " ");
			chat_mark(b, MK_EOS);
		}
		/* A system message after the first turn has no place in this format. */
	}
	return 0;
}

int tok_chat_render_plain(struct render *b, const struct kvd_chat_msg *msgs, size_t n_msgs, bool add_assistant,
			  const bool *verbatim)
{
	const struct kvd_tokenizer *t = b->t;
	int r;

	switch (t->chat) {
	case CHAT_CHATML:
		if (n_msgs && t->chat_system && strcmp(msgs[0].role, "system") != 0) {
			chat_mark(b, MK_IM_START);
			chat_str(b, "system\n");
			chat_put(b, t->chat_system, t->chat_system_len);
			chat_mark(b, MK_IM_END);
			chat_str(b, "\n");
		}
		for (size_t i = 0; i < n_msgs; i++) {
			chat_mark(b, MK_IM_START);
			chat_str(b, msgs[i].role);
			chat_str(b, "\n");
			put_content(b, i, msgs[i].content, false);
			chat_mark(b, MK_IM_END);
			chat_str(b, "\n");
		}
		if (add_assistant) {
			chat_mark(b, MK_IM_START);
			chat_str(b, "assistant\n");
		}
		break;
	case CHAT_LLAMA3:
		for (size_t i = 0; i < n_msgs; i++) {
			chat_mark(b, MK_START_HEADER);
			chat_str(b, msgs[i].role);
			chat_mark(b, MK_END_HEADER);
			chat_str(b, "\n\n");
			put_content(b, i, msgs[i].content, !(verbatim && verbatim[i]));
			chat_mark(b, MK_EOT_ID);
		}
		if (add_assistant) {
			chat_mark(b, MK_START_HEADER);
			chat_str(b, "assistant");
			chat_mark(b, MK_END_HEADER);
			chat_str(b, "\n\n");
		}
		break;
	case CHAT_LLAMA2:
		if ((r = render_llama2(b, t, msgs, n_msgs)) < 0)
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
			chat_mark(b, MK_SOT);
			chat_str(b, model ? "model\n" : "user\n");
			if (i == i0 && i0) {
				put_content(b, 0, msgs[0].content, false);
				chat_str(b, "\n\n");
			}
			put_content(b, i, msgs[i].content, true);
			chat_mark(b, MK_EOT);
			chat_str(b, "\n");
		}
		if (add_assistant) {
			chat_mark(b, MK_SOT);
			chat_str(b, "model\n");
		}
		break;
	}
	case CHAT_ZEPHYR:
		for (size_t i = 0; i < n_msgs; i++) {
			chat_mark(b, !strcmp(msgs[i].role, "system") ? MK_Z_SYSTEM
				    : !strcmp(msgs[i].role, "user") ? MK_Z_USER
								     : MK_Z_ASSISTANT);
			chat_str(b, "\n");
			put_content(b, i, msgs[i].content, false);
			chat_mark(b, t->zephyr_end == ZEPHYR_END_EOS    ? MK_EOS
				    : t->zephyr_end == ZEPHYR_END_PHI3 ? MK_Z_END
								       : MK_ENDOFTEXT);
			chat_str(b, "\n");
		}
		if (t->zephyr_end == ZEPHYR_END_PHI3) {
			/* Phi-3 closes a conversation without a reply prompt with EOS. */
			if (add_assistant) {
				chat_mark(b, MK_Z_ASSISTANT);
				chat_str(b, "\n");
			} else {
				chat_mark(b, MK_EOS_PHI3);
			}
		} else if (add_assistant && n_msgs) {
			/* Zephyr asks for the reply inside its message loop. */
			chat_mark(b, MK_Z_ASSISTANT);
			chat_str(b, "\n");
		}
		break;
	default:
		return -ENOTSUP;
	}
	return b->err;
}

/* The conversation through the family's renderer into b: 0, -ENOTSUP for
 * a template kvd does not recognise, -EINVAL for a malformed tool turn,
 * -ENOMEM. */
static int render_conv(struct render *b, const struct kvd_chat_msg *msgs, size_t n_msgs, bool add_assistant)
{
	if (b->t->chat == CHAT_MISTRAL || tok_chat_has_tools(msgs, n_msgs))
		return tok_chat_render_tools(b, msgs, n_msgs, add_assistant);
	return tok_chat_render_plain(b, msgs, n_msgs, add_assistant, NULL);
}

static int check_msgs(const struct kvd_chat_msg *msgs, size_t n_msgs)
{
	return kvd_chat_check(msgs, n_msgs, NULL, 0);
}

int kvd_chat_render(const struct kvd_tokenizer *t, const struct kvd_chat_msg *msgs, size_t n_msgs,
		    int add_assistant, char *out, size_t cap)
{
	int r = check_msgs(msgs, n_msgs);
	if (r < 0)
		return r;
	if (!out)
		cap = 0;
	struct render b = { .t = t, .out = out, .cap = cap };
	if ((r = render_conv(&b, msgs, n_msgs, add_assistant)) < 0)
		return r;
	if (cap)
		out[b.len < cap ? b.len : cap - 1] = '\0';
	return b.len > INT_MAX ? -E2BIG : (int)b.len;
}

/* Emit the text b->out[a..e) as content: no special token matched but
 * USER tokens that are not markers, as kvd_tokenize with parse_special = 0
 * would. */
static int put_text_tokens(const struct render *b, size_t a, size_t e, int32_t *out, size_t max_out, size_t *n_out,
			   bool upto)
{
	if (e <= a)
		return 0;
	bool room = *n_out < max_out;
	int k = (upto ? tok_tokenize_upto : tok_tokenize)(b->t, b->out + a, e - a, false, TOKF_PARSE | TOKF_MARKER,
							  room ? out + *n_out : NULL, room ? max_out - *n_out : 0);
	if (k < 0)
		return k;
	*n_out += (size_t)k;
	return 0;
}

int kvd_chat_tokenize(const struct kvd_tokenizer *t, const struct kvd_chat_msg *msgs, size_t n_msgs,
		      unsigned flags, int32_t *out, size_t max_out)
{
	if (!out && max_out)
		return -EINVAL;
	int r = check_msgs(msgs, n_msgs);
	if (r < 0)
		return r;
	if (t->chat == CHAT_UNKNOWN || t->chat_problem[0])
		return -ENOTSUP;

	struct render b = { .t = t, .grow = true };
	size_t n_out = 0, pos = 0, m = 0;
	if ((r = render_conv(&b, msgs, n_msgs, flags & KVD_CHAT_ADD_ASSISTANT)) < 0)
		goto out;
	if (b.len > KVD_TOKENIZE_MAX_BYTES) {
		r = -E2BIG;
		goto out;
	}
	if ((flags & KVD_CHAT_ADD_BOS) && t->bos >= 0) {
		if (n_out < max_out)
			out[n_out] = t->bos;
		n_out++;
	}
	if (flags & KVD_CHAT_AFTER_FIRST) {
		if (!n_msgs || !b.first_done || b.tools) {
			r = -ENOENT;
			goto out;
		}
		pos = b.first_end;
		while (m < b.n_marks && b.marks[m].off < pos)
			m++;
	}
	bool upto = flags & KVD_CHAT_UPTO_MAX;
	for (; m < b.n_marks && !(upto && n_out > max_out); m++) {
		const struct mark_at *mk = &b.marks[m];
		if ((r = put_text_tokens(&b, pos, mk->off, out, max_out, &n_out, upto)) < 0)
			goto out;
		if (n_out < max_out)
			out[n_out] = mk->id;
		n_out++;
		pos = mk->off + mk->len;
	}
	r = upto && n_out > max_out ? 0 : put_text_tokens(&b, pos, b.len, out, max_out, &n_out, upto);
	if (r == 0)
		r = n_out > INT_MAX ? -E2BIG : (int)n_out;
out:
	free(b.out);
	free(b.marks);
	return r;
}

const char *kvd_tokenizer_chat_problem(const struct kvd_tokenizer *t)
{
	if (t->chat == CHAT_UNKNOWN)
		return "the model's chat template is not one kvd recognises (ChatML, Llama 3, Llama 2, Mistral, "
		       "Zephyr, Phi-3, Gemma)";
	return t->chat_problem[0] ? t->chat_problem : NULL;
}

/* ---- markers, at load ------------------------------------------------------ */

static const char *const marker_text[MK_COUNT] = {
	[MK_IM_START] = "<|im_start|>",
	[MK_IM_END] = "<|im_end|>",
	[MK_START_HEADER] = "<|start_header_id|>",
	[MK_END_HEADER] = "<|end_header_id|>",
	[MK_EOT_ID] = "<|eot_id|>",
	[MK_SOT] = "<start_of_turn>",
	[MK_EOT] = "<end_of_turn>",
	[MK_BOS] = "<s>",
	[MK_EOS] = "</s>",
	[MK_EOS_PHI3] = "<|endoftext|>",
	[MK_Z_SYSTEM] = "<|system|>",
	[MK_Z_USER] = "<|user|>",
	[MK_Z_ASSISTANT] = "<|assistant|>",
	[MK_Z_END] = "<|end|>",
	[MK_ENDOFTEXT] = "<|endoftext|>",
	[MK_INST] = "[INST]",
	[MK_INST_END] = "[/INST]",
	[MK_AVAIL_TOOLS] = "[AVAILABLE_TOOLS]",
	[MK_AVAIL_TOOLS_END] = "[/AVAILABLE_TOOLS]",
	[MK_TOOL_CALLS] = "[TOOL_CALLS]",
	[MK_TOOL_RESULTS] = "[TOOL_RESULTS]",
	[MK_TOOL_RESULTS_END] = "[/TOOL_RESULTS]",
};

#define MK_BIT(m) (1u << (m))

/* Each family's markers (the BOS and EOS tokens belong to every family:
 * no message has a reason to spell them); those that must be tokens. */
static const struct {
	const char *name;
	unsigned marks, required;
} family_marks[] = {
	[CHAT_CHATML] = { "ChatML", MK_BIT(MK_IM_START) | MK_BIT(MK_IM_END), MK_BIT(MK_IM_START) | MK_BIT(MK_IM_END) },
	[CHAT_LLAMA3] = { "Llama 3", MK_BIT(MK_START_HEADER) | MK_BIT(MK_END_HEADER) | MK_BIT(MK_EOT_ID),
			  MK_BIT(MK_START_HEADER) | MK_BIT(MK_END_HEADER) | MK_BIT(MK_EOT_ID) },
	[CHAT_LLAMA2] = { "Llama 2", 0, 0 },
	[CHAT_ZEPHYR] = { "Zephyr", MK_BIT(MK_Z_SYSTEM) | MK_BIT(MK_Z_USER) | MK_BIT(MK_Z_ASSISTANT) |
					    MK_BIT(MK_Z_END) | MK_BIT(MK_EOS_PHI3) | MK_BIT(MK_ENDOFTEXT), 0 },
	[CHAT_GEMMA] = { "Gemma", MK_BIT(MK_SOT) | MK_BIT(MK_EOT), MK_BIT(MK_SOT) | MK_BIT(MK_EOT) },
	/* Mistral's markers are control tokens in its vocabularies (v3 and
	 * later), plain text in older ones */
	[CHAT_MISTRAL] = { "Mistral", MK_BIT(MK_INST) | MK_BIT(MK_INST_END) | MK_BIT(MK_AVAIL_TOOLS) |
					      MK_BIT(MK_AVAIL_TOOLS_END) | MK_BIT(MK_TOOL_CALLS) |
					      MK_BIT(MK_TOOL_RESULTS) | MK_BIT(MK_TOOL_RESULTS_END), 0 },
};

const char *kvd_tokenizer_chat_format(const struct kvd_tokenizer *t)
{
	static const char *const names[] = {
		[CHAT_CHATML] = "chatml", [CHAT_LLAMA3] = "llama3", [CHAT_LLAMA2] = "llama2",
		[CHAT_ZEPHYR] = "zephyr", [CHAT_GEMMA] = "gemma",   [CHAT_MISTRAL] = "mistral",
	};
	if (t->chat_problem[0] || t->chat <= CHAT_UNKNOWN || (size_t)t->chat >= sizeof(names) / sizeof(names[0]))
		return "";
	return names[t->chat];
}

void tok_chat_markers(struct kvd_tokenizer *t, bool have_template)
{
	t->chat_problem[0] = '\0';
	for (int m = 0; m < MK_COUNT; m++) {
		struct chat_mark *mk = &t->chat_mk[m];
		int32_t own = m == MK_BOS ? t->bos : m == MK_EOS || m == MK_EOS_PHI3 ? t->eos : -1;
		size_t len;
		if (own >= 0 && (m == MK_BOS || t->text_off[own + 1] > t->text_off[own])) {
			mk->text = tok_text(t, own, &len);
		} else {
			mk->text = marker_text[m];
			len = strlen(mk->text);
		}
		mk->len = (uint32_t)len;
		/* the token the text's special-token match gives */
		int32_t id = len ? text_lookup(t, mk->text, len) : -1;
		mk->id = id >= 0 && (t->flags[id] & TOKF_SPECIAL) ? id : -1;
	}
	if (t->chat <= CHAT_UNKNOWN || t->chat >= sizeof(family_marks) / sizeof(family_marks[0]))
		return;
	unsigned marks = family_marks[t->chat].marks | MK_BIT(MK_BOS) | MK_BIT(MK_EOS);
	for (int m = 0; m < MK_COUNT; m++) {
		const struct chat_mark *mk = &t->chat_mk[m];
		if ((marks & MK_BIT(m)) && mk->id >= 0)
			t->flags[mk->id] |= TOKF_MARKER;
		/* Without a template of its own a vocabulary without these
		 * tokens gets its ChatML turns as plain text: it has no
		 * control tokens a message could forge. */
		if ((family_marks[t->chat].required & MK_BIT(m)) && mk->id < 0 && have_template && !t->chat_problem[0])
			snprintf(t->chat_problem, sizeof(t->chat_problem),
				 "the model's chat template (%s) needs the token %s, which its vocabulary lacks",
				 family_marks[t->chat].name, mk->text);
	}
}
