/*
 * client/http/choices.c — answers with several choices ('n') or with
 * log-probabilities, in OpenAI's shapes.
 *
 * kvd computes the prompt once and forks it into n samples; libkvclient
 * delivers their events interleaved, each with its sample index, which is
 * the choice's "index" here. Streaming: every event becomes one chunk of
 * its choice (the chat role chunk of every choice first); once the request
 * has ended, one closing chunk per choice with its own finish_reason, then
 * the usage chunk if asked for. Non-streaming: each choice's text and
 * log-probabilities are collected and answered together. usage counts the
 * prompt once and the tokens of all choices.
 *
 * Log-probabilities are kvd's: natural logs of the model's own distribution
 * (before temperature and truncation), as OpenAI reports them; -inf, which
 * JSON cannot spell, is written -9999.0 as OpenAI does. Chat:
 * {"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token",
 * "logprob", "bytes"}]}], "refusal": null}. Completions: {"tokens",
 * "token_logprobs", "top_logprobs" (one {token: logprob} object per token;
 * null with logprobs 0), "text_offset" (bytes into the choice's text)}.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kvclient.h"
#include "server_impl.h"

struct choice {
	char *text;
	size_t len, cap;
	json_t *lp;         /* non-streaming accumulator (see lp_new) */
	size_t offset;      /* completions' text_offset: bytes of the tokens so far */
};

struct http_choices {
	uint32_t n;
	struct choice c[];
};

bool choices_wanted(const struct http_gen_req *q)
{
	return q->n > 1 || q->logprobs;
}

/* An empty log-probability accumulator for ep. */
static json_t *lp_new(int ep)
{
	if (ep == HTTP_EP_CHAT)
		return json_array();
	return json_pack("{s:[], s:[], s:[], s:[]}", "tokens", "token_logprobs", "top_logprobs", "text_offset");
}

int choices_init(struct conn *c)
{
	uint32_t n = c->req.n > 1 ? c->req.n : 1;
	struct http_choices *h = calloc(1, sizeof(*h) + n * sizeof(h->c[0]));
	if (!h)
		return -ENOMEM;
	h->n = n;
	c->ch = h;
	for (uint32_t i = 0; i < n && c->req.logprobs && !c->req.stream; i++)
		if (!(h->c[i].lp = lp_new(c->req.endpoint)))
			return -ENOMEM;
	return 0;
}

void choices_free(struct conn *c)
{
	if (!c->ch)
		return;
	for (uint32_t i = 0; i < c->ch->n; i++) {
		free(c->ch->c[i].text);
		json_decref(c->ch->c[i].lp);
	}
	free(c->ch);
	c->ch = NULL;
}

static json_t *lp_real(float v)
{
	return json_real(isinf(v) || v < -9999.0f ? -9999.0 : (double)v);
}

static json_t *chat_entry(const struct kvc_logprob *e)
{
	json_t *bytes = json_array();
	for (size_t i = 0; bytes && i < e->n_bytes; i++)
		json_array_append_new(bytes, json_integer((unsigned char)e->bytes[i]));
	return json_pack("{s:o, s:o, s:o}", "token", http_text_json(e->bytes, e->n_bytes), "logprob", lp_real(e->logprob),
			 "bytes", bytes);
}

/* Append the event's tokens to an accumulator made by lp_new(). */
static int lp_add(int ep, json_t *acc, struct choice *ch, const struct kvc_event *ev)
{
	for (uint32_t t = 0; ev->logprobs && t < ev->n_tokens; t++) {
		const struct kvc_token_logprobs *tl = &ev->logprobs[t];
		if (ep == HTTP_EP_CHAT) {
			json_t *e = chat_entry(&tl->token), *top = json_array();
			if (!e || !top || json_object_set_new(e, "top_logprobs", top) < 0) {
				json_decref(e);
				return -ENOMEM;
			}
			for (size_t i = 0; i < tl->n_top; i++)
				if (json_array_append_new(top, chat_entry(&tl->top[i])) < 0)
					return -ENOMEM;
			if (json_array_append_new(acc, e) < 0)
				return -ENOMEM;
			continue;
		}
		json_t *top = tl->n_top ? json_object() : json_null();
		for (size_t i = 0; top && i < tl->n_top; i++) {
			json_t *k = http_text_json(tl->top[i].bytes, tl->top[i].n_bytes);
			if (!k)
				return -ENOMEM;
			json_object_set_new(top, json_string_value(k), lp_real(tl->top[i].logprob));
			json_decref(k);
		}
		if (json_array_append_new(json_object_get(acc, "tokens"),
					  http_text_json(tl->token.bytes, tl->token.n_bytes)) < 0 ||
		    json_array_append_new(json_object_get(acc, "token_logprobs"), lp_real(tl->token.logprob)) < 0 ||
		    json_array_append_new(json_object_get(acc, "top_logprobs"), top) < 0 ||
		    json_array_append_new(json_object_get(acc, "text_offset"), json_integer((json_int_t)ch->offset)) < 0)
			return -ENOMEM;
		ch->offset += tl->token.n_bytes;
	}
	return 0;
}

/* The "logprobs" member of a choice from an accumulator (stolen). */
static json_t *lp_member(int ep, json_t *acc)
{
	if (!acc)
		return json_null();
	if (ep == HTTP_EP_CHAT)
		return json_pack("{s:o, s:n}", "content", acc, "refusal");
	return acc;
}

/* One chunk of choice `index` as a server-sent event appended to c->out.
 * role: chat's opening chunk; logprobs: the choice's "logprobs" (stolen;
 * NULL for null); finish: the closing chunk. */
