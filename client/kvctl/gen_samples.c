/*
 * client/kvctl/gen_samples.c — the output of `kvctl generate -n N` and
 * `--logprobs K`: each sample's text, token ids and log-probabilities are
 * collected as their events interleave, then printed — as text, one block
 * per sample, or as one JSON object with a "samples" array (N >= 2) or the
 * usual object plus "logprobs" (N = 1).
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvctl.h"
#include "gen_samples.h"

int gen_samples_init(struct gen_samples *g, uint32_t n, bool json, bool logprobs)
{
	memset(g, 0, sizeof(*g));
	g->n = n ? n : 1;
	g->json = json;
	g->logprobs = logprobs;
	for (uint32_t i = 0; i < g->n; i++) {
		if (!logprobs)
			continue;
		g->s[i].lpf = open_memstream(&g->s[i].lp, &g->s[i].lp_len);
		if (!g->s[i].lpf)
			return -ENOMEM;
	}
	return 0;
}

void gen_samples_free(struct gen_samples *g)
{
	for (uint32_t i = 0; i < g->n; i++) {
		if (g->s[i].lpf)
			fclose(g->s[i].lpf);
		free(g->s[i].lp);
		free(g->s[i].text);
		free(g->s[i].ids);
	}
	memset(g, 0, sizeof(*g));
}

/* A log-probability as JSON: -inf has no JSON spelling; OpenAI writes
 * -9999.0 for tokens that far out. */
static void lp_num(FILE *f, float v)
{
	if (isinf(v) || v < -9999.0f)
		fputs("-9999.0", f);
	else
		fprintf(f, "%.6g", (double)v);
}

static void lp_entry(FILE *f, const struct kvc_logprob *e)
{
	fputs("{\"token\":", f);
	json_str(f, e->bytes, e->n_bytes);
	fprintf(f, ",\"id\":%" PRId32 ",\"logprob\":", e->id);
	lp_num(f, e->logprob);
	fputs(",\"bytes\":[", f);
	for (size_t i = 0; i < e->n_bytes; i++)
		fprintf(f, "%s%u", i ? "," : "", (unsigned char)e->bytes[i]);
	fputs("]", f);
}

int gen_samples_event(struct gen_samples *g, const struct kvc_event *ev)
{
	if (ev->sample >= g->n)
		return -EPROTO;
	struct gen_sample *s = &g->s[ev->sample];
	if (grow_array((void **)&s->text, &s->cap, s->len + ev->text_len + 1, 1) < 0)
		return -ENOMEM;
	memcpy(s->text + s->len, ev->text, ev->text_len);
	s->len += ev->text_len;
	if (ev->ids) {
		if (grow_array((void **)&s->ids, &s->cap_ids, s->n_ids + ev->n_tokens, sizeof(int32_t)) < 0)
			return -ENOMEM;
		memcpy(s->ids + s->n_ids, ev->ids, ev->n_tokens * sizeof(int32_t));
		s->n_ids += ev->n_tokens;
	}
	for (uint32_t t = 0; ev->logprobs && s->lpf && t < ev->n_tokens; t++) {
		const struct kvc_token_logprobs *tl = &ev->logprobs[t];
		fputs(s->n_lp++ ? "," : "", s->lpf);
		lp_entry(s->lpf, &tl->token);
		fputs(",\"top_logprobs\":[", s->lpf);
		for (size_t i = 0; i < tl->n_top; i++) {
			fputs(i ? "," : "", s->lpf);
			lp_entry(s->lpf, &tl->top[i]);
			fputs("}", s->lpf);
		}
		fputs("]}", s->lpf);
	}
	return 0;
}

static double ms(uint64_t ns)
{
	return (double)ns / 1e6;
}

