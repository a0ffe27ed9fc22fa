/*
 * bench/load_bench.c — kvd under load: many concurrent clients, each
 * sending a series of greedy requests with random prompt and output
 * lengths, against a daemon whose KV pool is small enough that requests
 * are preempted and swapped. Every answer is compared with the same
 * request run alone, and the daemon's pages, fds and memfds must be back
 * at their baseline once the clients are gone. Run it with bench/load,
 * which starts such a daemon; this is a benchmark, not part of make test.
 *
 *   load_bench --socket PATH [--pid PID] [--clients 64] [--requests 50]
 *              [--seed 1] [--prompt-words 4:160] [--max-tokens 1:64]
 *              [--no-solo] [--tenants N]
 *
 * Requests are raw-mode and greedy (temperature 0, top-k and top-p off):
 * on the CPU backend an answer does not depend on its batch-mates, on
 * prefix-cache hits or on having been swapped, so it must equal the solo
 * run byte for byte (text, token count, finish reason). Request (i, j) of
 * client i draws its prompt length (words), its words and its max_tokens
 * from one seeded generator (the words are cut until prompt + max_tokens
 * fits the context); half the prompts start with one of four
 * shared preambles, so prefixes are shared, cached and copied on write too.
 * The solo runs happen after the load, one request at a time, on one
 * connection. With --tenants N client i names cache tenant "t(i mod N)",
 * so only clients of one tenant share cached prefixes (as N users would):
 * prefix_hit_tokens against prefix_query_tokens, and pages, show what
 * dividing the cache by owner costs.
 *
 * Figures, p50 and p99 over requests: ttft (send -> first token, client
 * side; ttft_daemon: arrival -> first token as the daemon measured it),
 * itl (a request's mean inter-token latency: first -> last token over
 * generated - 1); token_gap is every gap between tokens as the client saw
 * them (an event covering k tokens counts as k gaps of its gap / k: bursts
 * read at once show as zeros, stalls as the tail); the daemon's swap and preemption counters over the load;
 * lost (an error, or no DONE) and corrupted (differs from solo) answers;
 * pages_used / pages_swapped (pages of requests in swap: the cached prefix
 * pages the daemon keeps there, demoted_pages, are a cache tier, not held by
 * anyone) / clients, and with --pid the daemon's open
 * fds and memfds, before and after. Exit status 0 only when nothing was
 * lost or corrupted and everything came back to baseline.
 */
#include <dirent.h>
#include <errno.h>
#include <getopt.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kvclient.h"

#define MAX_CLIENTS 1024

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
	"them", "these", "so", "some", "her", "would", "make", "like", "him", "into", "time", "has", "look",
	"two", "more", "write", "go", "see", "number", "no", "way", "could", "people", "my", "than", "first",
	"water", "been", "call", "who", "oil", "its", "now", "find", "long", "down", "day", "did", "get",
	"come", "made", "may", "part", "over", "new", "sound", "take", "only", "little", "work", "know",
	"place", "year", "live", "me", "back", "give", "most", "very", "after", "thing", "our", "just",
	"name", "good", "man", "think", "say", "great", "where", "help", "through", "much", "before",
};
#define N_WORDS (sizeof(WORDS) / sizeof(WORDS[0]))

static const char *const PREAMBLES[4] = {
	"You are a careful assistant. Answer in one short paragraph, plainly, without lists.",
	"The following is a conversation between a user and a helpful, honest assistant.",
	"Translate the text below into simple English and keep every number as it is.",
	"Summarise the notes that follow for a reader who has five seconds to spare.",
};

struct req {
	char *prompt;
	uint32_t max_tokens;
	/* load run */
	char *text;
	size_t text_len;
	int rc, finish;
	uint32_t generated;
	/* solo run */
	char *solo_text;
	size_t solo_len;
	int solo_rc, solo_finish;
	uint32_t solo_generated;
};

struct lat {
	double *v;
	size_t n, cap;
};

static void lat_add(struct lat *l, double x)
{
	if (l->n == l->cap) {
		size_t cap = l->cap ? l->cap * 2 : 4096;
		double *v = realloc(l->v, cap * sizeof(*v));
		if (!v)
			return;
		l->v = v;
		l->cap = cap;
	}
	l->v[l->n++] = x;
}

static int cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

