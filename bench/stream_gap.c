/*
 * bench/stream_gap.c — what a long prompt arriving does to a running stream.
 *
 *   stream_gap --socket PATH [--prompt-tokens N] [--reps R]
 *
 * One client streams a greedy raw-mode generation; once it has produced 16
 * tokens a second client sends a prompt of N tokens (default 4096) asking
 * for one token. Measured on the client side (CLOCK_MONOTONIC):
 *   gap_p50_ms / gap_p99_ms / gap_max_ms  the stream's inter-token gaps from
 *        the moment the long prompt is sent until its first token arrives;
 *   base_gap_p50_ms  the stream's gaps before the prompt arrived;
 *   ttft_ms  the long prompt's time to first token under that load, and
 *   idle_ttft_ms  the same prompt (other words, so no prefix is cached) on
 *        an otherwise idle daemon, measured first; ratio = ttft / idle_ttft.
 * Each repetition uses fresh prompts; the figures printed are medians over
 * repetitions, as one JSON object on stdout. STREAM_GAP_TRACE=FILE appends
 * each gap under load to FILE: repetition, ms since the prompt was sent, gap.
 */
#include <errno.h>
#include <getopt.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kvclient.h"

#define MAX_GAPS 65536

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static const char *const WORDS[] = {
	"the", "of", "and", "to", "in", "is", "you", "that", "it", "he", "was", "for", "on", "are", "as",
	"with", "his", "they", "at", "be", "this", "have", "from", "or", "one", "had", "by", "word", "but",
	"not", "what", "all", "were", "we", "when", "your", "can", "said", "there", "use", "an", "each",
	"which", "she", "do", "how", "their", "if", "will", "up", "other", "about", "out", "many", "then",
};
#define N_WORDS (sizeof(WORDS) / sizeof(WORDS[0]))

/* A prompt of about n tokens (the daemon's count, within a few), words
 * drawn from seed: different seeds share no prefix. */
static char *make_prompt(kvc_client *c, uint32_t n, uint32_t seed)
{
	size_t cap = (size_t)n * 12 + 64, len = 0, ntok = 0;
	char *p = malloc(cap);
	uint32_t x = seed * 2654435761u + 1;

	if (!p)
		return NULL;
	len = (size_t)snprintf(p, cap, "Text %u:", seed);
	for (;;) {
		for (int i = 0; i < 64; i++) {
			x = x * 1103515245u + 12345u;
			len += (size_t)snprintf(p + len, cap - len, " %s", WORDS[(x >> 16) % N_WORDS]);
		}
		if (kvc_count_tokens(c, p, len, 0, &ntok) < 0 || ntok >= n || len + 64 * 12 >= cap)
			break;
	}
	return p;
}

struct stream {
	const char *socket;
	atomic_int stop;
	atomic_int n_tokens;
	double *t;        /* arrival time of each event */
	int n_t;
	int err;
};

static int on_stream(void *ud, const struct kvc_event *ev)
{
	struct stream *s = ud;
	if (s->n_t < MAX_GAPS)
		s->t[s->n_t++] = now_s();
	atomic_fetch_add(&s->n_tokens, (int)ev->n_tokens);
	return atomic_load(&s->stop);
}

static void *stream_main(void *arg)
{
	struct stream *s = arg;
	kvc_client *c;
	struct kvc_gen_params p;

	s->err = kvc_connect(s->socket, &c);
	if (s->err < 0) {
		atomic_store(&s->n_tokens, 1 << 30);
		return NULL;
	}
	kvc_gen_params_init(&p);
	p.flags = KVC_GEN_RAW;
	p.temperature = 0;
	p.max_tokens = 4000;
	while (!atomic_load(&s->stop)) {
		int r = kvc_generate(c, "Once upon a time, in a small town by the sea,", KVC_NTS, &p, on_stream, s, NULL);
		if (r < 0 && r != -ECANCELED) {
			s->err = r;
			break;
		}
	}
	kvc_close(c);
	return NULL;
}

static int one_token(kvc_client *c, const char *prompt, double *ret_ttft)
{
	struct kvc_gen_params p;
	struct kvc_result res;
	double t0 = now_s();
	kvc_gen_params_init(&p);
	p.flags = KVC_GEN_RAW;
	p.temperature = 0;
	p.max_tokens = 1;
	int r = kvc_generate(c, prompt, KVC_NTS, &p, NULL, NULL, &res);
	*ret_ttft = now_s() - t0;
	return r;
}

static int cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

static double pct(double *v, int n, double q)
{
	if (n <= 0)
		return 0;
	qsort(v, (size_t)n, sizeof(*v), cmp_d);
	int i = (int)(q * (n - 1) + 0.5);
	return v[i];
}

