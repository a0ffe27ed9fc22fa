/*
 * bench/serve_bench.c — kvd end to end: N client threads, each with its own
 * libkvclient connection, generate at the same time through a running kvd,
 * and one JSON object on stdout summarises the run.
 *
 *   serve_bench --socket PATH [--clients N] [--depth D] [--tokens T] [--seed S]
 *
 * Every client sends one raw-mode, greedy (temperature 0) request whose
 * prompt is D tokens long and asks for T + 1 tokens: the first comes from
 * the prompt's prefill, the other T from T decode steps, as in kvd_bench's
 * decode and batch figures (T decode steps after a D-token context).
 * Client i's prompt is a deterministic sequence of common English words
 * drawn with kvd_bench's generator (x = x * 1103515245 + 12345, seed S + i),
 * grown word by word until the daemon's tokenizer counts exactly D tokens.
 * The client API has no "ignore EOS": a request the model ends early is
 * counted as it is (eos_finishes, generated_min in the output).
 *
 * Figures (client-side clock, CLOCK_MONOTONIC):
 *   tokens_per_s      aggregate decode rate while every client is decoding:
 *                     tokens received after the last client's first token
 *                     and up to the first client's last token, over that
 *                     window. With one client: (generated - 1) / (last
 *                     token - first token), the single-stream decode rate.
 *   e2e_tokens_per_s  all generated tokens over the wall time from the
 *                     first request sent to the last request ended
 *                     (includes queueing and prefill).
 *   ttft_ms           mean time from sending a request to its first token;
 *                     ttft_daemon_ms the daemon's own measure (arrival to
 *                     first token, kvc_result.ttft_ns).
 *   itl_ms            mean inter-token latency: per client (last - first
 *                     token) / (generated - 1), averaged over clients.
 */
#include <errno.h>
#include <getopt.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kvclient.h"

#define MAX_CLIENTS 256

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Common words, each one token (with its leading space) in most BPE vocabularies. */
static const char *const WORDS[] = {
	"the",    "of",     "and",   "to",    "in",     "is",    "you",   "that",  "it",    "he",    "was",
	"for",    "on",     "are",   "as",    "with",   "his",   "they",  "at",    "be",    "this",  "have",
	"from",   "or",     "one",   "had",   "by",     "word",  "but",   "not",   "what",  "all",   "were",
	"we",     "when",   "your",  "can",   "said",   "there", "use",   "an",    "each",  "which", "she",
	"do",     "how",    "their", "if",    "will",   "up",    "other", "about", "out",   "many",  "then",
	"them",   "these",  "so",    "some",  "her",    "would", "make",  "like",  "him",   "into",  "time",
	"has",    "look",   "two",   "more",  "write",  "go",    "see",   "number", "no",   "way",   "could",
	"people", "my",     "than",  "first", "water",  "been",  "call",  "who",   "oil",   "its",   "now",
	"find",   "long",   "down",  "day",   "did",    "get",   "come",  "made",  "may",   "part",  "over",
	"new",    "sound",  "take",  "only",  "little", "work",  "know",  "place", "year",  "live",  "me",
	"back",   "give",   "most",  "very",  "after",  "thing", "our",   "just",  "name",  "good",  "man",
	"think",  "say",    "great", "where", "help",   "through", "much", "before", "line", "right", "too",
	"mean",   "old",    "any",   "same",  "tell",   "boy",   "follow", "came", "want",  "show",  "also",
	"around", "form",   "three", "small", "set",    "put",   "end",   "does",  "another", "well", "large",
	"must",   "big",    "even",  "such",  "because", "turn", "here",  "why",   "ask",   "went",  "men",
	"read",   "need",   "land",  "different", "home", "us",  "move",  "try",   "kind",  "hand",  "picture",
	"again",  "change", "off",   "play",  "spell",  "air",   "away",  "animal", "house", "point", "page",
	"letter", "mother", "answer", "found", "study", "still", "learn", "should", "world", "high", "every",
	"near",   "add",    "food",  "between", "own",  "below", "country", "plant", "last", "school", "father",
	"keep",   "tree",   "never", "start", "city",   "earth", "eye",   "light", "thought", "head", "under",
	"story",  "saw",    "left",  "few",   "while",  "along", "might", "close", "something", "seem", "next",
};
#define N_WORDS (sizeof(WORDS) / sizeof(WORDS[0]))

