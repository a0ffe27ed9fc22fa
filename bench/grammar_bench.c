/*
 * bench/grammar_bench.c — what a constraint costs per decode step: compiling
 * a typical JSON Schema (cold and from the cache), and the allowed-token
 * mask over a model's vocabulary (the default SmolLM2's 49k tokens, or
 * Gemma 3's 262k) at every step of generating a document, measured beside
 * a peer in the same run:
 * the per-token loop (each token's bytes matched on its own, no prefix tree
 * and no memo), which is how a sampler without a mask would check the
 * candidates.
 *
 *   build/bench/grammar_bench [model.gguf] [steps]
 *
 *   build/bench/grammar_bench --socket PATH [streams [schema.json]]
 *
 * The second form measures what a constraint costs a running daemon: the
 * decode rate of one stream and of `streams` (default 32) concurrent ones,
 * each generating 128 tokens, unconstrained beside constrained by a JSON
 * Schema (a long string field, so the constraint never completes early),
 * greedy (the check-first path) and seeded (temperature 0.8, top-k 40: the
 * 40 candidates checked where every one is allowed, else a mask), in
 * the same run, with the constrained / unconstrained ratio of each. A rate
 * is the sum over streams of each one's decode rate as the daemon timed
 * it (prefill and queueing left out), the best of 3 runs. A schema file
 * given replaces the built-in one (e.g. an array of integers, whose parse
 * states repeat from item to item, against the long string's per-character
 * ones).
 *
 * Targets (the issue's; printed, checked by eye, never by a test): a mask
 * well under a decode step (SmolLM2 decodes in ~5-10 ms per token on the
 * CPU here: the mask's p50 should stay below 1 ms and its p99 below 5 ms,
 * on Gemma 3's vocabulary too), compiling a typical schema under 10 ms,
 * and through the daemon a constrained / unconstrained ratio of at least
 * 0.9 on SmolLM2 and 0.8 on Gemma 3 270M, 1 and 32 streams.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gguf.h"
#include "grammar.h"
#include "kvclient.h"
#include "tokenizer.h"

static const char SCHEMA[] =
	"{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"age\":{\"type\":\"integer\"},"
	"\"email\":{\"type\":\"string\",\"pattern\":\"^[a-z0-9.]+@[a-z0-9]+\\\\.[a-z]{2,4}$\"},"
	"\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\",\"enum\":[\"admin\",\"user\",\"guest\"]},\"maxItems\":3},"
	"\"address\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"},\"zip\":{\"type\":\"string\","
	"\"minLength\":5,\"maxLength\":5}},\"required\":[\"city\",\"zip\"],\"additionalProperties\":false},"
	"\"born\":{\"type\":\"string\",\"format\":\"date\"}},\"required\":[\"name\",\"age\",\"email\",\"tags\",\"address\"],"
	"\"additionalProperties\":false}";

/* A plausible document, fed token by token (greedy longest tokenization of
 * the text), so the masks are measured at the states generation meets. */
static const char DOC[] = "{\"name\": \"Ada Lovelace, Countess of Lovelace\", \"age\": 36, \"email\": "
			  "\"ada.lovelace@analytical.org\", \"tags\": [\"admin\", \"user\"], \"address\": "
			  "{\"city\": \"London\", \"zip\": \"W1J 7\"}, \"born\": \"1815-12-10\"}";

static double now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static int cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

/* ---- against a daemon -------------------------------------------------------- */

#define DAEMON_TOKENS      128
#define DAEMON_MAX_STREAMS 256
#define DAEMON_REPS        3   /* each figure is the best of this many runs */
static const char STORY_SCHEMA[] =
	"{\"type\":\"object\",\"properties\":{\"title\":{\"type\":\"string\",\"maxLength\":40},"
	"\"story\":{\"type\":\"string\",\"minLength\":4000}},\"required\":[\"title\",\"story\"],"
	"\"additionalProperties\":false}";

static const char *daemon_schema = STORY_SCHEMA;

struct stream {
	const char *socket;
	int constrained, seeded, i;
	uint32_t generated;
	double decode_s;            /* first -> last token, as the daemon measured */
	int error;
};

static void *stream_run(void *arg)
{
	struct stream *x = arg;
	kvc_client *c = NULL;
	struct kvc_gen_params p;
	struct kvc_constraint k = { .kind = KVC_CONSTRAINT_JSON_SCHEMA, .text = daemon_schema, .len = KVC_NTS };
	struct kvc_result res;
	char prompt[128];

	x->error = kvc_connect(x->socket, &c);
	if (x->error < 0)
		return NULL;
	kvc_gen_params_init(&p);
	p.max_tokens = DAEMON_TOKENS;
	p.temperature = x->seeded ? 0.8f : 0;
	p.seed = 1000 + (uint64_t)x->i;
	p.constraint = x->constrained ? &k : NULL;
	/* raw counting: the model keeps going, so plain streams run their 128
	 * tokens like constrained ones and the batches stay the same size */
	p.flags = KVC_GEN_RAW;
	snprintf(prompt, sizeof(prompt), "%d, %d, %d, %d, %d,", 10 * x->i + 1, 10 * x->i + 2, 10 * x->i + 3,
		 10 * x->i + 4, 10 * x->i + 5);
	x->error = kvc_generate(c, prompt, KVC_NTS, &p, NULL, NULL, &res);
	x->generated = x->error == 0 ? res.generated_tokens : 0;
	x->decode_s = x->error == 0 ? (double)res.decode_ns / 1e9 : 0;
	kvc_close(c);
	return NULL;
}