static int chunk(struct conn *c, uint32_t index, bool role, const char *text, size_t len, json_t *logprobs,
		 const char *finish)
{
	int ep = c->req.endpoint;
	json_t *choice;

	if (ep == HTTP_EP_CHAT) {
		json_t *delta = role ? json_pack("{s:s, s:s}", "role", "assistant", "content", "")
			      : finish ? json_object() : json_pack("{s:o}", "content", http_text_json(text, len));
		choice = json_pack("{s:I, s:o, s:o, s:s?}", "index", (json_int_t)index, "delta", delta, "logprobs",
				   logprobs ? logprobs : json_null(), "finish_reason", finish);
	} else {
		choice = json_pack("{s:I, s:o, s:o, s:s?}", "index", (json_int_t)index, "text",
				   http_text_json(finish ? "" : text, finish ? 0 : len), "logprobs",
				   logprobs ? logprobs : json_null(), "finish_reason", finish);
	}
	json_t *o = json_pack("{s:s, s:s, s:I, s:s, s:[o]}", "id", c->id, "object",
			      ep == HTTP_EP_CHAT ? "chat.completion.chunk" : "text_completion", "created",
			      (json_int_t)c->created, "model", c->model, "choices", choice);
	if (o && c->req.include_usage)
		json_object_set_new(o, "usage", json_null());
	char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
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

int choices_stream_open(struct conn *c)
{
	for (uint32_t i = 0; c->req.endpoint == HTTP_EP_CHAT && i < c->ch->n; i++)
		if (chunk(c, i, true, NULL, 0, NULL, NULL) < 0)
			return -ENOMEM;
	return 0;
}

int choices_stream_event(struct conn *c, const struct kvc_event *ev)
{
	if (ev->sample >= c->ch->n)
		return -EPROTO;
	if (ev->text_len == 0 && !ev->logprobs)
		return 0;
	json_t *lp = NULL;
	if (ev->logprobs) {
		json_t *acc = lp_new(c->req.endpoint);
		if (!acc || lp_add(c->req.endpoint, acc, &c->ch->c[ev->sample], ev) < 0) {
			json_decref(acc);
			return -ENOMEM;
		}
		lp = lp_member(c->req.endpoint, acc);
	}
	return chunk(c, ev->sample, false, ev->text, ev->text_len, lp, NULL);
}

int choices_stream_finish(struct conn *c)
{
	const struct kvc_result *res = kvc_request_result(c->kr);
	struct http_usage u;

	for (uint32_t i = 0; i < c->ch->n; i++) {
		const struct kvc_result *sr = kvc_request_sample_result(c->kr, i);
		if (chunk(c, i, false, NULL, 0, NULL, http_finish_reason(sr ? sr->finish_reason : res->finish_reason)) < 0)
			return -ENOMEM;
	}
	add_usage(c, res, &u);
	if (!c->req.include_usage)
		return 0;
	size_t n = 0;
	char *sse = http_chunk_sse(c->req.endpoint, c->id, c->created, c->model, false, NULL, 0, NULL, &u, false, &n);
	return out_take(c, sse, n);
}

int choices_collect(struct conn *c, const struct kvc_event *ev)
{
	if (ev->sample >= c->ch->n)
		return -EPROTO;
	struct choice *ch = &c->ch->c[ev->sample];
	if (ch->len + ev->text_len + 1 > ch->cap) {
		size_t cap = ch->cap ? ch->cap : 256;
		while (cap < ch->len + ev->text_len + 1)
			cap *= 2;
		char *t = realloc(ch->text, cap);
		if (!t)
			return -ENOMEM;
		ch->text = t;
		ch->cap = cap;
	}
	memcpy(ch->text + ch->len, ev->text, ev->text_len);
	ch->len += ev->text_len;
	return ch->lp ? lp_add(c->req.endpoint, ch->lp, ch, ev) : 0;
}

char *choices_response(struct conn *c)
{
	const struct kvc_result *res = kvc_request_result(c->kr);
	int ep = c->req.endpoint;
	struct http_usage u;
	json_t *choices = json_array();

	add_usage(c, res, &u);
	for (uint32_t i = 0; choices && i < c->ch->n; i++) {
		struct choice *ch = &c->ch->c[i];
		const struct kvc_result *sr = kvc_request_sample_result(c->kr, i);
		const char *finish = http_finish_reason(sr ? sr->finish_reason : res->finish_reason);
		json_t *t = http_text_json(ch->text ? ch->text : "", ch->len);
		json_t *lp = lp_member(ep, ch->lp);
		ch->lp = NULL; /* stolen */
		json_t *o = ep == HTTP_EP_CHAT
				    ? json_pack("{s:I, s:{s:s, s:o}, s:o, s:s}", "index", (json_int_t)i, "message", "role",
						"assistant", "content", t, "logprobs", lp, "finish_reason", finish)
				    : json_pack("{s:I, s:o, s:o, s:s}", "index", (json_int_t)i, "text", t, "logprobs", lp,
						"finish_reason", finish);
		if (json_array_append_new(choices, o) < 0) {
			json_decref(choices);
			return NULL;
		}
	}
	json_t *usage = json_pack("{s:I, s:I, s:I, s:{s:I}}", "prompt_tokens", (json_int_t)u.prompt_tokens,
				  "completion_tokens", (json_int_t)u.completion_tokens, "total_tokens",
				  (json_int_t)u.prompt_tokens + (json_int_t)u.completion_tokens, "prompt_tokens_details",
				  "cached_tokens", (json_int_t)u.cached_tokens);
	json_t *o = json_pack("{s:s, s:s, s:I, s:s, s:o, s:o}", "id", c->id, "object",
			      ep == HTTP_EP_CHAT ? "chat.completion" : "text_completion", "created", (json_int_t)c->created,
			      "model", c->model, "choices", choices, "usage", usage);
	char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
	json_decref(o);
	return s;
}