struct client {
	int idx;
	const char *socket;
	const char *prompt;
	uint32_t max_tokens;
	pthread_barrier_t *barrier;
	/* results */
	int rc;
	char err[768];
	double t_send, t_end;
	double *ev_t;      /* time of each event */
	uint32_t *ev_n;    /* tokens each event covers */
	uint32_t n_ev, cap_ev;
	uint32_t generated;
	struct kvc_result res;
};

static int on_token(void *ud, const struct kvc_event *ev)
{
	struct client *c = ud;
	double t = now_s();
	if (c->n_ev < c->cap_ev) {
		c->ev_t[c->n_ev] = t;
		c->ev_n[c->n_ev] = ev->n_tokens;
		c->n_ev++;
	}
	c->generated += ev->n_tokens;
	return 0;
}

static void *client_main(void *arg)
{
	struct client *c = arg;
	kvc_client *h = NULL;
	int r = kvc_connect(c->socket, &h);
	if (r < 0)
		snprintf(c->err, sizeof(c->err), "connect: %.200s", kv_strerror(r));
	pthread_barrier_wait(c->barrier);
	if (r < 0) {
		c->rc = r;
		return NULL;
	}
	struct kvc_gen_params p;
	kvc_gen_params_init(&p);
	p.max_tokens = c->max_tokens;
	p.temperature = 0.0f;
	p.top_k = 0;
	p.top_p = 1.0f;
	p.min_p = 0.0f;
	p.seed = 1;
	p.flags = KVC_GEN_RAW;
	c->t_send = now_s();
	r = kvc_generate(h, c->prompt, KVC_NTS, &p, on_token, c, &c->res);
	c->t_end = now_s();
	if (r < 0)
		snprintf(c->err, sizeof(c->err), "generate: %.200s%s%.513s", kv_strerror(r), c->res.error_message[0] ? ": " : "",
			 c->res.error_message);
	c->rc = r;
	kvc_close(h);
	return NULL;
}

struct strbuf {
	char *s;
	size_t len, cap;
};

static int sb_add(struct strbuf *b, const char *w)
{
	size_t n = strlen(w) + 1;
	if (b->len + n + 1 > b->cap) {
		size_t cap = (b->cap ? b->cap * 2 : 256) + n;
		char *s = realloc(b->s, cap);
		if (!s)
			return -ENOMEM;
		b->s = s;
		b->cap = cap;
	}
	b->s[b->len++] = ' ';
	memcpy(b->s + b->len, w, n - 1);
	b->len += n - 1;
	b->s[b->len] = 0;
	return 0;
}

/*
 * A prompt of exactly `depth` tokens as the daemon counts them in raw mode
 * (with the model's BOS when it adds one). Returns a malloc'd string or NULL.
 */