/* n streams at once: the sum over streams of each one's decode rate
 * ((generated - 1) / decode time: prefill and queueing left out, so a
 * stream that ends early at EOS is not penalised), or < 0. */
static double run_streams(const char *socket, int n, int constrained, int seeded, double *ret_mean_tokens)
{
	static struct stream xs[DAEMON_MAX_STREAMS];
	pthread_t th[DAEMON_MAX_STREAMS];
	double rate = 0, tokens = 0;
	for (int i = 0; i < n; i++) {
		xs[i] = (struct stream){ .socket = socket, .constrained = constrained, .seeded = seeded, .i = i };
		if (pthread_create(&th[i], NULL, stream_run, &xs[i]) != 0)
			return -1;
	}
	for (int i = 0; i < n; i++)
		pthread_join(th[i], NULL);
	for (int i = 0; i < n; i++) {
		if (xs[i].error < 0) {
			fprintf(stderr, "grammar_bench: stream %d: %s\n", i, kv_strerror(xs[i].error));
			return -1;
		}
		if (xs[i].generated > 1 && xs[i].decode_s > 0)
			rate += (xs[i].generated - 1) / xs[i].decode_s;
		tokens += xs[i].generated;
	}
	if (ret_mean_tokens)
		*ret_mean_tokens = tokens / n;
	return rate;
}

static int daemon_main(const char *socket, int streams)
{
	static const int counts[2] = { 1, 0 };
	printf("grammar_bench: decode through kvd at %s, %d tokens per stream\n", socket, DAEMON_TOKENS);
	printf("  %-8s %-7s %14s %14s %8s %18s\n", "streams", "mode", "plain tok/s", "constr. tok/s", "ratio",
	       "tokens/stream p c");
	for (int ci = 0; ci < 2; ci++) {
		int n = counts[ci] ? counts[ci] : streams;
		for (int seeded = 0; seeded < 2; seeded++) {
			run_streams(socket, n, 1, seeded, NULL); /* warm: the compile cache, the prefix cache */
			/* best of DAEMON_REPS, plain and constrained interleaved, so
			 * other load on the machine hits both alike */
			double plain = 0, cons = 0, tp = 0, tc = 0;
			for (int rep = 0; rep < DAEMON_REPS; rep++) {
				double a = run_streams(socket, n, 0, seeded, &tp), b = run_streams(socket, n, 1, seeded, &tc);
				if (a < 0 || b < 0)
					return 1;
				plain = a > plain ? a : plain;
				cons = b > cons ? b : cons;
			}
			printf("  %-8d %-7s %14.1f %14.1f %8.3f %9.0f %8.0f\n", n, seeded ? "seeded" : "greedy", plain, cons,
			       cons / plain, tp, tc);
		}
	}
	return 0;
}