void gen_result_json(FILE *f, const struct kvc_result *res)
{
	double tps = res->generated_tokens > 1 && res->decode_ns
			     ? (double)(res->generated_tokens - 1) * 1e9 / (double)res->decode_ns
			     : 0.0;
	fprintf(f,
		"\"finish_reason\":\"%s\",\"prompt_tokens\":%" PRIu32 ",\"cached_tokens\":%" PRIu32
		",\"generated_tokens\":%" PRIu32 ",\"ttft_ms\":%.3f,\"tokens_per_s\":%.2f,\"queue_ms\":%.3f"
		",\"total_ms\":%.3f,\"spec_drafted_tokens\":%" PRIu32 ",\"spec_accepted_tokens\":%" PRIu32,
		kvc_finish_name(res->finish_reason), res->prompt_tokens, res->cached_tokens, res->generated_tokens,
		ms(res->ttft_ns), tps, ms(res->queue_ns), ms(res->total_ns), res->spec_drafted_tokens,
		res->spec_accepted_tokens);
}

/* "text", "token_ids" and (with --logprobs) "logprobs" of sample i. */
static void sample_json(FILE *f, struct gen_sample *s, bool logprobs)
{
	fputs("\"text\":", f);
	json_str(f, s->text ? s->text : "", s->len);
	fputs(",\"token_ids\":[", f);
	for (size_t i = 0; i < s->n_ids; i++)
		fprintf(f, "%s%" PRId32, i ? "," : "", s->ids[i]);
	fputs("]", f);
	if (logprobs) {
		if (s->lpf)
			fflush(s->lpf);
		fputs(",\"logprobs\":[", f);
		if (s->lp)
			fwrite(s->lp, 1, s->lp_len, f);
		fputs("]", f);
	}
}

void gen_samples_print_json(struct gen_samples *g, const kvc_request *q, int code, const char *model)
{
	FILE *f = stdout;
	const struct kvc_result *res = q ? kvc_request_result(q) : NULL;

	fputs("{", f);
	if (g->n == 1) {
		sample_json(f, &g->s[0], g->logprobs);
	} else {
		fputs("\"samples\":[", f);
		for (uint32_t i = 0; i < g->n; i++) {
			const struct kvc_result *sr = q ? kvc_request_sample_result(q, i) : NULL;
			fprintf(f, "%s{\"sample\":%" PRIu32 ",", i ? "," : "", i);
			sample_json(f, &g->s[i], g->logprobs);
			if (sr)
				fprintf(f, ",\"finish_reason\":\"%s\",\"generated_tokens\":%" PRIu32
					   ",\"spec_drafted_tokens\":%" PRIu32 ",\"spec_accepted_tokens\":%" PRIu32,
					kvc_finish_name(sr->finish_reason), sr->generated_tokens, sr->spec_drafted_tokens,
					sr->spec_accepted_tokens);
			fputs("}", f);
		}
		fputs("]", f);
	}
	if (res) {
		fputs(",", f);
		gen_result_json(f, res);
	}
	gen_json_close(f, res, code, model);
}

void gen_json_close(FILE *f, const struct kvc_result *res, int code, const char *model)
{
	if (model) {
		fputs(",\"model\":", f);
		json_str(f, model, strlen(model));
	}
	if (code < 0 && code != -ECANCELED) {
		const char *m = res && res->error_message[0] ? res->error_message : kv_strerror(code);
		fprintf(f, ",\"error\":{\"code\":%d,\"message\":", code);
		json_str(f, m, strlen(m));
		fputs("}", f);
	}
	fputs("}\n", f);
}

int gen_samples_print_text(const struct gen_samples *g, const kvc_request *q, bool newline)
{
	for (uint32_t i = 0; i < g->n; i++) {
		const struct gen_sample *s = &g->s[i];
		const struct kvc_result *sr = q ? kvc_request_sample_result(q, i) : NULL;
		if (g->n > 1)
			printf("%s--- sample %" PRIu32 " (%s, %" PRIu32 " tokens) ---\n", i ? "\n" : "", i,
			       sr ? kvc_finish_name(sr->finish_reason) : "?", sr ? sr->generated_tokens : 0);
		if (s->len && fwrite(s->text, 1, s->len, stdout) != s->len)
			return -EIO;
		if (newline && s->len && s->text[s->len - 1] != '\n')
			fputc('\n', stdout);
	}
	return fflush(stdout) != 0 ? -EIO : 0;
}