static double pct(struct lat *l, double p)
{
	if (!l->n)
		return 0;
	size_t i = (size_t)(p * (double)(l->n - 1) + 0.5);
	return l->v[i];
}

static pthread_mutex_t lat_mu = PTHREAD_MUTEX_INITIALIZER;
static struct lat ttft, ttft_daemon, itl, gap;

struct collect {
	char *text;
	size_t len, cap;
	double t_send, t_first, t_last;
	bool first;
	double *gaps;
	size_t n_gaps, cap_gaps;
};

static int on_token(void *ud, const struct kvc_event *ev)
{
	struct collect *c = ud;
	double t = now_s();
	if (c->len + ev->text_len + 1 > c->cap) {
		size_t cap = (c->cap ? c->cap * 2 : 256) + ev->text_len;
		char *s = realloc(c->text, cap);
		if (!s)
			return 1;
		c->text = s;
		c->cap = cap;
	}
	memcpy(c->text + c->len, ev->text, ev->text_len);
	c->len += ev->text_len;
	if (c->gaps) {
		if (!c->first) {
			c->first = true;
			c->t_first = t;
		} else {
			double g = (t - c->t_last) / ev->n_tokens;
			for (uint32_t k = 0; k < ev->n_tokens && c->n_gaps < c->cap_gaps; k++)
				c->gaps[c->n_gaps++] = g;
		}
	}
	c->t_last = t;
	return 0;
}

static void greedy(struct kvc_gen_params *p, uint32_t max_tokens)
{
	kvc_gen_params_init(p);
	p->max_tokens = max_tokens;
	p->temperature = 0.0f;
	p->top_k = 0;
	p->top_p = 1.0f;
	p->min_p = 0.0f;
	p->seed = 1;
	p->flags = KVC_GEN_RAW;
}

struct worker {
	const char *socket;
	struct req *reqs;
	int n;
	pthread_barrier_t *barrier;
	int connect_rc;
	char tenant[16];            /* "" none, else its cache tenant (--tenants) */
};

static void *worker_main(void *arg)
{
	struct worker *w = arg;
	kvc_client *h = NULL;
	w->connect_rc = kvc_connect(w->socket, &h);
	pthread_barrier_wait(w->barrier);
	for (int j = 0; j < w->n; j++) {
		struct req *q = &w->reqs[j];
		if (!h) {
			q->rc = w->connect_rc;
			continue;
		}
		struct kvc_gen_params p;
		struct kvc_result res;
		greedy(&p, q->max_tokens);
		if (w->tenant[0])
			p.tenant = w->tenant;
		struct collect c = { .cap_gaps = q->max_tokens + 2 };
		c.gaps = malloc(c.cap_gaps * sizeof(double));
		c.t_send = now_s();
		q->rc = kvc_generate(h, q->prompt, KVC_NTS, &p, on_token, &c, &res);
		q->text = c.text;
		q->text_len = c.len;
		q->finish = res.finish_reason;
		q->generated = res.generated_tokens;
		pthread_mutex_lock(&lat_mu);
		if (q->rc == 0 && c.first) {
			lat_add(&ttft, c.t_first - c.t_send);
			lat_add(&ttft_daemon, res.ttft_ns * 1e-9);
			if (res.generated_tokens >= 2)
				lat_add(&itl, (c.t_last - c.t_first) / (res.generated_tokens - 1));
		}
		for (size_t k = 0; k < c.n_gaps; k++)
			lat_add(&gap, c.gaps[k]);
		pthread_mutex_unlock(&lat_mu);
		free(c.gaps);
	}
	kvc_close(h);
	return NULL;
}

static uint32_t rnd(uint64_t *s)
{
	*s = *s * 6364136223846793005ull + 1442695040888963407ull;
	return (uint32_t)(*s >> 33);
}

static char *make_prompt(uint64_t *s, unsigned words)
{
	size_t cap = 128 + words * 16;
	char *p = malloc(cap);
	size_t n = 0;
	if (!p)
		return NULL;
	if (rnd(s) & 1)
		n += (size_t)snprintf(p, cap, "%s", PREAMBLES[rnd(s) & 3]);
	for (unsigned k = 0; k < words; k++)
		n += (size_t)snprintf(p + n, cap - n, "%s%s", n ? " " : "", WORDS[rnd(s) % N_WORDS]);
	return p;
}

struct fdcount {
	int fds, memfds;
};

