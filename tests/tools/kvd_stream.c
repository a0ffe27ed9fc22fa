/*
 * tests/tools/kvd_stream.c — feed one long token stream through kvd's engine
 * under a context policy (sliding window or attention sinks), for the
 * window tests and the perplexity figures.
 *
 * The stream is a fixed text or token list (teacher-forced), optionally
 * followed by greedily generated tokens. Before every step the engine's
 * window policy (kvd_engine_window_prepare) drops the oldest window page
 * when the window is full and re-rotates the rest; the tool records the
 * most pages the pool had in use, and prints one JSON object:
 *   {"n_stream", "n_vocab", "block_size", "sink_tokens", "max_window",
 *    "kv_tokens" (K/V slots at the end), "dropped_tokens" (from kvmm's
 *    ledger), "drops", "pages_used_max", "pages_total", "nll", "n_scored",
 *    "ppl", "ppl_segments" ([ppl of each --segment tokens]), "generated"}
 * Logits rows (float32, n_vocab each) after the stream positions named by
 * --logits-at go to --logits-out, in that order.
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

static const char usage[] =
	"usage: kvd_stream --model PATH (--tokens-file FILE | --text-file FILE)\n"
	"                  [--policy sliding-window|sinks|none] [--window W] [--sinks S]\n"
	"                  [--generate N] [--chunk N] [--block-size N] [--threads N]\n"
	"                  [--logits-at I,J,...] [--logits-out FILE] [--segment N] [--limit N]\n"
	"\n"
	"  --tokens-file FILE  token ids separated by commas or white space\n"
	"  --text-file FILE    text, tokenized by the model (BOS added if the model wants it)\n"
	"  --limit N           use the first N tokens of the input only\n"
	"  --policy P          sliding-window (default), sinks, or none (full attention;\n"
	"                      the stream must then fit in the pool)\n"
	"  --window W          window tokens a new token sees at least (default 64)\n"
	"  --sinks S           attention-sink tokens, rounded up to whole pages (default 4)\n"
	"  --generate N        greedy tokens after the input (EOS ignored)\n"
	"  --chunk N           input tokens per step at most (default 1)\n"
	"  --segment N         tokens per perplexity segment (default 256)\n";


static int read_text_ids(const struct kvd_tokenizer *tk, const char *path, int32_t **ret, int *ret_n)
{
	size_t len;
	char *buf = tool_read_file(path, KVD_TOKENIZE_MAX_BYTES, &len);
	int need;

	if (!buf)
		return -errno;
	need = kvd_tokenize(tk, buf, len, kvd_tokenizer_add_bos(tk), 0, NULL, 0);
	if (need < 0) {
		free(buf);
		return need;
	}
	*ret = malloc(sizeof(int32_t) * (size_t)(need + 1));
	if (!*ret) {
		free(buf);
		return -ENOMEM;
	}
	*ret_n = kvd_tokenize(tk, buf, len, kvd_tokenizer_add_bos(tk), 0, *ret, need);
	free(buf);
	return *ret_n < 0 ? *ret_n : 0;
}

/* -log softmax(row)[tok], in double */
static double nll_of(const float *row, int n_vocab, int32_t tok)
{
	double mx = row[0], sum = 0;
	for (int i = 1; i < n_vocab; i++)
		if (row[i] > mx)
			mx = row[i];
	for (int i = 0; i < n_vocab; i++)
		sum += exp((double)row[i] - mx);
	return log(sum) + mx - row[tok];
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{"model", required_argument, 0, 'm'},     {"tokens-file", required_argument, 0, 't'},
		{"text-file", required_argument, 0, 'x'}, {"policy", required_argument, 0, 'p'},
		{"window", required_argument, 0, 'w'},    {"sinks", required_argument, 0, 's'},
		{"generate", required_argument, 0, 'g'},  {"chunk", required_argument, 0, 'c'},
		{"block-size", required_argument, 0, 'b'}, {"threads", required_argument, 0, 'j'},
		{"logits-at", required_argument, 0, 'a'}, {"logits-out", required_argument, 0, 'o'},
		{"segment", required_argument, 0, 'G'},   {"limit", required_argument, 0, 'l'},
		{"help", no_argument, 0, 'h'},            {0, 0, 0, 0},
	};
	const char *model = NULL, *tokfile = NULL, *textfile = NULL, *policy = "sliding-window";
	const char *logits_at = NULL, *logits_out = NULL;
	long window = 64, sinks = 4, n_gen = 0, chunk = 1, bs = 16, threads = 1, segment = 256, limit = 0;
	int o, rc = 1, r;

	while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (o) {
		case 'm': model = optarg; break;
		case 't': tokfile = optarg; break;
		case 'x': textfile = optarg; break;
		case 'p': policy = optarg; break;
		case 'w': window = atol(optarg); break;
		case 's': sinks = atol(optarg); break;
		case 'g': n_gen = atol(optarg); break;
		case 'c': chunk = atol(optarg); break;
		case 'b': bs = atol(optarg); break;
		case 'j': threads = atol(optarg); break;
		case 'a': logits_at = optarg; break;
		case 'o': logits_out = optarg; break;
		case 'G': segment = atol(optarg); break;
		case 'l': limit = atol(optarg); break;
		case 'h': fputs(usage, stdout); return 0;
		default: fputs(usage, stderr); return 2;
		}
	}
	int mode = !strcmp(policy, "none") ? 0 : !strcmp(policy, "sliding-window") ? 1 : !strcmp(policy, "sinks") ? 2 : -1;
	if (!model || !!tokfile == !!textfile || mode < 0 || window < 1 || sinks < 0 || n_gen < 0 || chunk < 1 ||
	    bs < 1 || bs > KVMM_MAX_BLOCK_SIZE || segment < 1 || (logits_at && !logits_out)) {
		fputs(usage, stderr);
		return 2;
	}

	char err[512];
	struct kvd_model *m = NULL;
	int32_t *toks = NULL;
	int n_in = 0;
	r = kvd_model_load(model, &m, err, sizeof(err));
	if (r < 0) {
		fprintf(stderr, "kvd_stream: %s\n", err);
		return 1;
	}
	r = tokfile ? tool_read_ids(tokfile, &toks, &n_in) : read_text_ids(kvd_model_tokenizer(m), textfile, &toks, &n_in);
	int32_t n_vocab = kvd_model_hparams(m)->n_vocab;
	struct kvd_kv_layout l0;
	kvd_kv_layout_init(&l0, kvd_model_hparams(m), (uint32_t)bs);
	kvd_model_free(m);
	if (r < 0 || n_in < 1) {
		fprintf(stderr, "kvd_stream: cannot read the input: %s\n", r < 0 ? strerror(-r) : "empty");
		free(toks);
		return 1;
	}
	if (limit > 0 && limit < n_in)
		n_in = (int)limit;
	for (int i = 0; i < n_in; i++)
		if (toks[i] >= n_vocab) {
			fprintf(stderr, "kvd_stream: token %d out of range\n", toks[i]);
			free(toks);
			return 1;
		}
	long n_stream = n_in + n_gen;
	int32_t *stream = realloc(toks, sizeof(int32_t) * (size_t)n_stream);
	if (!stream) {
		free(toks);
		return 1;
	}
	struct kvd_window w = {
		.sink_pages = mode == 2 ? (uint32_t)((sinks + bs - 1) / bs) : 0,
		.max_window = (uint32_t)(window + bs - 1),
	};
	long pool_pages = mode ? w.sink_pages + (w.max_window + bs - 1) / bs + 4 : (n_stream + bs - 1) / bs + 4;
	struct kvd_engine_config ec = {
		.model_path = model,
		.n_threads = (int)threads,
		.block_size = (uint32_t)bs,
		.kv_pool_bytes = (uint64_t)pool_pages * l0.page_bytes,
		.max_seqs = 4,
	};
	struct kvd_engine *e = NULL;
	float *logits = malloc(sizeof(float) * (size_t)n_vocab * (size_t)chunk);
	long *at = NULL, n_at = 0, next_at = 0;
	double *seg_nll = calloc((size_t)(n_stream / segment + 1), sizeof(double));
	long *seg_n = calloc((size_t)(n_stream / segment + 1), sizeof(long));
	FILE *lout = NULL;
	uint32_t seq, pages_used_max = 0;
	double nll = 0;
	long n_scored = 0;

	if (!logits || !seg_nll || !seg_n)
		goto out;
	if (logits_at) {
		at = calloc(strlen(logits_at) / 2 + 2, sizeof(long));
		if (!at)
			goto out;
		for (const char *p = logits_at; *p;) {
			char *end;
			at[n_at++] = strtol(p, &end, 10);
			if (end == p || (n_at > 1 && at[n_at - 1] <= at[n_at - 2])) {
				fprintf(stderr, "kvd_stream: --logits-at wants increasing positions\n");
				rc = 2;
				goto out;
			}
			p = *end == ',' ? end + 1 : end;
		}
		lout = fopen(logits_out, "wb");
		if (!lout) {
			fprintf(stderr, "kvd_stream: %s: %s\n", logits_out, strerror(errno));
			goto out;
		}
	}
	r = kvd_engine_open(&ec, &e, err, sizeof(err));
	if (r < 0) {
		fprintf(stderr, "kvd_stream: %s\n", err);
		goto out;
	}
	/* which backend serves the stream (tests/gpu/engine_check.sh asks) */
	fprintf(stderr, "kvd_stream: backend %s\n", kvd_engine_backend_name(e));
	if (mode && !kvd_engine_can_shift(e)) {
		fprintf(stderr, "kvd_stream: the %s backend cannot re-rotate cached keys (kv_shift): %s\n",
			kvd_engine_backend_name(e), strerror(ENOTSUP));
		goto out;
	}
	struct kvmm *kv = kvd_engine_kvmm(e);
	if (kvmm_seq_new(kv, &seq) < 0)
		goto out;
	for (long t = 0; t < n_stream;) {
		uint32_t room = (uint32_t)(t < n_in ? (n_in - t < chunk ? n_in - t : chunk) : 1);
		if (mode) {
			r = kvd_engine_window_prepare(e, seq, &w, room, &room, NULL);
			if (r < 0) {
				fprintf(stderr, "kvd_stream: window: %s\n", strerror(-r));
				goto out;
			}
		}
		struct kvd_engine_item it = { .seq = seq, .tokens = stream + t, .n_tokens = (int32_t)room,
					      .logits = logits, .all_logits = 1 };
		r = kvd_engine_step(e, &it, 1);
		if (r < 0) {
			fprintf(stderr, "kvd_stream: step at %ld: %s\n", t, strerror(-r));
			goto out;
		}
		struct kvmm_stats st;
		kvmm_get_stats(kv, &st);
		if (st.pages_used > pages_used_max)
			pages_used_max = st.pages_used;
		for (uint32_t j = 0; j < room; j++) {
			long pos = t + j;
			const float *row = logits + (size_t)j * n_vocab;
			if (pos + 1 < n_in) {
				double x = nll_of(row, n_vocab, stream[pos + 1]);
				nll += x;
				n_scored++;
				seg_nll[(pos + 1) / segment] += x;
				seg_n[(pos + 1) / segment]++;
			}
			if (pos + 1 >= n_in && pos + 1 < n_stream) { /* greedy */
				int32_t best = 0;
				for (int32_t v = 1; v < n_vocab; v++)
					if (row[v] > row[best])
						best = v;
				stream[pos + 1] = best;
			}
			if (next_at < n_at && at[next_at] == pos) {
				if (fwrite(row, sizeof(float), (size_t)n_vocab, lout) != (size_t)n_vocab)
					goto out;
				next_at++;
			}
		}
		t += room;
	}
	if (next_at < n_at) {
		fprintf(stderr, "kvd_stream: --logits-at position %ld is past the stream\n", at[next_at]);
		goto out;
	}
	struct kvmm_seq_record rec;
	kvmm_seq_ledger(kv, seq, &rec);
	printf("{\"n_stream\":%ld,\"n_vocab\":%d,\"block_size\":%ld,\"sink_tokens\":%u,\"max_window\":%u,"
	       "\"kv_tokens\":%u,\"dropped_tokens\":%u,\"drops\":%u,\"pages_used_max\":%u,\"pages_total\":%u,"
	       "\"nll\":%.6f,\"n_scored\":%ld,\"ppl\":%.6f,\"ppl_segments\":[",
	       n_stream, n_vocab, bs, w.sink_pages * (uint32_t)bs, w.max_window, rec.len_tokens, rec.dropped_tokens,
	       rec.drops, pages_used_max, kvmm_n_pages(kv), nll, n_scored, n_scored ? exp(nll / n_scored) : 0.0);
	for (long i = 0; i <= n_stream / segment; i++)
		if (seg_n[i])
			printf("%s%.4f", i ? "," : "", exp(seg_nll[i] / seg_n[i]));
	printf("],\"generated\":[");
	for (long i = n_in; i < n_stream; i++)
		printf("%s%d", i > n_in ? "," : "", stream[i]);
	printf("]}\n");
	rc = 0;
out:
	if (lout && fclose(lout) != 0)
		rc = 1;
	kvd_engine_close(e);
	free(stream);
	free(logits);
	free(at);
	free(seg_nll);
	free(seg_n);
	return rc;
}
