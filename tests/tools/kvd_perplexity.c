/*
 * tests/tools/kvd_perplexity.c — the quality of each KV element type,
 * measured through kvd's own engine: perplexity over a text, and the
 * divergence of every next-token distribution from the f32 cache's.
 *
 * The text is tokenized by the model's tokenizer and cut into windows of
 * --ctx tokens (as llama.cpp's perplexity tool does): each window is a
 * fresh sequence whose first half is context only, and whose second half
 * is scored, every token predicted from all the window's tokens before it.
 * One engine per type runs the same windows; f32 is always run first and
 * is the reference. Per type the tool reports
 *
 *   bytes/token   the KV bytes one token costs (page bytes / block size)
 *   ppl           exp(mean negative log-likelihood of the scored tokens)
 *   kl_mean/max   KL(p_f32 || p_type) over the scored positions, in nats
 *   top1          the share of positions whose argmax equals f32's
 *
 * as a table, or one JSON object per type with --json. --max-kl TYPE=B
 * (repeatable) makes the exit status 1 when a type's mean KL exceeds B.
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

#define MAX_TYPES 5 /* every enum kvd_kv_type, indexed by its value */
#define PIECE 32 /* scored positions computed per step */

static const char usage[] =
	"usage: kvd_perplexity --model PATH --text FILE [--types f16,bf16,q8_0,q4_0] [--ctx N]\n"
	"                      [--max-tokens N] [--threads N] [--json] [--max-kl TYPE=BOUND]...\n"
	"\n"
	"Perplexity of the text and KL divergence from the f32 KV cache, per KV type\n"
	"(f32, the reference, is always computed). --ctx: tokens per window (default\n"
	"1024; the second half of each is scored); --max-tokens: use at most this\n"
	"many tokens of the text (default all).\n";

struct typerun {
	enum kvd_kv_type type;
	struct kvd_engine *e;
	size_t bytes_per_token;
	double nll, kl_sum, kl_max;
	long n, top1;
	float *rows; /* PIECE + 1 rows of logits */
};

/* log-softmax of x (n) into y, in double */
static void log_softmax(const float *x, double *y, int n)
{
	double m = x[0], s = 0;
	for (int i = 1; i < n; i++)
		if (x[i] > m)
			m = x[i];
	for (int i = 0; i < n; i++)
		s += exp((double)x[i] - m);
	double ls = m + log(s);
	for (int i = 0; i < n; i++)
		y[i] = (double)x[i] - ls;
}

static int argmax_d(const double *x, int n)
{
	int b = 0;
	for (int i = 1; i < n; i++)
		if (x[i] > x[b])
			b = i;
	return b;
}


/* Run one window of tokens through engine tr, scoring positions [h, ctx):
 * the rows of logits predicting tokens h .. ctx - 1 come in pieces, and
 * score() is called per piece with the rows. */
struct window {
	const int32_t *toks;
	int ctx, h;
};

/* Prefill the context part of a window: tokens 0 .. h - 2, no logits. */
static int window_start(struct typerun *tr, const struct window *w, uint32_t *ret_seq)
{
	struct kvmm *kv = kvd_engine_kvmm(tr->e);
	int r = kvmm_seq_new(kv, ret_seq);
	if (r < 0)
		return r;
	struct kvd_engine_item it = {.seq = *ret_seq, .tokens = w->toks, .n_tokens = w->h - 1};
	return kvd_engine_step(tr->e, &it, 1);
}