int main(int argc, char **argv)
{
	if (argc > 2 && !strcmp(argv[1], "--socket")) {
		int streams = argc > 3 ? atoi(argv[3]) : 32;
		if (streams < 1 || streams > DAEMON_MAX_STREAMS) {
			fprintf(stderr, "grammar_bench: streams: 1 .. %d\n", DAEMON_MAX_STREAMS);
			return 2;
		}
		static char text[1 << 16];
		if (argc > 4) {
			FILE *f = fopen(argv[4], "r");
			size_t n = f ? fread(text, 1, sizeof(text) - 1, f) : 0;
			if (f)
				fclose(f);
			if (n == 0 || n == sizeof(text) - 1) {
				fprintf(stderr, "grammar_bench: %s: cannot read (or over 64 KiB)\n", argv[4]);
				return 2;
			}
			text[n] = 0;
			daemon_schema = text;
		}
		return daemon_main(argv[2], streams);
	}
	const char *path = argc > 1 ? argv[1] : "models/SmolLM2-135M-Instruct.Q4_1.gguf";
	struct gguf_file *f = NULL;
	struct kvd_tokenizer *tok = NULL;
	char err[512];
	if (gguf_open(path, &f, err, sizeof(err)) < 0 || kvd_tokenizer_from_gguf(f, &tok, err, sizeof(err)) < 0) {
		fprintf(stderr, "grammar_bench: %s: %s\n", path, err);
		return 1;
	}
	gguf_close(f);
	double t0 = now_ms();
	struct kvd_gram_vocab *v = NULL;
	if (kvd_gram_vocab_from_tokenizer(tok, &v)) {
		fprintf(stderr, "grammar_bench: vocabulary\n");
		return 1;
	}
	double t_vocab = now_ms() - t0;

	/* compile: cold, then through the cache */
	struct kvd_gram_cache *cache = kvd_gram_cache_new(64, 64u << 20);
	struct kvd_grammar *g = NULL, *g2 = NULL;
	struct kvd_grammar_error e;
	int hit;
	t0 = now_ms();
	if (kvd_gram_cache_get(cache, KVD_GRAMMAR_JSON_SCHEMA, SCHEMA, strlen(SCHEMA), &g, &hit, &e)) {
		fprintf(stderr, "grammar_bench: %s\n", e.msg);
		return 1;
	}
	double t_compile = now_ms() - t0;
	t0 = now_ms();
	kvd_gram_cache_get(cache, KVD_GRAMMAR_JSON_SCHEMA, SCHEMA, strlen(SCHEMA), &g2, &hit, &e);
	double t_hit = now_ms() - t0;
	kvd_grammar_unref(g2);

	int32_t ids[512];
	int n_ids = kvd_tokenize(tok, DOC, strlen(DOC), 0, 0, ids, 512);
	if (n_ids <= 0 || n_ids > 512) {
		fprintf(stderr, "grammar_bench: tokenize\n");
		return 1;
	}
	int32_t n_vocab = kvd_gram_vocab_n_tokens(v);
	uint32_t *mask = malloc(kvd_gram_vocab_mask_words(v) * sizeof(uint32_t));
	double *ms = malloc((size_t)n_ids * sizeof(double)), *peer = malloc((size_t)n_ids * sizeof(double));
	struct kvd_gram_scratch *s = kvd_gram_scratch_new();
	struct kvd_gram_state st = {0}, cp = {0};
	kvd_gram_state_init(g, s, &st);
	double first = 0;
	long allowed_sum = 0;
	int peer_steps = 0;
	for (int i = 0; i < n_ids; i++) {
		t0 = now_ms();
		int n = kvd_gram_allowed_mask(g, v, s, &st, mask);
		ms[i] = now_ms() - t0;
		if (i == 0)
			first = ms[i];
		allowed_sum += n;
		if (!((mask[ids[i] >> 5] >> (ids[i] & 31)) & 1)) {
			fprintf(stderr, "grammar_bench: document token %d refused at step %d\n", ids[i], i);
			return 1;
		}
		/* the peer on every 8th step (it is slow): each token on its own */
		if (i % 8 == 0) {
			int n_peer = 0;
			t0 = now_ms();
			for (int32_t t = 0; t < n_vocab; t++) {
				kvd_gram_state_copy(&cp, &st);
				n_peer += kvd_gram_accept_token(g, v, s, &cp, t) == 0;
			}
			peer[peer_steps++] = now_ms() - t0;
			if (n_peer != n) {
				fprintf(stderr, "grammar_bench: peer allows %d, mask %d at step %d\n", n_peer, n, i);
				return 1;
			}
		}
		kvd_gram_accept_token(g, v, s, &st, ids[i]);
	}
	double mean = 0, peer_mean = 0;
	for (int i = 0; i < n_ids; i++)
		mean += ms[i];
	mean /= n_ids;
	for (int i = 0; i < peer_steps; i++)
		peer_mean += peer[i];
	peer_mean /= peer_steps;
	qsort(ms, (size_t)n_ids, sizeof(double), cmp_d);
	printf("grammar_bench: %s, %d tokens in the vocabulary\n", path, n_vocab);
	printf("  vocabulary prefix tree built in    %8.2f ms (once per tokenizer)\n", t_vocab);
	printf("  schema compile (cold)              %8.3f ms   target <= 10 ms   %s\n", t_compile,
	       t_compile <= 10 ? "ok" : "MISSED");
	printf("  schema from the cache              %8.4f ms\n", t_hit);
	printf("  mask over %d steps of a document (%ld tokens allowed per step on average):\n", n_ids,
	       allowed_sum / n_ids);
	printf("    first step (cold memo)           %8.3f ms\n", first);
	printf("    p50 %.3f ms  p90 %.3f ms  p99 %.3f ms  max %.3f ms  mean %.3f ms   target p50 < 1 ms, p99 < 5 ms   %s\n",
	       ms[n_ids / 2], ms[n_ids * 9 / 10], ms[n_ids * 99 / 100], ms[n_ids - 1], mean,
	       ms[n_ids / 2] < 1 && ms[n_ids * 99 / 100] < 5 ? "ok" : "MISSED");
	printf("  peer: every token matched on its own  %8.3f ms mean (%d steps)   mask is %.1fx faster\n", peer_mean,
	       peer_steps, peer_mean / mean);
	kvd_gram_state_fini(&st);
	kvd_gram_state_fini(&cp);
	kvd_gram_scratch_free(s);
	kvd_grammar_unref(g);
	kvd_gram_cache_free(cache);
	kvd_gram_vocab_free(v);
	kvd_tokenizer_free(tok);
	free(mask);
	free(ms);
	free(peer);
	return 0;
}
