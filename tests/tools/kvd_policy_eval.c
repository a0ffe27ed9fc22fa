/*
 * tests/tools/kvd_policy_eval.c — the quality of kvd's cache policies,
 * measured through its own engine, for the evaluation reports
 * (bench/eval/report.py).
 *
 * One token stream (teacher-forced) is fed to a reference engine (f32 K/V,
 * full attention) and to one engine per --run, in lockstep, each step cut
 * where any run's window policy must evict first, so every run sees the
 * same tokens in the same steps. At every scored position each run's
 * next-token distribution is compared with the reference's: the negative
 * log-likelihood of the true next token under both, KL(p_ref || p_run) in
 * nats, and whether the argmax is the same. A run is TYPE/POLICY[/W[/S]]:
 *
 *   full                 every token kept (the stream must fit the context)
 *   window/W             sliding window of W tokens (kvd_engine_window_prepare)
 *   sinks/W/S            S attention-sink tokens (whole pages) plus the window
 *   truncate/W           at most W tokens: when full, the oldest half is cut
 *                        and the rest recomputed in a fresh sequence (what
 *                        truncate-oldest does with a chat's oldest turns)
 *
 * Per run one JSON line goes to stdout: the KV bytes per token and per page,
 * the most pool bytes it held, the mean K/V bytes a scored position's step
 * read (every layer reads its window of the sequence: Gemma 3's local
 * layers at most their window), the mean and most K/V slots held, and the
 * sums, and the layer groups (window, layers) with the K/V bytes each holds
 * at the run's longest sequence. --rows FILE gets
 * "run,pos,nll,nll_ref,kl,top1,hit" per scored position (pos: the index of
 * the predicted token; top1: the argmax is the reference's; hit: the argmax
 * is the true next token).
 *
 * --prefix-check P instead measures prefix sharing: per --types type, a
 * request whose first P tokens are served from pages another request left
 * in the prefix cache, against the same request computed alone, comparing
 * every logits row after the prefix bit for bit.
 *
 * --tokenize FILE prints the model's token ids of each part of a text (parts
 * separated by the byte 0x1e; one comma-separated line per part, BOS before
 * the first unless --no-bos), for scripts that build streams from parts.
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/engine.h"
#include "kvmm.h"
#include "model.h"
#include "tokenizer.h"
#include "tool_util.h"

#define MAX_RUNS 24
#define BS 16

static const char usage[] =
	"usage: kvd_policy_eval --model PATH --tokens-file FILE [--run TYPE/POLICY[/W[/S]]]...\n"
	"                       [--score A-B,...] [--rows FILE] [--chunk N] [--threads N]\n"
	"       kvd_policy_eval --model PATH --tokens-file FILE --prefix-check P [--types f16,...]\n"
	"       kvd_policy_eval --model PATH --tokenize FILE [--no-bos]\n";

struct run {
	char spec[64];
	enum kvd_kv_type type;
	int mode; /* 0 full, 1 window, 2 sinks, 3 truncate */
	long window, sinks;
	struct kvd_window w;
	struct kvd_engine *e;
	uint32_t seq, len, pages_max;
	size_t page_bytes, tok_bytes;
	double nll, nll_ref, kl, kl_max, read_bytes, slots;
	long n, top1, slots_max, restarts;
};


/* Print the token ids of each part of the file (parts separated by the
 * byte 0x1e), one line each; BOS before the first part when bos. */