/* The rows for positions p0 .. p0 + n - 1 (each predicting the token after it). */
static int window_piece(struct typerun *tr, const struct window *w, uint32_t seq, int p0, int n)
{
	struct kvd_engine_item it = {
		.seq = seq, .tokens = w->toks + p0, .n_tokens = n, .all_logits = 1, .logits = tr->rows,
	};
	return kvd_engine_step(tr->e, &it, 1);
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{"model", required_argument, 0, 'm'}, {"text", required_argument, 0, 'f'},
		{"types", required_argument, 0, 'T'}, {"ctx", required_argument, 0, 'c'},
		{"max-tokens", required_argument, 0, 'n'}, {"threads", required_argument, 0, 'j'},
		{"json", no_argument, 0, 'J'}, {"max-kl", required_argument, 0, 'K'},
		{"help", no_argument, 0, 'h'}, {0, 0, 0, 0},
	};
	const char *model = NULL, *text = NULL, *types = "f16,q8_0,q4_0";
	int ctx = 1024, max_tokens = 0, threads = 0, json = 0, c, rc = 1;
	double max_kl[MAX_TYPES] = {0};
	int have_max_kl[MAX_TYPES] = {0};
	struct typerun tr[MAX_TYPES];
	int n_types = 0;

	memset(tr, 0, sizeof(tr));
	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (c) {
		case 'm': model = optarg; break;
		case 'f': text = optarg; break;
		case 'T': types = optarg; break;
		case 'c': ctx = atoi(optarg); break;
		case 'n': max_tokens = atoi(optarg); break;
		case 'j': threads = atoi(optarg); break;
		case 'J': json = 1; break;
		case 'K': {
			char name[16], *eq = strchr(optarg, '=');
			enum kvd_kv_type t;
			if (!eq || eq - optarg >= (long)sizeof(name)) {
				fprintf(stderr, "kvd_perplexity: --max-kl TYPE=BOUND, not '%s'\n", optarg);
				return 2;
			}
			memcpy(name, optarg, (size_t)(eq - optarg));
			name[eq - optarg] = 0;
			if (kvd_kv_type_parse(name, &t) < 0 || (unsigned)t >= MAX_TYPES) {
				fprintf(stderr, "kvd_perplexity: --max-kl: unknown type '%s'\n", name);
				return 2;
			}
			max_kl[t] = atof(eq + 1);
			have_max_kl[t] = 1;
			break;
		}
		case 'h': fputs(usage, stdout); return 0;
		default: fputs(usage, stderr); return 2;
		}
	}
	if (!model || !text || ctx < 8 || ctx % 2 || max_tokens < 0) {
		fputs(usage, stderr);
		return 2;
	}
	/* f32 first, then the requested types in order, each once */
	tr[n_types++].type = KVD_KV_F32;
	{
		char buf[64], *save = NULL;
		snprintf(buf, sizeof(buf), "%s", types);
		for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
			enum kvd_kv_type t;
			int dup = 0;
			if (kvd_kv_type_parse(tok, &t) < 0) {
				fprintf(stderr, "kvd_perplexity: --types: unknown type '%s'\n", tok);
				return 2;
			}
			for (int i = 0; i < n_types; i++)
				dup |= tr[i].type == t;
			if (!dup && (unsigned)t >= MAX_TYPES) {
				fprintf(stderr, "kvd_perplexity: --types: '%s' is not measured by this build\n", tok);
				return 2;
			}
			if (!dup)
				tr[n_types++].type = t;
		}
	}

	char err[512];
	struct kvd_model *m;
	if (kvd_model_load(model, &m, err, sizeof(err)) < 0) {
		fprintf(stderr, "kvd_perplexity: %s\n", err);
		return 1;
	}
	size_t len = 0;
	char *buf = tool_read_file(text, KVD_TOKENIZE_MAX_BYTES, &len);
	if (!buf) {
		fprintf(stderr, "kvd_perplexity: %s: cannot read (or over %u bytes)\n", text, KVD_TOKENIZE_MAX_BYTES);
		kvd_model_free(m);
		return 1;
	}
	const struct kvd_tokenizer *tk = kvd_model_tokenizer(m);
	int n_tok = kvd_tokenize(tk, buf, len, kvd_tokenizer_add_bos(tk), 0, NULL, 0);
	int32_t *toks = n_tok > 0 ? malloc(sizeof(int32_t) * (size_t)n_tok) : NULL;
	if (toks)
		n_tok = kvd_tokenize(tk, buf, len, kvd_tokenizer_add_bos(tk), 0, toks, (size_t)n_tok);
	free(buf);
	int n_vocab = kvd_model_hparams(m)->n_vocab;
	struct kvd_hparams hp = *kvd_model_hparams(m);
	kvd_model_free(m);
	if (!toks || n_tok <= 0) {
		fprintf(stderr, "kvd_perplexity: %s: tokenize failed\n", text);
		free(toks);
		return 1;
	}
	int total = max_tokens && max_tokens < n_tok ? max_tokens : n_tok;
	int n_win = total / ctx;
	if (n_win < 1) {
		fprintf(stderr, "kvd_perplexity: %d tokens: fewer than one window of %d\n", total, ctx);
		free(toks);
		return 1;
	}

	double *lref = malloc(sizeof(double) * (size_t)n_vocab * (PIECE + 1));
	double *lq = malloc(sizeof(double) * (size_t)n_vocab);
	double *pref = malloc(sizeof(double) * (size_t)n_vocab);
	if (!lref || !lq || !pref)
		goto out;
	for (int i = 0; i < n_types; i++) {
		struct kvd_kv_layout l;
		if (kvd_kv_layout_init_type(&l, &hp, 16, tr[i].type) < 0) {
			fprintf(stderr, "kvd_perplexity: KV type %s does not fit this model\n", kvd_kv_type_name(tr[i].type));
			goto out;
		}
		struct kvd_engine_config ec = {
			.model_path = model, .backend = "cpu", .n_threads = threads, .block_size = 16,
			.kv_type = tr[i].type, .kv_pool_bytes = (uint64_t)(ctx / 16 + 4) * l.page_bytes,
			.max_seqs = 4, .prefix_cache = 0,
		};
		if (kvd_engine_open(&ec, &tr[i].e, err, sizeof(err)) < 0) {
			fprintf(stderr, "kvd_perplexity: %s\n", err);
			goto out;
		}
		const struct kvd_kv_layout *L = kvd_engine_kv_layout(tr[i].e);
		tr[i].bytes_per_token = L->page_bytes / L->block_size;
		tr[i].rows = malloc(sizeof(float) * (size_t)n_vocab * (PIECE + 1));
		if (!tr[i].rows)
			goto out;
	}

	for (int wi = 0; wi < n_win; wi++) {
		struct window w = {toks + (size_t)wi * ctx, ctx, ctx / 2};
		uint32_t seq[MAX_TYPES];
		for (int i = 0; i < n_types; i++)
			if (window_start(&tr[i], &w, &seq[i]) < 0) {
				fprintf(stderr, "kvd_perplexity: %s: step failed\n", kvd_kv_type_name(tr[i].type));
				goto out;
			}
		/* positions h - 1 .. ctx - 2 predict tokens h .. ctx - 1 */
		for (int p0 = w.h - 1; p0 < ctx - 1; p0 += PIECE) {
			int n = ctx - 1 - p0 < PIECE ? ctx - 1 - p0 : PIECE;
			for (int i = 0; i < n_types; i++) {
				if (window_piece(&tr[i], &w, seq[i], p0, n) < 0) {
					fprintf(stderr, "kvd_perplexity: %s: step failed\n", kvd_kv_type_name(tr[i].type));
					goto out;
				}
			}
			for (int j = 0; j < n; j++) {
				int next = w.toks[p0 + j + 1];
				double *lr = lref + (size_t)j * n_vocab;
				log_softmax(tr[0].rows + (size_t)j * n_vocab, lr, n_vocab);
				int top_ref = argmax_d(lr, n_vocab);
				for (int v = 0; v < n_vocab; v++)
					pref[v] = exp(lr[v]);
				tr[0].nll -= lr[next];
				tr[0].top1++;
				tr[0].n++;
				for (int i = 1; i < n_types; i++) {
					double kl = 0;
					log_softmax(tr[i].rows + (size_t)j * n_vocab, lq, n_vocab);
					for (int v = 0; v < n_vocab; v++)
						kl += pref[v] * (lr[v] - lq[v]);
					tr[i].nll -= lq[next];
					tr[i].kl_sum += kl;
					if (kl > tr[i].kl_max)
						tr[i].kl_max = kl;
					tr[i].top1 += argmax_d(lq, n_vocab) == top_ref;
					tr[i].n++;
				}
			}
		}
		for (int i = 0; i < n_types; i++)
			kvmm_seq_free(kvd_engine_kvmm(tr[i].e), seq[i]);
	}

	rc = 0;
	if (!json)
		printf("%s: %d tokens, %d used: %d window(s) of %d, %ld scored positions\n"
		       "%-6s %12s %10s %12s %12s %8s\n", text, n_tok, n_win * ctx, n_win, ctx, tr[0].n,
		       "type", "bytes/token", "ppl", "kl_mean", "kl_max", "top1");
	for (int i = 0; i < n_types; i++) {
		double ppl = exp(tr[i].nll / (double)tr[i].n), klm = tr[i].kl_sum / (double)tr[i].n;
		double top1 = (double)tr[i].top1 / (double)tr[i].n;
		if (json)
			printf("{\"type\":\"%s\",\"bytes_per_token\":%zu,\"tokens\":%d,\"ctx\":%d,\"scored\":%ld,"
			       "\"ppl\":%.6f,\"kl_mean\":%.6g,\"kl_max\":%.6g,\"top1\":%.6f}\n",
			       kvd_kv_type_name(tr[i].type), tr[i].bytes_per_token, total, ctx, tr[i].n, ppl, klm,
			       tr[i].kl_max, top1);
		else
			printf("%-6s %12zu %10.4f %12.6f %12.6f %8.4f\n", kvd_kv_type_name(tr[i].type),
			       tr[i].bytes_per_token, ppl, klm, tr[i].kl_max, top1);
		if (have_max_kl[tr[i].type] && !(klm <= max_kl[tr[i].type])) {
			fprintf(stderr, "kvd_perplexity: %s: mean KL %.6g exceeds %.6g\n", kvd_kv_type_name(tr[i].type),
				klm, max_kl[tr[i].type]);
			rc = 1;
		}
	}
out:
	for (int i = 0; i < n_types; i++) {
		kvd_engine_close(tr[i].e);
		free(tr[i].rows);
	}
	free(lref);
	free(lq);
	free(pref);
	free(toks);
	return rc;
}
