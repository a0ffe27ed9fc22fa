/*
 * tests/tools/kvd_eval.c — drive kvd's engine directly, for reference and
 * invariance tests and first speed figures.
 *
 * Runs greedy decoding of one prompt, or of a batch of prompts decoded
 * together, and prints one JSON object per run; optionally writes every
 * step's logits as raw float32 rows so scripts can compare them exactly.
 */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "daemon/engine.h"
#include "kvmm.h"
#include "model.h"
#include "tokenizer.h"
#include "tool_util.h"

#define MAX_SEQS 256

static const char usage[] =
	"usage: kvd_eval --model PATH (--tokens ID,ID,... | --prompt TEXT | --batch-file FILE)\n"
	"                [--n-predict N] [--threads N] [--block-size N] [--chunk N]\n"
	"                [--shuffle-seed S] [--logits-out FILE] [--timing] [--pool-pages N]\n"
	"                [--cache-type f16|bf16|q8_0|q4_0|f32] [--backend auto|cpu|cuda] [--keep-local]\n"
	"\n"
	"Greedy-decodes N tokens (default 32, EOS ignored) after the prompt and prints\n"
	"{\"prompt_tokens\":[...],\"generated\":[...],\"n_vocab\":V,...} (one object per\n"
	"sequence, one per line, for --batch-file), with the KV it holds at the end\n"
	"(kv_pages_held, kv_pages_released) and the pool's peak (pool_pages_peak).\n"
	"\n"
	"  --tokens LIST      prompt as comma-separated token ids\n"
	"  --prompt TEXT      prompt as raw text, tokenized by the model's tokenizer\n"
	"  --batch-file FILE  one prompt per line (comma-separated ids), run as one batch\n"
	"  --chunk N          prefill the prompt N tokens per step (default: all at once)\n"
	"  --block-size N     tokens per KV page (default 16)\n"
	"  --shuffle-seed S   hand out KV pages in a pseudo-random order\n"
	"  --logits-out FILE  float32 rows of n_vocab: row 0 after the prompt, row i after\n"
	"                     generated token i-1 (N rows); FILE.<i> per batch sequence\n"
	"  --timing           report prefill and decode tokens/s on stderr\n"
	"  --pool-pages N     KV pool size in pages (default: what the run needs, x3)\n"
	"  --parse-special    match special-token texts (<|im_start|>) in --prompt\n"
	"  --swap-each-step   after prefill and every decode step, swap every sequence out\n"
	"                     (to a memory store), overwrite the freed pages with another\n"
	"                     sequence's prefill, and swap them back in: the logits must\n"
	"                     not change\n"
	"  --cache-type TYPE  K/V element type (default f16)\n"
	"  --backend NAME     auto (default), cpu or cuda\n"
	"  --keep-local       keep every layer's K/V of the whole context (no release of\n"
	"                     what windowed layers no longer read: kv.release_local = no)\n";

struct seq {
	int32_t *toks;
	int n_prompt, n;
	uint32_t id;
	float *logits;
	FILE *out;
};

static uint32_t pages_used_max(const struct kvmm *kv, uint32_t peak)
{
	struct kvmm_stats st;
	kvmm_get_stats(kv, &st);
	return st.pages_used > peak ? st.pages_used : peak;
}

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int parse_ids(const char *s, int32_t **ret, int *ret_n)
{
	int cap = 64, n = 0;
	int32_t *v = malloc(sizeof(*v) * cap);
	if (!v)
		return -ENOMEM;
	while (*s && *s != '\n') {
		char *end;
		long x = strtol(s, &end, 10);
		if (end == s || x < 0 || x > 0x7fffffff) {
			free(v);
			return -EINVAL;
		}
		if (n == cap) {
			int32_t *nv = realloc(v, sizeof(*v) * (cap *= 2));
			if (!nv) {
				free(v);
				return -ENOMEM;
			}
			v = nv;
		}
		v[n++] = (int32_t)x;
		s = end;
		while (*s == ',' || *s == ' ')
			s++;
	}
	*ret = v;
	*ret_n = n;
	return 0;
}


/*
 * --swap-each-step: every sequence out to the swap store, a filler sequence
 * prefilled over the freed pages (so stale K/V left in them cannot pass for
 * swapped-in content), the filler freed, every sequence back in (last out,
 * first in, so pages change places). 0 or -errno, said on stderr.
 */