static int count_fds(int pid, struct fdcount *ret)
{
	char dir[64], path[320], link[256];
	snprintf(dir, sizeof(dir), "/proc/%d/fd", pid);
	DIR *d = opendir(dir);
	if (!d)
		return -errno;
	struct dirent *e;
	ret->fds = ret->memfds = 0;
	while ((e = readdir(d))) {
		if (e->d_name[0] == '.')
			continue;
		ret->fds++;
		snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
		ssize_t n = readlink(path, link, sizeof(link) - 1);
		if (n > 0) {
			link[n] = 0;
			if (!strncmp(link, "/memfd:", 7))
				ret->memfds++;
		}
	}
	closedir(d);
	return 0;
}

static int parse_range(const char *s, unsigned *lo, unsigned *hi)
{
	return sscanf(s, "%u:%u", lo, hi) == 2 && *lo >= 1 && *lo <= *hi ? 0 : -1;
}

int main(int argc, char **argv)
{
	const char *socket = NULL;
	int pid = 0, n_clients = 64, n_req = 50, solo = 1, n_tenants = 0;
	unsigned w_lo = 4, w_hi = 160, t_lo = 1, t_hi = 64;
	uint64_t seed = 1;
	static const struct option opts[] = {
		{ "socket", 1, 0, 's' }, { "pid", 1, 0, 'p' }, { "clients", 1, 0, 'c' }, { "requests", 1, 0, 'r' },
		{ "seed", 1, 0, 'S' }, { "prompt-words", 1, 0, 'w' }, { "max-tokens", 1, 0, 't' },
		{ "no-solo", 0, 0, 'n' }, { "tenants", 1, 0, 'T' }, { 0 } };
	int o;
	while ((o = getopt_long(argc, argv, "s:p:c:r:S:w:t:nT:", opts, NULL)) != -1) {
		switch (o) {
		case 'T': n_tenants = atoi(optarg); break;
		case 's': socket = optarg; break;
		case 'p': pid = atoi(optarg); break;
		case 'c': n_clients = atoi(optarg); break;
		case 'r': n_req = atoi(optarg); break;
		case 'S': seed = strtoull(optarg, NULL, 0); break;
		case 'w': if (parse_range(optarg, &w_lo, &w_hi) < 0) goto usage; break;
		case 't': if (parse_range(optarg, &t_lo, &t_hi) < 0) goto usage; break;
		case 'n': solo = 0; break;
		default: goto usage;
		}
	}
	if (!socket || n_clients < 1 || n_clients > MAX_CLIENTS || n_req < 1)
		goto usage;

	kvc_client *ctl = NULL;
	int r = kvc_connect(socket, &ctl);
	if (r < 0) {
		fprintf(stderr, "load_bench: connect %s: %s\n", socket, kv_strerror(r));
		return 2;
	}
	const struct kvc_info *info = kvc_server_info(ctl);
	struct kvc_stats s0, s1, s2;
	struct fdcount f0 = { 0 }, f1 = { 0 };
	if ((r = kvc_stats(ctl, &s0)) < 0) {
		fprintf(stderr, "load_bench: stats: %s\n", kv_strerror(r));
		return 2;
	}
	if (pid && count_fds(pid, &f0) < 0) {
		fprintf(stderr, "load_bench: cannot read /proc/%d/fd\n", pid);
		return 2;
	}

	/* the requests */
	int n_total = n_clients * n_req;
	struct req *reqs = calloc((size_t)n_total, sizeof(*reqs));
	for (int i = 0; i < n_total; i++) {
		uint64_t st = seed * 0x9e3779b97f4a7c15ull + (uint64_t)i * 0xbf58476d1ce4e5b9ull;
		rnd(&st);
		unsigned words = w_lo + rnd(&st) % (w_hi - w_lo + 1);
		reqs[i].max_tokens = t_lo + rnd(&st) % (t_hi - t_lo + 1);
		/* fewer words until prompt + max_tokens fits the context */
		for (uint64_t st2 = st;; st = st2, words = words * 3 / 4) {
			size_t n_tok = 0;
			reqs[i].prompt = make_prompt(&st, words ? words : 1);
			r = kvc_count_tokens(ctl, reqs[i].prompt, KVC_NTS, KVC_TOK_ADD_BOS, &n_tok);
			if (r < 0) {
				fprintf(stderr, "load_bench: count_tokens: %s\n", kv_strerror(r));
				return 2;
			}
			if (n_tok + reqs[i].max_tokens <= info->n_ctx || words <= 1)
				break;
			free(reqs[i].prompt);
		}
	}

	/* the load */
	pthread_t th[MAX_CLIENTS];
	struct worker w[MAX_CLIENTS];
	pthread_barrier_t bar;
	pthread_barrier_init(&bar, NULL, (unsigned)n_clients + 1);
	for (int i = 0; i < n_clients; i++) {
		w[i] = (struct worker){ socket, reqs + (size_t)i * n_req, n_req, &bar, 0, "" };
		if (n_tenants > 0)
			snprintf(w[i].tenant, sizeof(w[i].tenant), "t%d", i % n_tenants);
		pthread_create(&th[i], NULL, worker_main, &w[i]);
	}
	pthread_barrier_wait(&bar);
	double t0 = now_s();
	for (int i = 0; i < n_clients; i++)
		pthread_join(th[i], NULL);
	double t_load = now_s() - t0;
	kvc_stats(ctl, &s1);

	/* back to baseline: the clients' connections are gone, nothing runs */
	double tw = now_s();
	do {
		if (kvc_stats(ctl, &s2) < 0)
			break;
		if (pid)
			count_fds(pid, &f1);
		if (s2.clients == s0.clients && s2.requests_running == 0 && s2.requests_waiting == 0 &&
		    s2.pages_used == s0.pages_used && s2.pages_swapped - s2.pages_demoted == s0.pages_swapped - s0.pages_demoted &&
		    (!pid || (f1.fds == f0.fds && f1.memfds == f0.memfds)))
			break;
		usleep(100000);
	} while (now_s() - tw < 10);

	/* solo runs */
	double t_solo = 0;
	if (solo) {
		t0 = now_s();
		for (int i = 0; i < n_total; i++) {
			struct kvc_gen_params p;
			struct kvc_result res;
			struct collect c = { 0 };
			greedy(&p, reqs[i].max_tokens);
			reqs[i].solo_rc = kvc_generate(ctl, reqs[i].prompt, KVC_NTS, &p, on_token, &c, &res);
			reqs[i].solo_text = c.text;
			reqs[i].solo_len = c.len;
			reqs[i].solo_finish = res.finish_reason;
			reqs[i].solo_generated = res.generated_tokens;
		}
		t_solo = now_s() - t0;
	}

	int lost = 0, corrupted = 0, solo_failed = 0;
	uint64_t gen_total = 0;
	for (int i = 0; i < n_total; i++) {
		struct req *q = &reqs[i];
		gen_total += q->generated;
		if (q->rc < 0 || q->finish < KVC_FINISH_EOS || q->finish > KVC_FINISH_STOP) {
			if (lost++ < 5)
				fprintf(stderr, "lost: client %d request %d: %s (finish %d)\n", i / n_req, i % n_req,
					q->rc < 0 ? kv_strerror(q->rc) : "no answer", q->finish);
			continue;
		}
		if (!solo)
			continue;
		if (q->solo_rc < 0) {
			solo_failed++;
			continue;
		}
		if (q->text_len != q->solo_len || (q->text_len && memcmp(q->text, q->solo_text, q->text_len)) ||
		    q->generated != q->solo_generated || q->finish != q->solo_finish) {
			if (corrupted++ < 5)
				fprintf(stderr, "corrupted: client %d request %d: %u tokens \"%.60s\" under load, %u \"%.60s\" alone\n",
					i / n_req, i % n_req, q->generated, q->text ? q->text : "", q->solo_generated,
					q->solo_text ? q->solo_text : "");
		}
	}
	qsort(ttft.v, ttft.n, sizeof(double), cmp_d);
	qsort(ttft_daemon.v, ttft_daemon.n, sizeof(double), cmp_d);
	qsort(itl.v, itl.n, sizeof(double), cmp_d);
	qsort(gap.v, gap.n, sizeof(double), cmp_d);
	bool baseline = s2.pages_used == s0.pages_used && s2.pages_swapped - s2.pages_demoted == s0.pages_swapped - s0.pages_demoted &&
			s2.clients == s0.clients && (!pid || (f1.fds == f0.fds && f1.memfds == f0.memfds));

	printf("{\n");
	printf("  \"model\": \"%s\", \"clients\": %d, \"requests_per_client\": %d, \"requests\": %d,\n", info->model_name,
	       n_clients, n_req, n_total);
	printf("  \"prompt_words\": [%u, %u], \"max_tokens\": [%u, %u], \"seed\": %llu,\n", w_lo, w_hi, t_lo, t_hi,
	       (unsigned long long)seed);
	printf("  \"load_s\": %.1f, \"generated_tokens\": %llu, \"tokens_per_s\": %.1f, \"solo_s\": %.1f,\n", t_load,
	       (unsigned long long)gen_total, gen_total / t_load, t_solo);
	printf("  \"ttft_ms\": {\"p50\": %.1f, \"p99\": %.1f, \"n\": %zu},\n", pct(&ttft, 0.5) * 1e3,
	       pct(&ttft, 0.99) * 1e3, ttft.n);
	printf("  \"ttft_daemon_ms\": {\"p50\": %.1f, \"p99\": %.1f},\n", pct(&ttft_daemon, 0.5) * 1e3,
	       pct(&ttft_daemon, 0.99) * 1e3);
	printf("  \"itl_ms\": {\"p50\": %.2f, \"p99\": %.2f, \"n\": %zu},\n", pct(&itl, 0.5) * 1e3, pct(&itl, 0.99) * 1e3,
	       itl.n);
	printf("  \"token_gap_ms\": {\"p50\": %.2f, \"p99\": %.2f, \"max\": %.1f},\n", pct(&gap, 0.5) * 1e3,
	       pct(&gap, 0.99) * 1e3, pct(&gap, 1.0) * 1e3);
	printf("  \"pool_pages\": %llu, \"swap_out_pages\": %llu, \"swap_in_pages\": %llu, \"pages_evicted\": %llu, "
	       "\"demoted_pages\": %llu,\n",
	       (unsigned long long)s0.pages_total, (unsigned long long)(s1.swap_out_pages - s0.swap_out_pages),
	       (unsigned long long)(s1.swap_in_pages - s0.swap_in_pages),
	       (unsigned long long)(s1.pages_evicted - s0.pages_evicted), (unsigned long long)s2.pages_demoted);
	printf("  \"tenants\": %d, \"prefix_query_tokens\": %llu, \"prefix_hit_tokens\": %llu, \"cow_copies\": %llu,\n",
	       n_tenants, (unsigned long long)(s1.prefix_query_tokens - s0.prefix_query_tokens),
	       (unsigned long long)(s1.prefix_hit_tokens - s0.prefix_hit_tokens),
	       (unsigned long long)(s1.cow_copies - s0.cow_copies));
	printf("  \"lost\": %d, \"corrupted\": %d, \"solo_failed\": %d, \"compared\": %s,\n", lost, corrupted, solo_failed,
	       solo ? "true" : "false");
	printf("  \"before\": {\"pages_used\": %llu, \"pages_swapped\": %llu, \"clients\": %llu, \"fds\": %d, \"memfds\": %d},\n",
	       (unsigned long long)s0.pages_used, (unsigned long long)(s0.pages_swapped - s0.pages_demoted), (unsigned long long)s0.clients,
	       f0.fds, f0.memfds);
	printf("  \"after\": {\"pages_used\": %llu, \"pages_swapped\": %llu, \"clients\": %llu, \"fds\": %d, \"memfds\": %d},\n",
	       (unsigned long long)s2.pages_used, (unsigned long long)(s2.pages_swapped - s2.pages_demoted), (unsigned long long)s2.clients,
	       f1.fds, f1.memfds);
	printf("  \"baseline_restored\": %s\n}\n", baseline ? "true" : "false");

	for (int i = 0; i < n_total; i++) {
		free(reqs[i].prompt);
		free(reqs[i].text);
		free(reqs[i].solo_text);
	}
	free(reqs);
	free(ttft.v);
	free(ttft_daemon.v);
	free(itl.v);
	free(gap.v);
	kvc_close(ctl);
	return lost || corrupted || solo_failed || !baseline ? 1 : 0;
usage:
	fprintf(stderr, "usage: load_bench --socket PATH [--pid PID] [--clients N] [--requests N] [--seed S]\n"
			"                  [--prompt-words LO:HI] [--max-tokens LO:HI] [--no-solo] [--tenants N]\n");
	return 2;
}