static char *make_prompt(kvc_client *h, int depth, uint32_t seed, char *err, size_t errlen)
{
	struct strbuf b = {0};
	size_t *ends = calloc((size_t)depth * 4 + 8, sizeof(size_t)); /* b.len after each word */
	size_t nw = 0, maxw = (size_t)depth * 4 + 8;
	uint32_t x = seed;
	size_t n = 0;
	if (!ends)
		return NULL;
	for (int iter = 0; iter < depth * 8; iter++) {
		int r = b.len ? kvc_count_tokens(h, b.s, b.len, KVC_TOK_ADD_BOS, &n) : 0;
		if (r < 0) {
			snprintf(err, errlen, "count_tokens: %s", kv_strerror(r));
			goto fail;
		}
		if (!b.len)
			n = 0;
		if ((int)n == depth) {
			free(ends);
			return b.s;
		}
		if ((int)n > depth) {
			/* drop the last word; the generator moves on, so another follows */
			if (nw > 0) {
				nw--;
				b.len = nw ? ends[nw - 1] : 0;
				if (b.s)
					b.s[b.len] = 0;
			}
			if (nw == 0) {
				b.len = 0;
			}
		}
		int need = (int)n < depth ? depth - (int)n : 1;
		for (int k = 0; k < need && nw < maxw; k++) {
			x = x * 1103515245u + 12345u;
			if (sb_add(&b, WORDS[(x >> 8) % N_WORDS]) < 0) {
				snprintf(err, errlen, "out of memory");
				goto fail;
			}
			ends[nw++] = b.len;
		}
	}
	snprintf(err, errlen, "no prompt of exactly %d tokens found", depth);
fail:
	free(ends);
	free(b.s);
	return NULL;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{"socket", required_argument, 0, 'S'}, {"clients", required_argument, 0, 'c'},
		{"depth", required_argument, 0, 'd'},  {"tokens", required_argument, 0, 'n'},
		{"seed", required_argument, 0, 'r'},   {0, 0, 0, 0},
	};
	const char *sock = NULL;
	int nclients = 1, depth = 64, tokens = 64;
	uint32_t seed = 1;
	int o;
	while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (o) {
		case 'S': sock = optarg; break;
		case 'c': nclients = atoi(optarg); break;
		case 'd': depth = atoi(optarg); break;
		case 'n': tokens = atoi(optarg); break;
		case 'r': seed = (uint32_t)strtoul(optarg, NULL, 0); break;
		default:
			fprintf(stderr, "usage: see the comment at the top of bench/serve_bench.c\n");
			return 2;
		}
	}
	if (nclients < 1 || nclients > MAX_CLIENTS || depth < 1 || tokens < 1) {
		fprintf(stderr, "serve_bench: --clients 1..%d, --depth >= 1, --tokens >= 1\n", MAX_CLIENTS);
		return 2;
	}

	kvc_client *h;
	int r = kvc_connect(sock, &h);
	if (r < 0) {
		fprintf(stderr, "serve_bench: cannot connect to kvd: %s\n", kv_strerror(r));
		return 1;
	}
	struct client *cl = calloc((size_t)nclients, sizeof(*cl));
	char **prompts = calloc((size_t)nclients, sizeof(char *));
	pthread_t *tid = calloc((size_t)nclients, sizeof(pthread_t));
	pthread_barrier_t barrier;
	char err[256];
	int rc = 1;
	if (!cl || !prompts || !tid) {
		fprintf(stderr, "serve_bench: out of memory\n");
		return 1;
	}
	for (int i = 0; i < nclients; i++) {
		prompts[i] = make_prompt(h, depth, seed + (uint32_t)i, err, sizeof(err));
		if (!prompts[i]) {
			fprintf(stderr, "serve_bench: prompt %d: %s\n", i, err);
			return 1;
		}
	}
	kvc_close(h);

	uint32_t max_tokens = (uint32_t)tokens + 1;
	pthread_barrier_init(&barrier, NULL, (unsigned)nclients);
	for (int i = 0; i < nclients; i++) {
		cl[i] = (struct client){.idx = i, .socket = sock, .prompt = prompts[i], .max_tokens = max_tokens,
					.barrier = &barrier, .cap_ev = max_tokens + 1};
		cl[i].ev_t = calloc(cl[i].cap_ev, sizeof(double));
		cl[i].ev_n = calloc(cl[i].cap_ev, sizeof(uint32_t));
		if (!cl[i].ev_t || !cl[i].ev_n) {
			fprintf(stderr, "serve_bench: out of memory\n");
			return 1;
		}
	}
	for (int i = 0; i < nclients; i++) {
		if ((r = pthread_create(&tid[i], NULL, client_main, &cl[i])) != 0) {
			fprintf(stderr, "serve_bench: pthread_create: %s\n", strerror(r));
			return 1;
		}
	}
	for (int i = 0; i < nclients; i++)
		pthread_join(tid[i], NULL);
	pthread_barrier_destroy(&barrier);

	int failed = 0, eos = 0;
	for (int i = 0; i < nclients; i++) {
		if (cl[i].rc < 0) {
			fprintf(stderr, "serve_bench: client %d: %s\n", i, cl[i].err);
			failed++;
		} else if (cl[i].res.finish_reason == KVC_FINISH_EOS) {
			eos++;
		}
	}
	if (failed)
		goto out;

	double t_first_send = 1e300, t_last_end = 0, t_a = 0, t_b = 1e300;
	double ttft = 0, ttft_d = 0, itl = 0, prompt_tok = 0;
	uint64_t total = 0, gmin = UINT64_MAX, gmax = 0;
	int n_itl = 0;
	double *ttfts = calloc((size_t)nclients, sizeof(double));
	for (int i = 0; i < nclients; i++) {
		struct client *c = &cl[i];
		if (c->t_send < t_first_send)
			t_first_send = c->t_send;
		if (c->t_end > t_last_end)
			t_last_end = c->t_end;
		total += c->generated;
		if (c->generated < gmin)
			gmin = c->generated;
		if (c->generated > gmax)
			gmax = c->generated;
		prompt_tok += c->res.prompt_tokens;
		ttft_d += c->res.ttft_ns * 1e-6;
		if (c->n_ev == 0)
			continue;
		double first = c->ev_t[0], last = c->ev_t[c->n_ev - 1];
		ttfts[i] = (first - c->t_send) * 1e3;
		ttft += ttfts[i];
		if (first > t_a)
			t_a = first;
		if (last < t_b)
			t_b = last;
		if (c->generated > c->ev_n[0]) {
			itl += (last - first) * 1e3 / (double)(c->generated - c->ev_n[0]);
			n_itl++;
		}
	}
	/* tokens delivered inside (t_a, t_b], while every client was decoding */
	uint64_t win_tokens = 0;
	for (int i = 0; i < nclients; i++)
		for (uint32_t k = 0; k < cl[i].n_ev; k++)
			if (cl[i].ev_t[k] > t_a && cl[i].ev_t[k] <= t_b)
				win_tokens += cl[i].ev_n[k];
	double win = t_b > t_a ? t_b - t_a : 0;
	double wall = t_last_end - t_first_send;
	qsort(ttfts, (size_t)nclients, sizeof(double), cmp_double);
	printf("{\"figure\":\"serve\",\"clients\":%d,\"depth\":%d,\"tokens\":%d,\"max_tokens\":%u,"
	       "\"prompt_tokens_mean\":%.2f,\"generated_tokens\":%llu,\"generated_min\":%llu,\"generated_max\":%llu,"
	       "\"eos_finishes\":%d,\"wall_s\":%.6f,\"e2e_tokens_per_s\":%.3f,\"window_s\":%.6f,\"window_tokens\":%llu,"
	       "\"tokens_per_s\":%.3f,\"ttft_ms\":%.3f,\"ttft_max_ms\":%.3f,\"ttft_daemon_ms\":%.3f,\"itl_ms\":%.4f}\n",
	       nclients, depth, tokens, max_tokens, prompt_tok / nclients, (unsigned long long)total,
	       (unsigned long long)gmin, (unsigned long long)gmax, eos, wall, wall > 0 ? total / wall : 0, win,
	       (unsigned long long)win_tokens, win > 0 ? win_tokens / win : 0, ttft / nclients, ttfts[nclients - 1],
	       ttft_d / nclients, n_itl ? itl / n_itl : 0);
	free(ttfts);
	rc = 0;
out:
	for (int i = 0; i < nclients; i++) {
		free(cl[i].ev_t);
		free(cl[i].ev_n);
		free(prompts[i]);
	}
	free(prompts);
	free(cl);
	free(tid);
	return rc;
}