static int swap_round(struct kvd_engine *e, const struct seq *seqs, int n_seqs)
{
	struct kvmm *kv = kvd_engine_kvmm(e);
	uint32_t filler;
	int32_t *ft;
	int n = 0, r;

	for (int i = 0; i < n_seqs; i++) {
		n += (int)kvmm_seq_len(kv, seqs[i].id);
		if ((r = kvmm_seq_swap_out(kv, seqs[i].id)) < 0) {
			fprintf(stderr, "kvd_eval: swap-out: %s\n", strerror(-r));
			return r;
		}
	}
	ft = malloc(sizeof(*ft) * (size_t)(n > 0 ? n : 1));
	if (!ft)
		return -ENOMEM;
	for (int i = 0; i < n; i++)
		ft[i] = (int32_t)((i * 7 + 3) % 5); /* any valid ids: tokens 0..4 */
	r = kvmm_seq_new(kv, &filler);
	if (r == 0) {
		struct kvd_engine_item it = {.seq = filler, .tokens = ft, .n_tokens = n};

		r = n > 0 ? kvd_engine_step(e, &it, 1) : 0;
		kvmm_seq_free(kv, filler);
	}
	free(ft);
	if (r < 0) {
		fprintf(stderr, "kvd_eval: filler prefill: %s\n", strerror(-r));
		return r;
	}
	for (int i = n_seqs; i-- > 0;)
		if ((r = kvmm_seq_swap_in(kv, seqs[i].id)) < 0) {
			fprintf(stderr, "kvd_eval: swap-in: %s\n", strerror(-r));
			return r;
		}
	return 0;
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{"model", required_argument, 0, 'm'},   {"tokens", required_argument, 0, 't'},
		{"prompt", required_argument, 0, 'p'},  {"batch-file", required_argument, 0, 'b'},
		{"n-predict", required_argument, 0, 'n'}, {"threads", required_argument, 0, 'j'},
		{"block-size", required_argument, 0, 'B'}, {"chunk", required_argument, 0, 'c'},
		{"shuffle-seed", required_argument, 0, 's'}, {"logits-out", required_argument, 0, 'o'},
		{"timing", no_argument, 0, 'T'},        {"pool-pages", required_argument, 0, 'P'},
		{"parse-special", no_argument, 0, 'S'}, {"help", no_argument, 0, 'h'},
		{"swap-each-step", no_argument, 0, 'W'}, {"cache-type", required_argument, 0, 'K'},
		{"backend", required_argument, 0, 'D'}, {"keep-local", no_argument, 0, 'L'},
		{0, 0, 0, 0},
	};
	const char *model = NULL, *tokens = NULL, *prompt = NULL, *batch = NULL, *logits_out = NULL, *backend = NULL;
	int n_predict = 32, threads = 0, chunk = 0, timing = 0, parse_special = 0, swap_each = 0, keep_local = 0;
	uint32_t pool_peak = 0;
	long pool_pages = 0;
	uint32_t block_size = 16;
	uint64_t shuffle = 0;
	enum kvd_kv_type kv_type = KVD_KV_F16;
	int c, r, rc = 1;

	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (c) {
		case 'm': model = optarg; break;
		case 't': tokens = optarg; break;
		case 'p': prompt = optarg; break;
		case 'b': batch = optarg; break;
		case 'n': n_predict = atoi(optarg); break;
		case 'j': threads = atoi(optarg); break;
		case 'B': block_size = (uint32_t)atoi(optarg); break;
		case 'c': chunk = atoi(optarg); break;
		case 's': shuffle = strtoull(optarg, NULL, 0); break;
		case 'o': logits_out = optarg; break;
		case 'T': timing = 1; break;
		case 'P': pool_pages = atol(optarg); break;
		case 'S': parse_special = 1; break;
		case 'W': swap_each = 1; break;
		case 'L': keep_local = 1; break;
		case 'D': backend = optarg; break;
		case 'K':
			if (kvd_kv_type_parse(optarg, &kv_type) < 0) {
				fprintf(stderr, "kvd_eval: --cache-type: '%s' is not f16, bf16, q8_0, q4_0 or f32\n", optarg);
				return 2;
			}
			break;
		case 'h': fputs(usage, stdout); return 0;
		default: fputs(usage, stderr); return 2;
		}
	}
	if (!model || (!!tokens + !!prompt + !!batch) != 1 || n_predict < 1) {
		fputs(usage, stderr);
		return 2;
	}

	/* load the model first to size the pool and tokenize */
	char err[512];
	struct kvd_model *m;
	r = kvd_model_load(model, &m, err, sizeof(err));
	if (r < 0) {
		fprintf(stderr, "kvd_eval: %s\n", err);
		return 1;
	}
	struct seq seqs[MAX_SEQS];
	int n_seqs = 0;
	memset(seqs, 0, sizeof(seqs));
	if (tokens) {
		if (parse_ids(tokens, &seqs[0].toks, &seqs[0].n_prompt) < 0) {
			fprintf(stderr, "kvd_eval: bad --tokens\n");
			return 2;
		}
		n_seqs = 1;
	} else if (prompt) {
		const struct kvd_tokenizer *tk = kvd_model_tokenizer(m);
		int need = kvd_tokenize(tk, prompt, strlen(prompt), kvd_tokenizer_add_bos(tk), parse_special, NULL, 0);
		if (need < 0) {
			fprintf(stderr, "kvd_eval: tokenize: %s\n", strerror(-need));
			return 1;
		}
		seqs[0].toks = malloc(sizeof(int32_t) * (size_t)(need + 1));
		seqs[0].n_prompt = kvd_tokenize(tk, prompt, strlen(prompt), kvd_tokenizer_add_bos(tk), parse_special, seqs[0].toks,
						(size_t)need);
		n_seqs = 1;
	} else {
		FILE *f = fopen(batch, "r");
		char *line = NULL;
		size_t cap = 0;
		if (!f) {
			fprintf(stderr, "kvd_eval: %s: %s\n", batch, strerror(errno));
			return 1;
		}
		while (getline(&line, &cap, f) > 0 && n_seqs < MAX_SEQS) {
			if (line[0] == '\n' || line[0] == 0)
				continue;
			if (parse_ids(line, &seqs[n_seqs].toks, &seqs[n_seqs].n_prompt) < 0) {
				fprintf(stderr, "kvd_eval: %s: bad line %d\n", batch, n_seqs + 1);
				return 2;
			}
			n_seqs++;
		}
		free(line);
		fclose(f);
	}
	int32_t n_vocab = kvd_model_hparams(m)->n_vocab;
	long need_pages = 0;
	for (int i = 0; i < n_seqs; i++) {
		if (seqs[i].n_prompt < 1) {
			fprintf(stderr, "kvd_eval: empty prompt\n");
			return 2;
		}
		int32_t *nt = realloc(seqs[i].toks, sizeof(int32_t) * (size_t)(seqs[i].n_prompt + n_predict));
		if (!nt)
			return 1;
		seqs[i].toks = nt;
		seqs[i].n = seqs[i].n_prompt;
		seqs[i].logits = malloc(sizeof(float) * (size_t)n_vocab);
		need_pages += (seqs[i].n_prompt + n_predict + block_size - 1) / block_size;
	}
	const struct kvd_kv_layout *lay;
	struct kvd_kv_layout l0;
	if (kvd_kv_layout_init_type(&l0, kvd_model_hparams(m), block_size, kv_type) < 0) {
		fprintf(stderr, "kvd_eval: cache type %s does not fit this model's head size\n", kvd_kv_type_name(kv_type));
		return 1;
	}
	kvd_model_free(m);
	if (!pool_pages)
		pool_pages = need_pages * 3 + 8;

	struct kvd_engine_config ec = {
		.model_path = model,
		.backend = backend,
		.n_threads = threads,
		.block_size = block_size,
		.kv_type = kv_type,
		.kv_pool_bytes = (uint64_t)pool_pages * l0.page_bytes,
		.max_seqs = MAX_SEQS,
		.prefix_cache = 0,
		.keep_local = keep_local,
		.shuffle_seed = shuffle,
	};
	struct kvd_engine *e;
	if (swap_each) {
		/* room for every sequence; the pool holds them and the filler */
		pool_pages = need_pages * 2 + 8;
		ec.kv_pool_bytes = (uint64_t)pool_pages * l0.page_bytes;
		r = kvmm_swap_io_mem_new((uint64_t)(need_pages + 8) * l0.page_bytes, &ec.swap_io);
		if (r < 0) {
			fprintf(stderr, "kvd_eval: swap store: %s\n", strerror(-r));
			return 1;
		}
	}
	r = kvd_engine_open(&ec, &e, err, sizeof(err));
	if (r < 0) {
		fprintf(stderr, "kvd_eval: %s\n", err);
		return 1;
	}
	lay = kvd_engine_kv_layout(e);
	(void)lay;
	struct kvmm *kv = kvd_engine_kvmm(e);

	for (int i = 0; i < n_seqs; i++) {
		if (kvmm_seq_new(kv, &seqs[i].id) < 0) {
			fprintf(stderr, "kvd_eval: cannot create sequence\n");
			goto out;
		}
		if (logits_out) {
			char path[4096];
			if (n_seqs == 1 && !batch)
				snprintf(path, sizeof(path), "%s", logits_out);
			else
				snprintf(path, sizeof(path), "%s.%d", logits_out, i);
			seqs[i].out = fopen(path, "wb");
			if (!seqs[i].out) {
				fprintf(stderr, "kvd_eval: %s: %s\n", path, strerror(errno));
				goto out;
			}
		}
	}

	struct kvd_engine_item items[MAX_SEQS];
	double t0 = now_s();
	long prefill_tokens = 0;
	/* Prefill: every sequence's prompt, `chunk` tokens per step, all
	 * sequences in the same steps. */
	int done_prefill = 0;
	int pos[MAX_SEQS] = {0};
	while (!done_prefill) {
		int n_items = 0;
		done_prefill = 1;
		for (int i = 0; i < n_seqs; i++) {
			int left = seqs[i].n_prompt - pos[i];
			if (left <= 0)
				continue;
			int take = chunk > 0 && chunk < left ? chunk : left;
			items[n_items++] = (struct kvd_engine_item){
				.seq = seqs[i].id,
				.tokens = seqs[i].toks + pos[i],
				.n_tokens = take,
				.logits = take == left ? seqs[i].logits : NULL,
			};
			pos[i] += take;
			prefill_tokens += take;
			if (pos[i] < seqs[i].n_prompt)
				done_prefill = 0;
		}
		if (n_items && (r = kvd_engine_step(e, items, (size_t)n_items)) < 0) {
			fprintf(stderr, "kvd_eval: prefill step: %s\n", strerror(-r));
			goto out;
		}
		pool_peak = pages_used_max(kv, pool_peak);
	}
	double t1 = now_s();
	if (swap_each && (r = swap_round(e, seqs, n_seqs)) < 0)
		goto out;
	for (int step = 0; step < n_predict; step++) {
		int n_items = 0;
		for (int i = 0; i < n_seqs; i++) {
			if (seqs[i].out && fwrite(seqs[i].logits, sizeof(float), (size_t)n_vocab, seqs[i].out) != (size_t)n_vocab) {
				fprintf(stderr, "kvd_eval: writing logits: %s\n", strerror(errno));
				goto out;
			}
			seqs[i].toks[seqs[i].n++] = tool_argmax(seqs[i].logits, n_vocab);
			if (step + 1 < n_predict)
				items[n_items++] = (struct kvd_engine_item){
					.seq = seqs[i].id,
					.tokens = seqs[i].toks + seqs[i].n - 1,
					.n_tokens = 1,
					.logits = seqs[i].logits,
				};
		}
		if (n_items && (r = kvd_engine_step(e, items, (size_t)n_items)) < 0) {
			fprintf(stderr, "kvd_eval: decode step: %s\n", strerror(-r));
			goto out;
		}
		pool_peak = pages_used_max(kv, pool_peak);
		if (n_items && swap_each && (r = swap_round(e, seqs, n_seqs)) < 0)
			goto out;
	}
	double t2 = now_s();
	for (int i = 0; i < n_seqs; i++) {
		printf("{\"prompt_tokens\":[");
		for (int j = 0; j < seqs[i].n_prompt; j++)
			printf("%s%d", j ? "," : "", seqs[i].toks[j]);
		printf("],\"generated\":[");
		for (int j = seqs[i].n_prompt; j < seqs[i].n; j++)
			printf("%s%d", j > seqs[i].n_prompt ? "," : "", seqs[i].toks[j]);
		printf("],\"n_vocab\":%d,\"kv_pages_held\":%u,\"kv_pages_released\":%u,\"pool_pages_peak\":%u}\n", n_vocab,
		       kvmm_seq_pages_held(kv, seqs[i].id), kvmm_seq_released(kv, seqs[i].id), pool_peak);
	}
	if (timing) {
		long dec = (long)n_seqs * (n_predict - 1);
		fprintf(stderr, "kvd_eval: backend %s, prefill %ld tokens in %.3f s (%.1f tok/s), decode %ld tokens in %.3f s (%.1f tok/s)\n",
			kvd_engine_backend_name(e), prefill_tokens, t1 - t0, prefill_tokens / (t1 - t0), dec, t2 - t1,
			dec / (t2 - t1));
		if (kvd_engine_backend_note(e))
			fprintf(stderr, "kvd_eval: %s\n", kvd_engine_backend_note(e));
	}
	rc = 0;
out:
	for (int i = 0; i < n_seqs; i++) {
		if (seqs[i].out && fclose(seqs[i].out) != 0)
			rc = 1;
		free(seqs[i].toks);
		free(seqs[i].logits);
	}
	kvd_engine_close(e);
	return rc;
}