int main(int argc, char **argv)
{
	const char *socket = getenv("KVD_SOCKET");
	uint32_t n_prompt = 4096;
	int reps = 3;
	static const struct option opts[] = {
		{ "socket", required_argument, NULL, 's' },
		{ "prompt-tokens", required_argument, NULL, 'n' },
		{ "reps", required_argument, NULL, 'r' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	int o;
	while ((o = getopt_long(argc, argv, "s:n:r:h", opts, NULL)) != -1) {
		switch (o) {
		case 's': socket = optarg; break;
		case 'n': n_prompt = (uint32_t)strtoul(optarg, NULL, 10); break;
		case 'r': reps = atoi(optarg); break;
		default:
			fprintf(stderr, "usage: %s --socket PATH [--prompt-tokens N] [--reps R]\n", argv[0]);
			return o == 'h' ? 0 : 2;
		}
	}
	if (reps < 1 || reps > 50 || n_prompt < 16) {
		fprintf(stderr, "stream_gap: bad --reps or --prompt-tokens\n");
		return 2;
	}
	kvc_client *c;
	int r = kvc_connect(socket, &c);
	if (r < 0) {
		fprintf(stderr, "stream_gap: cannot connect to %s: %s\n", socket ? socket : "(default)", kv_strerror(r));
		return 1;
	}
	double idle[50], ttft[50], p50[50], p99[50], gmax[50], base[50];
	double *gaps = malloc(sizeof(double) * MAX_GAPS);
	struct stream s = { .socket = socket, .t = malloc(sizeof(double) * MAX_GAPS) };
	if (!gaps || !s.t)
		return 1;
	for (int rep = 0; rep < reps; rep++) {
		char *pi = make_prompt(c, n_prompt, 1000u + (uint32_t)rep * 2);
		char *pl = make_prompt(c, n_prompt, 1001u + (uint32_t)rep * 2);
		if (!pi || !pl)
			return 1;
		r = one_token(c, pi, &idle[rep]);
		if (r < 0) {
			fprintf(stderr, "stream_gap: idle prompt: %s (%s)\n", kv_strerror(r), kvc_last_message(c));
			return 1;
		}
		pthread_t th;
		atomic_store(&s.stop, 0);
		atomic_store(&s.n_tokens, 0);
		s.n_t = 0;
		pthread_create(&th, NULL, stream_main, &s);
		while (atomic_load(&s.n_tokens) < 16) {
			struct timespec ts = { 0, 1000000 };
			nanosleep(&ts, NULL);
		}
		int k0 = s.n_t;
		double t_send = now_s();
		r = one_token(c, pl, &ttft[rep]);
		double t_done = now_s();
		atomic_store(&s.stop, 1);
		pthread_join(th, NULL);
		if (r < 0 || s.err < 0) {
			fprintf(stderr, "stream_gap: %s\n", kv_strerror(r < 0 ? r : s.err));
			return 1;
		}
		int ng = 0, nb = 0;
		for (int i = 1; i < k0; i++)
			gaps[nb++] = s.t[i] - s.t[i - 1];
		base[rep] = pct(gaps, nb, 0.5) * 1e3;
		FILE *trace = getenv("STREAM_GAP_TRACE") ? fopen(getenv("STREAM_GAP_TRACE"), "a") : NULL;
		for (int i = 1; i < s.n_t; i++)
			if (s.t[i] > t_send && s.t[i - 1] < t_done) {
				gaps[ng++] = s.t[i] - (s.t[i - 1] > t_send ? s.t[i - 1] : t_send);
				if (trace)
					fprintf(trace, "%d %.1f %.2f\n", rep, (s.t[i] - t_send) * 1e3, gaps[ng - 1] * 1e3);
			}
		if (trace)
			fclose(trace);
		p50[rep] = pct(gaps, ng, 0.5) * 1e3;
		p99[rep] = pct(gaps, ng, 0.99) * 1e3;
		gmax[rep] = ng ? gaps[ng - 1] * 1e3 : 0;
		fprintf(stderr, "rep %d: idle ttft %.0f ms, loaded ttft %.0f ms, gaps p50 %.1f p99 %.1f max %.1f ms (%d gaps)\n",
			rep, idle[rep] * 1e3, ttft[rep] * 1e3, p50[rep], p99[rep], gmax[rep], ng);
		free(pi);
		free(pl);
	}
	double mi = pct(idle, reps, 0.5) * 1e3, mt = pct(ttft, reps, 0.5) * 1e3;
	printf("{\"prompt_tokens\": %u, \"reps\": %d, \"idle_ttft_ms\": %.1f, \"ttft_ms\": %.1f, \"ttft_ratio\": %.3f, "
	       "\"base_gap_p50_ms\": %.2f, \"gap_p50_ms\": %.2f, \"gap_p99_ms\": %.2f, \"gap_max_ms\": %.2f}\n",
	       n_prompt, reps, mi, mt, mt / mi, pct(base, reps, 0.5), pct(p50, reps, 0.5), pct(p99, reps, 0.5),
	       pct(gmax, reps, 0.5));
	free(gaps);
	free(s.t);
	kvc_close(c);
	return 0;
}