static int tokenize_file(const struct kvd_tokenizer *tk, const char *path, int bos)
{
	FILE *f = fopen(path, "rb");
	char *buf = NULL;
	int32_t *ids = NULL;
	long len;
	int n = -EIO;

	if (!f)
		return -errno;
	if (fseek(f, 0, SEEK_END) == 0 && (len = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0 &&
	    (buf = malloc((size_t)len + 1)) && fread(buf, 1, (size_t)len, f) == (size_t)len) {
		buf[len] = 0x1e;
		for (char *p = buf, *end; p <= buf + len; p = end + 1) {
			end = memchr(p, 0x1e, (size_t)(buf + len - p) + 1);
			n = kvd_tokenize(tk, p, (size_t)(end - p), bos && p == buf, 0, NULL, 0);
			free(ids);
			ids = n >= 0 ? malloc(sizeof(int32_t) * (size_t)(n + 1)) : NULL;
			if (n < 0 || !ids) {
				n = n < 0 ? n : -ENOMEM;
				break;
			}
			n = kvd_tokenize(tk, p, (size_t)(end - p), bos && p == buf, 0, ids, n);
			for (int i = 0; i < n; i++)
				printf("%s%d", i ? "," : "", ids[i]);
			printf("\n");
		}
	}
	free(buf);
	free(ids);
	fclose(f);
	return n < 0 ? n : 0;
}

/* log-softmax of x (n) into y */
static void log_softmax(const float *x, float *y, int n)
{
	double m = x[0], s = 0;

	for (int i = 1; i < n; i++)
		if (x[i] > m)
			m = x[i];
	for (int i = 0; i < n; i++)
		s += exp((double)x[i] - m);
	s = m + log(s);
	for (int i = 0; i < n; i++)
		y[i] = (float)((double)x[i] - s);
}


static int parse_run(const char *s, struct run *r)
{
	char buf[64], *pol, *a, *b;

	if (strlen(s) >= sizeof(buf))
		return -EINVAL;
	snprintf(r->spec, sizeof(r->spec), "%s", s);
	snprintf(buf, sizeof(buf), "%s", s);
	pol = strchr(buf, '/');
	if (!pol)
		return -EINVAL;
	*pol++ = 0;
	if (kvd_kv_type_parse(buf, &r->type) < 0)
		return -EINVAL;
	a = strchr(pol, '/');
	if (a)
		*a++ = 0;
	b = a ? strchr(a, '/') : NULL;
	if (b)
		*b++ = 0;
	r->window = a ? atol(a) : 0;
	r->sinks = b ? atol(b) : 0;
	r->mode = !strcmp(pol, "full") ? 0 : !strcmp(pol, "window") ? 1 : !strcmp(pol, "sinks") ? 2 :
		  !strcmp(pol, "truncate") ? 3 : -1;
	if (r->mode < 0 || (r->mode && r->window < 2 * BS) || (r->mode == 2 && r->sinks < 1) || (r->mode == 3 && r->window < 4 * BS))
		return -EINVAL;
	if (r->mode == 1 || r->mode == 2)
		return kvd_window_make(BS, 1u << 20, r->mode == 2, (uint32_t)r->sinks, (uint32_t)r->window, &r->w);
	return 0;
}

static int open_engine(const char *model, int threads, enum kvd_kv_type t, long tokens, int prefix,
		       struct kvd_engine **ret, char *err, size_t errlen)
{
	struct kvd_model *m = NULL;
	struct kvd_kv_layout l;
	int r = kvd_model_load(model, &m, err, errlen);

	if (r < 0)
		return r;
	r = kvd_kv_layout_init_type(&l, kvd_model_hparams(m), BS, t);
	kvd_model_free(m);
	if (r < 0) {
		snprintf(err, errlen, "KV type %s does not fit this model", kvd_kv_type_name(t));
		return r;
	}
	struct kvd_engine_config ec = {
		.model_path = model, .backend = "cpu", .n_threads = threads, .block_size = BS, .kv_type = t,
		.kv_pool_bytes = (uint64_t)((tokens + BS - 1) / BS * 2 + 8) * l.page_bytes, .max_seqs = 4,
		.prefix_cache = prefix,
	};
	return kvd_engine_open(&ec, ret, err, errlen);
}

/* K/V bytes one step at sequence length len reads: every layer its window
 * of the sequence (0: all of it). */
static double read_bytes(const struct kvd_engine *e, size_t tok_bytes, uint32_t len)
{
	const struct kvd_model *md = kvd_engine_model(e);
	const struct kvd_model_weights *w = kvd_model_weights(md);
	int32_t nl = kvd_model_hparams(md)->n_layer;
	double s = 0;

	for (int32_t i = 0; i < nl; i++) {
		int32_t win = w && w->layers ? w->layers[i].d.window : 0;
		s += win > 0 && (uint32_t)win < len ? (double)win : (double)len;
	}
	return s * (double)tok_bytes / nl;
}

/* Append n tokens to seq without logits, 64 a step. */
static int prefill(struct kvd_engine *e, uint32_t seq, const int32_t *toks, uint32_t n)
{
	for (uint32_t k = 0; k < n;) {
		uint32_t c = n - k < 64 ? n - k : 64;
		struct kvd_engine_item it = { .seq = seq, .tokens = toks + k, .n_tokens = (int32_t)c };
		int rc = kvd_engine_step(e, &it, 1);

		if (rc < 0)
			return rc;
		k += c;
	}
	return 0;
}

/* Room for `want` more tokens in r's sequence. A full truncate run first
 * starts again from its head (the first TRUNC_HEAD tokens, kept for ever as
 * truncate-oldest keeps a chat's system block, BOS included) and the newest
 * tokens up to half the window, recomputed. */
#define TRUNC_HEAD BS
static int prepare(struct run *r, const int32_t *stream, long t, uint32_t want, uint32_t *room)
{
	struct kvmm *kv = kvd_engine_kvmm(r->e);
	uint32_t W = (uint32_t)r->window, keep = W / 2 - TRUNC_HEAD;
	int rc;

	*room = want;
	if (r->mode == 1 || r->mode == 2)
		return kvd_engine_window_prepare(r->e, r->seq, &r->w, want, room, NULL);
	if (r->mode != 3)
		return 0;
	if (r->len >= W) {
		kvmm_seq_free(kv, r->seq);
		rc = kvmm_seq_new(kv, &r->seq);
		if (rc < 0)
			return rc;
		rc = prefill(r->e, r->seq, stream, TRUNC_HEAD);
		if (rc >= 0)
			rc = prefill(r->e, r->seq, stream + t - keep, keep);
		if (rc < 0)
			return rc;
		r->len = TRUNC_HEAD + keep;
		r->restarts++;
	}
	if (*room > W - r->len)
		*room = W - r->len;
	return 0;
}

static int in_score(const long *sc, int n_sc, long pos)
{
	if (!n_sc)
		return 1;
	for (int i = 0; i < n_sc; i++)
		if (pos >= sc[2 * i] && pos <= sc[2 * i + 1])
			return 1;
	return 0;
}

static int feed(struct kvd_engine *e, uint32_t seq, const int32_t *toks, long from, long to, long chunk, float *rows,
		int32_t nv, FILE *keep)
{
	for (long t = from; t < to;) {
		long c = to - t < chunk ? to - t : chunk;
		struct kvd_engine_item it = { .seq = seq, .tokens = toks + t, .n_tokens = (int32_t)c, .logits = rows,
					      .all_logits = 1 };
		int r = kvd_engine_step(e, &it, 1);
		if (r < 0)
			return r;
		if (keep && fwrite(rows, sizeof(float) * (size_t)nv, (size_t)c, keep) != (size_t)c)
			return -EIO;
		t += c;
	}
	return 0;
}

/* The prefix check for one type: 0 and one JSON line, or an error. */
static int prefix_check(const char *model, int threads, enum kvd_kv_type t, const int32_t *s, long n, long P,
			long chunk)
{
	char err[512];
	struct kvd_engine *e = NULL, *alone = NULL;
	long na = P + 64 < n ? P + 64 : n, nb = n - na < 160 ? n - na : 160, len = P + nb;
	int32_t *b = malloc(sizeof(int32_t) * (size_t)len);
	int32_t nv = 0;
	float *rows = NULL;
	FILE *f1 = tmpfile(), *f2 = tmpfile();
	uint32_t sa, sb, sc, hit = 0;
	long same = 0, cmp = 0;
	double dmax = 0;
	int r = -ENOMEM;

	if (!b || !f1 || !f2 || nb < 1 || P < BS)
		goto out;
	memcpy(b, s, sizeof(int32_t) * (size_t)P);
	memcpy(b + P, s + na, sizeof(int32_t) * (size_t)nb);
	if ((r = open_engine(model, threads, t, n + len, 1, &e, err, sizeof(err))) < 0 ||
	    (r = open_engine(model, threads, t, len, 0, &alone, err, sizeof(err))) < 0) {
		fprintf(stderr, "kvd_policy_eval: %s\n", err);
		goto out;
	}
	nv = kvd_engine_n_vocab(e);
	rows = malloc(sizeof(float) * (size_t)nv * (size_t)chunk);
	r = -ENOMEM;
	if (!rows)
		goto out;
	/* a: the first request, left in the prefix cache */
	if ((r = kvmm_seq_new(kvd_engine_kvmm(e), &sa)) < 0 || (r = feed(e, sa, s, 0, na, chunk, rows, nv, NULL)) < 0)
		goto out;
	kvmm_seq_free(kvd_engine_kvmm(e), sa);
	/* b: the same first P tokens, then another text; from the cache */
	if ((r = kvmm_seq_new(kvd_engine_kvmm(e), &sb)) < 0 ||
	    (r = kvmm_prefix_attach(kvd_engine_kvmm(e), sb, b, (uint32_t)len, &hit)) < 0 ||
	    (r = feed(e, sb, b, hit, len, chunk, rows, nv, f1)) < 0)
		goto out;
	/* b alone, in a fresh engine without a prefix cache */
	if ((r = kvmm_seq_new(kvd_engine_kvmm(alone), &sc)) < 0 ||
	    (r = feed(alone, sc, b, 0, len, chunk, rows, nv, f2)) < 0)
		goto out;
	/* rows after position hit - 1 exist in both: compare from P on */
	rewind(f1);
	rewind(f2);
	float *x = rows, *y = rows + (chunk > 1 ? nv : 0);
	float *tmp = chunk > 1 ? NULL : malloc(sizeof(float) * (size_t)nv);
	if (chunk == 1 && !tmp)
		goto out;
	if (tmp)
		y = tmp;
	for (long p = 0; p < len; p++) {
		int in1 = p >= (long)hit, ok = 1;
		if (in1 && fread(x, sizeof(float), (size_t)nv, f1) != (size_t)nv)
			ok = 0;
		if (fread(y, sizeof(float), (size_t)nv, f2) != (size_t)nv)
			ok = 0;
		if (!ok) {
			r = -EIO;
			free(tmp);
			goto out;
		}
		if (!in1 || p < P - 1)
			continue;
		cmp++;
		same += memcmp(x, y, sizeof(float) * (size_t)nv) == 0;
		for (int32_t v = 0; v < nv; v++)
			if (fabs((double)x[v] - y[v]) > dmax)
				dmax = fabs((double)x[v] - y[v]);
	}
	free(tmp);
	printf("{\"type\":\"%s\",\"prefix_tokens\":%ld,\"hit_tokens\":%u,\"request_tokens\":%ld,\"compared_rows\":%ld,"
	       "\"identical_rows\":%ld,\"max_abs_diff\":%.9g}\n", kvd_kv_type_name(t), P, hit, len, cmp, same, dmax);
	r = 0;
out:
	if (r < 0 && r != -ENOMEM)
		fprintf(stderr, "kvd_policy_eval: prefix check (%s): %s\n", kvd_kv_type_name(t), strerror(-r));
	kvd_engine_close(e);
	kvd_engine_close(alone);
	if (f1)
		fclose(f1);
	if (f2)
		fclose(f2);
	free(rows);
	free(b);
	return r;
}

static int parse_ranges(const char *s, long **ret, int *ret_n)
{
	int n = 0;
	long *v = calloc(strlen(s) + 2, sizeof(long));

	if (!v)
		return -ENOMEM;
	while (*s) {
		char *end;
		v[2 * n] = strtol(s, &end, 10);
		if (end == s || *end != '-') {
			free(v);
			return -EINVAL;
		}
		s = end + 1;
		v[2 * n + 1] = strtol(s, &end, 10);
		if (end == s || v[2 * n + 1] < v[2 * n]) {
			free(v);
			return -EINVAL;
		}
		n++;
		s = *end == ',' ? end + 1 : end;
	}
	*ret = v;
	*ret_n = n;
	return 0;
}

static void groups(const struct run *r);

static void summary(const struct run *r)
{
	if (!r->e) {
		printf("{\"run\":\"%s\",\"error\":\"not run\"}\n", r->spec);
		return;
	}
	printf("{\"run\":\"%s\",\"kv_type\":\"%s\",\"policy\":\"%s\",\"window\":%ld,\"sinks\":%ld,"
	       "\"kv_bytes_per_token\":%zu,\"page_bytes\":%zu,\"kv_bytes_peak\":%zu,\"kv_slots_mean\":%.2f,"
	       "\"kv_slots_max\":%ld,\"read_bytes_per_token\":%.1f,\"scored\":%ld,\"ppl\":%.6f,\"ppl_ref\":%.6f,"
	       "\"kl_mean\":%.8f,\"kl_max\":%.6f,\"top1\":%.6f,\"restarts\":%ld",
	       r->spec, kvd_kv_type_name(r->type), (const char *[]){"full", "window", "sinks", "truncate"}[r->mode],
	       r->window, r->mode == 2 ? (long)r->w.sink_pages * BS : 0, r->tok_bytes, r->page_bytes,
	       (size_t)r->pages_max * r->page_bytes, r->n ? r->slots / r->n : 0.0, r->slots_max,
	       r->n ? r->read_bytes / r->n : 0.0, r->n, r->n ? exp(r->nll / r->n) : 0.0,
	       r->n ? exp(r->nll_ref / r->n) : 0.0, r->n ? r->kl / r->n : 0.0, r->kl_max,
	       r->n ? (double)r->top1 / r->n : 0.0, r->restarts);
	groups(r);
	printf("}\n");
}

/* The layer groups by attention window and the K/V bytes each holds at
 * slots tokens, as one JSON member (no trailing newline). */
static void groups(const struct run *r)
{
	const struct kvd_model *md = kvd_engine_model(r->e);
	const struct kvd_model_weights *w = kvd_model_weights(md);
	int32_t nl = kvd_model_hparams(md)->n_layer, win[8];
	uint32_t cnt[8], ng = 0;

	for (int32_t i = 0; i < nl; i++) {
		int32_t x = w && w->layers ? w->layers[i].d.window : 0;
		uint32_t g = 0;
		while (g < ng && win[g] != x)
			g++;
		if (g == 8)
			continue;
		if (g == ng) {
			win[ng] = x;
			cnt[ng++] = 0;
		}
		cnt[g]++;
	}
	printf(",\"layer_groups\":[");
	for (uint32_t g = 0; g < ng; g++) {
		long held = win[g] > 0 && win[g] < r->slots_max ? win[g] : r->slots_max;
		printf("%s{\"window\":%d,\"layers\":%u,\"kv_bytes\":%.0f}", g ? "," : "", win[g], cnt[g],
		       (double)held * cnt[g] * (double)r->tok_bytes / nl);
	}
	printf("]");
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{"model", required_argument, 0, 'm'}, {"tokens-file", required_argument, 0, 't'},
		{"run", required_argument, 0, 'r'},   {"score", required_argument, 0, 's'},
		{"rows", required_argument, 0, 'o'},  {"chunk", required_argument, 0, 'c'},
		{"threads", required_argument, 0, 'j'}, {"prefix-check", required_argument, 0, 'P'},
		{"types", required_argument, 0, 'T'}, {"tokenize", required_argument, 0, 'k'},
		{"no-bos", no_argument, 0, 'B'},      {"help", no_argument, 0, 'h'},
		{0, 0, 0, 0},
	};
	static struct run runs[MAX_RUNS + 1];
	const char *model = NULL, *tokfile = NULL, *score = NULL, *rows_path = NULL, *types = "f32,f16,bf16,q8_0,q4_0";
	const char *tok_text = NULL;
	long chunk = 32, threads = 2, prefix = -1, *sc = NULL;
	int n_runs = 1, n_sc = 0, o, rc = 1, no_bos = 0, n = 0;
	int32_t *toks = NULL, nv;
	float *ref = NULL, *buf = NULL, *lsm = NULL;
	FILE *rows = NULL;
	char err[512];

	while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (o) {
		case 'm': model = optarg; break;
		case 't': tokfile = optarg; break;
		case 'r':
			if (n_runs > MAX_RUNS || parse_run(optarg, &runs[n_runs]) < 0) {
				fprintf(stderr, "kvd_policy_eval: bad or too many --run '%s'\n", optarg);
				return 2;
			}
			n_runs++;
			break;
		case 's': score = optarg; break;
		case 'o': rows_path = optarg; break;
		case 'c': chunk = atol(optarg); break;
		case 'j': threads = atol(optarg); break;
		case 'P': prefix = atol(optarg); break;
		case 'T': types = optarg; break;
		case 'k': tok_text = optarg; break;
		case 'B': no_bos = 1; break;
		case 'h': fputs(usage, stdout); return 0;
		default: fputs(usage, stderr); return 2;
		}
	}
	if (!model || (!tokfile && !tok_text) || chunk < 1 || chunk > 512 || (score && parse_ranges(score, &sc, &n_sc) < 0)) {
		fputs(usage, stderr);
		return 2;
	}
	if (tok_text) {
		struct kvd_model *m = NULL;
		if (kvd_model_load(model, &m, err, sizeof(err)) < 0) {
			fprintf(stderr, "kvd_policy_eval: %s\n", err);
			return 1;
		}
		int r = tokenize_file(kvd_model_tokenizer(m), tok_text, !no_bos && kvd_tokenizer_add_bos(kvd_model_tokenizer(m)));
		kvd_model_free(m);
		if (r < 0)
			fprintf(stderr, "kvd_policy_eval: %s: %s\n", tok_text, strerror(-r));
		return r < 0;
	}
	if (tool_read_ids(tokfile, &toks, &n) < 0 || n < 2) {
		fprintf(stderr, "kvd_policy_eval: cannot read token ids from %s\n", tokfile);
		goto out;
	}
	if (prefix >= 0) {
		char tl[128];
		snprintf(tl, sizeof(tl), "%s", types);
		rc = 0;
		for (char *sp = NULL, *tn = strtok_r(tl, ",", &sp); tn; tn = strtok_r(NULL, ",", &sp)) {
			enum kvd_kv_type t;
			if (kvd_kv_type_parse(tn, &t) < 0 || prefix_check(model, (int)threads, t, toks, n, prefix, chunk) < 0)
				rc = 1;
		}
		goto out;
	}
	runs[0] = (struct run){ .spec = "f32/full", .type = KVD_KV_F32 };
	for (int i = 0; i < n_runs; i++) {
		struct run *r = &runs[i];
		long need = r->mode ? r->window + r->sinks + 4 * BS : n;
		if (open_engine(model, (int)threads, r->type, need, 0, &r->e, err, sizeof(err)) < 0 ||
		    kvmm_seq_new(kvd_engine_kvmm(r->e), &r->seq) < 0) {
			fprintf(stderr, "kvd_policy_eval: %s: %s\n", r->spec, err);
			r->e = kvd_engine_close(r->e);
			if (i == 0)
				goto out;
			continue;
		}
		if ((r->mode == 1 || r->mode == 2) && !kvd_engine_can_shift(r->e)) {
			fprintf(stderr, "kvd_policy_eval: %s: %s\n", r->spec, kvd_engine_shift_refusal(r->e, err, sizeof(err)));
			r->e = kvd_engine_close(r->e);
			continue;
		}
		r->page_bytes = kvd_engine_kv_layout(r->e)->page_bytes;
		r->tok_bytes = r->page_bytes / BS;
	}
	nv = kvd_engine_n_vocab(runs[0].e);
	ref = malloc(sizeof(float) * (size_t)nv * (size_t)chunk);
	buf = malloc(sizeof(float) * (size_t)nv * (size_t)chunk);
	lsm = malloc(sizeof(float) * (size_t)nv);
	if (!ref || !buf || !lsm || (rows_path && !(rows = fopen(rows_path, "w"))))
		goto out;
	if (rows)
		fprintf(rows, "run,pos,nll,nll_ref,kl,top1,hit\n");
	for (long t = 0; t < n - 1;) {
		uint32_t want = (uint32_t)(n - 1 - t < chunk ? n - 1 - t : chunk), c = want;
		int scored = 0;
		/* cut at the edges of the scored ranges */
		for (uint32_t j = 0; j < want; j++)
			if (j && in_score(sc, n_sc, t + j + 1) != in_score(sc, n_sc, t + j)) {
				want = j;
				break;
			}
		scored = in_score(sc, n_sc, t + 1);
		c = want;
		for (int i = 1; i < n_runs; i++) {
			uint32_t room;
			if (!runs[i].e)
				continue;
			int pr = prepare(&runs[i], toks, t, c, &room);
			if (pr < 0) {
				fprintf(stderr, "kvd_policy_eval: %s: window or restart at %ld: %s\n", runs[i].spec, t,
					strerror(-pr));
				goto out;
			}
			if (room < c)
				c = room;
		}
		for (int i = 0; i < n_runs; i++) {
			struct run *r = &runs[i];
			if (!r->e)
				continue;
			/* a window policy drops pages itself: no release of local layers' */
			struct kvd_engine_item it = { .seq = r->seq, .tokens = toks + t, .n_tokens = (int32_t)c,
						      .logits = i ? buf : ref, .all_logits = scored,
						      .keep_local = r->mode == 1 || r->mode == 2 };
			if (kvd_engine_step(r->e, &it, 1) < 0) {
				fprintf(stderr, "kvd_policy_eval: %s: step at %ld failed\n", r->spec, t);
				goto out;
			}
			struct kvmm_stats st;
			kvmm_get_stats(kvd_engine_kvmm(r->e), &st);
			if (st.pages_used > r->pages_max)
				r->pages_max = st.pages_used;
			struct kvmm_seq_record rec;
			kvmm_seq_ledger(kvd_engine_kvmm(r->e), r->seq, &rec);
			r->len = rec.len_tokens;
			if (!scored)
				continue;
			if (i == 0) {
				for (uint32_t j = 0; j < c; j++)
					log_softmax(ref + (size_t)j * nv, ref + (size_t)j * nv, nv);
			}
			for (uint32_t j = 0; j < c; j++) {
				const float *pr = ref + (size_t)j * nv;
				int32_t next = toks[t + j + 1];
				double kl = 0;
				if (i) {
					log_softmax(buf + (size_t)j * nv, lsm, nv);
					for (int32_t v = 0; v < nv; v++)
						kl += exp((double)pr[v]) * ((double)pr[v] - lsm[v]);
				} else {
					memcpy(lsm, pr, sizeof(float) * (size_t)nv);
				}
				if (kl < 0)
					kl = 0;
				/* the slots this position's token attended: the length after it */
				uint32_t slots = r->len - (c - 1 - j);
				r->nll += -lsm[next];
				r->nll_ref += -pr[next];
				r->kl += kl;
				if (kl > r->kl_max)
					r->kl_max = kl;
				r->top1 += tool_argmax(lsm, nv) == tool_argmax(pr, nv);
				r->slots += slots;
				if ((long)slots > r->slots_max)
					r->slots_max = slots;
				r->read_bytes += read_bytes(r->e, r->tok_bytes, slots);
				r->n++;
				if (rows)
					fprintf(rows, "%s,%ld,%.6f,%.6f,%.8f,%d,%d\n", r->spec, t + j + 1, -lsm[next], -pr[next], kl,
						tool_argmax(lsm, nv) == tool_argmax(pr, nv), tool_argmax(lsm, nv) == next);
			}
		}
		t += c;
	}
	for (int i = 0; i < n_runs; i++)
		summary(&runs[i]);
	rc = 0;
out:
	if (rows && fclose(rows) != 0)
		rc = 1;
	for (int i = 0; i < n_runs; i++)
		kvd_engine_close(runs[i].e);
	free(toks);
	free(sc);
	free(ref);
	free(buf);
	free(lsm);
	return rc;
}
