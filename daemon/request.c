/*
 * daemon/request.c — the tokens of a prompt (raw text, or chat turns through
 * the model's template, message contents always as text), detokenizing and
 * stop strings for one request.
 *
 * The stream side is two stages per token: the detokenizer turns the token
 * into the bytes of complete UTF-8 characters, and the stop matcher holds
 * back any tail that could begin a stop string. At the end of the stream
 * (end-of-generation, max_tokens) both stages are flushed, so a client
 * gets every byte exactly once.
 */
#include "request.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ipc.h"

#include "sampler.h"
#include "tokenizer.h"

/* Stands for an assistant message's content, to find what the template
 * puts around it. */
#define REQUEST_CHAT_MARKER "\x1fkvd-turn-marker\x1f"

struct kvd_request {
	const struct kvd_tokenizer *tok;
	struct kvd_stop stop;
	struct kvd_detok detok;
	char piece[KVD_DETOK_MIN_CAP + KVD_SAMPLER_MAX_STOP_LEN];     /* detokenized */
	char out[KVD_DETOK_MIN_CAP + 2 * KVD_SAMPLER_MAX_STOP_LEN];    /* released */
};

int kvd_request_tokenize(const struct kvd_tokenizer *tok, const char *text, size_t len, int add_bos,
			 int parse_special, size_t upto, int32_t **ret)
{
	size_t cap = upto < len + 16 ? upto + 1 : len + 16;
	int32_t *ids = malloc(cap * sizeof(*ids));
	int n;

	if (!ids)
		return -ENOMEM;
	if (upto != KVD_REQUEST_ALL) {
		n = kvd_tokenize_upto(tok, text, len, add_bos ? kvd_tokenizer_add_bos(tok) : 0, parse_special, ids, upto);
		if (n < 0) {
			free(ids);
			return n;
		}
		*ret = ids;
		return n;
	}
	n = kvd_tokenize(tok, text, len, add_bos ? kvd_tokenizer_add_bos(tok) : 0, parse_special, ids, cap);
	if (n > (int)cap) {
		int32_t *bigger = realloc(ids, (size_t)n * sizeof(*ids));
		if (!bigger) {
			free(ids);
			return -ENOMEM;
		}
		ids = bigger;
		n = kvd_tokenize(tok, text, len, add_bos ? kvd_tokenizer_add_bos(tok) : 0, parse_special, ids,
				 (size_t)n);
	}
	if (n < 0) {
		free(ids);
		return n;
	}
	*ret = ids;
	return n;
}

static int why_set(char *why, size_t cap, int code, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static int why_set(char *why, size_t cap, int code, const char *fmt, ...)
{
	va_list ap;

	if (why && cap) {
		va_start(ap, fmt);
		vsnprintf(why, cap, fmt, ap);
		va_end(ap);
	}
	return code;
}

/* The tokens of msgs (kvd_chat_tokenize with flags) in a fresh array; the
 * model's BOS first with add_bos when the model asks for one. */
static int chat_tokens(const struct kvd_tokenizer *tok, const struct kvd_chat_msg *msgs, size_t n, unsigned flags,
		       int add_bos, size_t upto, int32_t **ret)
{
	size_t cap = 64;
	int32_t *ids;
	int k;

	if (add_bos && kvd_tokenizer_add_bos(tok))
		flags |= KVD_CHAT_ADD_BOS;
	for (size_t i = 0; i < n; i++)
		cap += msgs[i].content ? strlen(msgs[i].content) / 2 : 0;
	if (upto != KVD_REQUEST_ALL) {
		/* one pass: the whole prompt if it fits, else a count > upto
		 * (one more id stored, for a continuation's dropped first token) */
		cap = upto + 2;
		flags |= KVD_CHAT_UPTO_MAX;
	}
	ids = malloc(cap * sizeof(*ids));
	if (!ids)
		return -ENOMEM;
	k = kvd_chat_tokenize(tok, msgs, n, flags, ids, upto != KVD_REQUEST_ALL ? upto + 1 : cap);
	if (upto == KVD_REQUEST_ALL && k > (int)cap) {
		int32_t *bigger = realloc(ids, (size_t)k * sizeof(*ids));
		if (!bigger) {
			free(ids);
			return -ENOMEM;
		}
		ids = bigger;
		k = kvd_chat_tokenize(tok, msgs, n, flags, ids, (size_t)k);
	}
	if (k < 0) {
		free(ids);
		return k;
	}
	*ret = ids;
	return k;
}

/* The client's message for a conversation the template cannot tokenize. */
static int chat_refused(const struct kvd_tokenizer *tok, int r, char *why, size_t why_cap)
{
	const char *problem = r == -ENOTSUP ? kvd_tokenizer_chat_problem(tok) : NULL;

	if (problem)
		return why_set(why, why_cap, r, "cannot use the model's chat template: %s", problem);
	return why_set(why, why_cap, r, "cannot use the model's chat template: %s", strerror(-r));
}

/*
 * A later turn: what the template puts after an assistant message and
 * before the next assistant header is what follows a stand-in assistant
 * message in [assistant, user]; a family that does not render that message
 * verbatim gets the turn on its own.
 */
int kvd_request_chat_turn(const struct kvd_tokenizer *tok, const char *system, const char *user, int continuation,
			  int32_t last_token, size_t upto, int32_t **ret, char *why, size_t why_cap)
{
	struct kvd_chat_msg msgs[2];
	size_t n = 0;
	int32_t *ids = NULL;
	int k;

	if (!user)
		return why_set(why, why_cap, -EINVAL, "no user message");
	if (continuation) {
		msgs[0] = (struct kvd_chat_msg){ "assistant", REQUEST_CHAT_MARKER };
		msgs[1] = (struct kvd_chat_msg){ "user", user };
		k = chat_tokens(tok, msgs, 2, KVD_CHAT_ADD_ASSISTANT | KVD_CHAT_AFTER_FIRST, 0, upto, &ids);
		if (k == -ENOENT) {
			msgs[0] = msgs[1];
			k = chat_tokens(tok, msgs, 1, KVD_CHAT_ADD_ASSISTANT, 0, upto, &ids);
		} else if (k > 0 && last_token >= 0 && kvd_tokenizer_is_eog(tok, last_token) && ids[0] == last_token) {
			/* the end-of-turn token the model already produced (with
			 * upto, ids holds at most upto + 1 of a longer count) */
			size_t stored = upto != KVD_REQUEST_ALL && (size_t)k > upto + 1 ? upto + 1 : (size_t)k;

			memmove(ids, ids + 1, (stored - 1) * sizeof(*ids));
			k--;
		}
	} else {
		if (system && *system)
			msgs[n++] = (struct kvd_chat_msg){ "system", system };
		msgs[n++] = (struct kvd_chat_msg){ "user", user };
		k = chat_tokens(tok, msgs, n, KVD_CHAT_ADD_ASSISTANT, 1, upto, &ids);
	}
	if (k < 0)
		return chat_refused(tok, k, why, why_cap);
	*ret = ids;
	return k;
}

int kvd_request_chat_turns(const struct kvd_tokenizer *tok, const char *turns, size_t len, size_t upto, int32_t **ret,
			   char *why, size_t why_cap)
{
	struct kvd_chat_msg *msgs = NULL;
	char *texts = NULL;
	struct ipc_chat_turn t;
	size_t off = 0, pos = 0;
	int n, r;

	n = ipc_chat_turns_check(turns, len);
	if (n < 0) {
		/* Say which rule failed: walk again to find the bad record. */
		int k = 0;
		while ((r = ipc_chat_turn_next(turns, len, &off, &t)) > 0)
			k++;
		if (r < 0)
			return why_set(why, why_cap, n, "chat turn %d is malformed (%s)", k,
				       r == -EPROTO ? "non-zero padding"
				       : r == -EINVAL ? "unknown role or a NUL byte in its text"
						      : "it runs past the end of the prompt");
		if (n == -E2BIG)
			return why_set(why, why_cap, n, "%d chat turns; at most %u are allowed", k, IPC_MAX_CHAT_TURNS);
		if (k == 0)
			return why_set(why, why_cap, n, "the conversation has no turns");
		if (t.role == IPC_CHAT_CALL_OPEN)
			return why_set(why, why_cap, n,
				       "the last chat turn opens a tool call; it must be empty and follow the user's "
				       "turn or a tool result");
		return why_set(why, why_cap, n, "the last chat turn is the %s's; it must be the user's or a tool result",
			       ipc_chat_role_name(t.role));
	}
	msgs = calloc((size_t)n, sizeof(*msgs));
	texts = malloc(len + 1); /* every text plus its NUL fits in the records' heads */
	if (!msgs || !texts) {
		r = why_set(why, why_cap, -ENOMEM, "out of memory");
		goto out;
	}
	for (int i = 0; i < n; i++) {
		r = ipc_chat_turn_next(turns, len, &off, &t);
		if (r <= 0) { /* checked above */
			r = why_set(why, why_cap, -EBADMSG, "chat turn %d is malformed", i);
			goto out;
		}
		memcpy(texts + pos, t.text, t.bytes);
		texts[pos + t.bytes] = 0;
		msgs[i] = (struct kvd_chat_msg){ ipc_chat_role_name(t.role), texts + pos };
		pos += t.bytes + 1u;
	}
	if ((r = kvd_chat_check(msgs, (size_t)n, why, why_cap)) < 0)
		goto out;
	r = chat_tokens(tok, msgs, (size_t)n, KVD_CHAT_ADD_ASSISTANT, 1, upto, ret);
	if (r < 0)
		chat_refused(tok, r, why, why_cap);
out:
	free(msgs);
	free(texts);
	return r;
}

int kvd_request_is_eog(const struct kvd_tokenizer *tok, int32_t token)
{
	return kvd_tokenizer_is_eog(tok, token);
}

int kvd_request_new(const struct kvd_tokenizer *tok, const char *const *stops, size_t n_stops,
		    struct kvd_request **ret)
{
	struct kvd_request *rq = calloc(1, sizeof(*rq));
	int r;

	if (!rq)
		return -ENOMEM;
	r = kvd_stop_init(&rq->stop, stops, n_stops);
	if (r < 0) {
		free(rq);
		return r;
	}
	rq->tok = tok;
	kvd_detok_init(&rq->detok);
	*ret = rq;
	return 0;
}

struct kvd_request *kvd_request_free(struct kvd_request *rq)
{
	free(rq);
	return NULL;
}

int kvd_request_token_piece(const struct kvd_tokenizer *tok, int32_t token, char *buf, size_t cap)
{
	char tmp[KVD_DETOK_MIN_CAP];
	int n = kvd_token_to_bytes(tok, token, 1, tmp, sizeof(tmp));
	if (n < 0)
		return n;
	if ((size_t)n > sizeof(tmp))
		n = (int)sizeof(tmp); /* longer than any vocabulary kvd serves: cut */
	if ((size_t)n > cap)
		n = (int)cap;
	memcpy(buf, tmp, (size_t)n);
	return n;
}

enum kvd_token_verdict kvd_request_token(struct kvd_request *rq, int32_t token, enum kvd_finish ending,
					 const char **ret_text, size_t *ret_len)
{
	int hit = 0, n;
	size_t n_out;

	if (ending == KVD_FINISH_EOS && kvd_tokenizer_is_eog(rq->tok, token)) {
		/* the end-of-generation token itself adds no text (a text token
		 * that completes a constraint ends the stream with its text) */
		n = kvd_detok_flush(&rq->detok, rq->piece, sizeof(rq->piece));
		n_out = kvd_stop_feed(&rq->stop, rq->piece, n > 0 ? (size_t)n : 0, rq->out, sizeof(rq->out), &hit);
		n_out += kvd_stop_flush(&rq->stop, rq->out + n_out, sizeof(rq->out) - n_out);
	} else {
		n = kvd_detok_push(rq->tok, &rq->detok, token, rq->piece, sizeof(rq->piece));
		if (n < 0)
			n = 0;
		if (ending != KVD_FINISH_NONE) {
			int m = kvd_detok_flush(&rq->detok, rq->piece + n, sizeof(rq->piece) - (size_t)n);
			if (m > 0)
				n += m;
		}
		n_out = kvd_stop_feed(&rq->stop, rq->piece, (size_t)n, rq->out, sizeof(rq->out), &hit);
		if (!hit && ending != KVD_FINISH_NONE)
			n_out += kvd_stop_flush(&rq->stop, rq->out + n_out, sizeof(rq->out) - n_out);
	}
	*ret_text = rq->out;
	*ret_len = n_out;
	return hit ? KVD_TOKEN_STOP : KVD_TOKEN_CONTINUE;
}
