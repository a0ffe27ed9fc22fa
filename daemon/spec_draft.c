/*
 * daemon/spec_draft.c — the draft model's drafter (spec_draft.h). The
 * draft engine's steps are batched across the drafting requests: the
 * first step carries each one's catch-up chunk (ending in the token the
 * target has just sampled), with logits for its last token; each further
 * step one drafted token per request that still drafts. Drafts are the
 * argmax of the draft's logits (the lowest id on a tie): the target's
 * verification decides what is kept, so the drafter needs no sampler and
 * no RNG, and a draft changes no output.
 *
 * The draft pool is a cache: its pages are never published (prefix
 * caching is off in the draft engine, and every item defers publishing),
 * so a cut back (kvmm_seq_truncate) is always allowed, and its windowed
 * layers keep their pages (keep_local) for the same reason.
 */
#include "spec_draft.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "kvmm.h"
#include "model.h"
#include "tokenizer.h"

struct kvd_spec_drafter {
	struct kvd_engine *de;
	struct kvmm *kv;
	int32_t n_vocab;
	uint32_t n_ctx;
	/* step scratch, grown to the jobs of a run */
	struct kvd_engine_item *items;
	size_t *item_job;
	float *logits;
	size_t cap;
};

int kvd_spec_vocab_check(const struct kvd_model *target, const struct kvd_model *draft, char *err, size_t errlen)
{
	const struct kvd_tokenizer *a = kvd_model_tokenizer(target), *b = kvd_model_tokenizer(draft);
	int32_t va = kvd_model_hparams(target)->n_vocab, vb = kvd_model_hparams(draft)->n_vocab;

	if (va != vb) {
		snprintf(err, errlen, "the draft model's logits cover %d tokens, the target's %d", vb, va);
		return -EINVAL;
	}
	if (kvd_tokenizer_n_vocab(a) != kvd_tokenizer_n_vocab(b)) {
		snprintf(err, errlen, "the draft model's vocabulary has %d tokens, the target's %d",
			 kvd_tokenizer_n_vocab(b), kvd_tokenizer_n_vocab(a));
		return -EINVAL;
	}
	static const char *const names[] = { "BOS", "EOS", "end-of-turn" };
	int32_t ta[3] = { kvd_tokenizer_bos(a), kvd_tokenizer_eos(a), kvd_tokenizer_eot(a) };
	int32_t tb[3] = { kvd_tokenizer_bos(b), kvd_tokenizer_eos(b), kvd_tokenizer_eot(b) };
	for (int i = 0; i < 3; i++)
		if (ta[i] != tb[i]) {
			snprintf(err, errlen, "the draft model's %s token is %d, the target's %d", names[i], tb[i], ta[i]);
			return -EINVAL;
		}
	for (int32_t id = 0; id < kvd_tokenizer_n_vocab(a); id++) {
		size_t la, lb;
		const char *sa = kvd_tokenizer_token_text(a, id, &la), *sb = kvd_tokenizer_token_text(b, id, &lb);
		if (!sa != !sb || la != lb || (sa && memcmp(sa, sb, la)) ||
		    kvd_tokenizer_token_type(a, id) != kvd_tokenizer_token_type(b, id)) {
			snprintf(err, errlen, "token %d differs: the draft model's is '%.*s', the target's '%.*s'", id,
				 sb ? (int)(lb < 40 ? lb : 40) : 0, sb ? sb : "", sa ? (int)(la < 40 ? la : 40) : 0,
				 sa ? sa : "");
			return -EINVAL;
		}
	}
	return 0;
}

int kvd_spec_draft_open(struct kvd_engine *target, const char *path, uint64_t pool_bytes,
			const struct kvd_engine_config *base, char *err, size_t errlen)
{
	struct kvd_engine *de = NULL;
	char why[512];
	struct kvd_engine_config c = {
		.model_path = path,
		.backend = kvd_engine_backend_name(target),
		.n_threads = base->n_threads,
		.cpu_isa = base->cpu_isa,
		.block_size = base->block_size,
		.kv_type = kvd_engine_kv_layout(target)->type,
		.kv_pool_bytes = pool_bytes,
		.max_seqs = base->max_seqs,
		.keep_local = 1,
	};

	int r = kvd_engine_open(&c, &de, why, sizeof(why));
	if (r < 0) {
		snprintf(err, errlen, "draft model %s: %s", path, why[0] ? why : strerror(-r));
		return r;
	}
	r = kvd_spec_vocab_check(kvd_engine_model(target), kvd_engine_model(de), why, sizeof(why));
	if (r < 0) {
		snprintf(err, errlen, "draft model %s cannot draft for %s: %s", path, kvd_model_path(kvd_engine_model(target)),
			 why);
		kvd_engine_close(de);
		return r;
	}
	kvd_engine_set_draft(target, de);
	return 0;
}

struct kvd_spec_drafter *kvd_spec_drafter_new(struct kvd_engine *de)
{
	struct kvd_spec_drafter *dr = calloc(1, sizeof(*dr));
	if (!dr)
		return NULL;
	dr->de = de;
	dr->kv = kvd_engine_kvmm(de);
	dr->n_vocab = kvd_engine_n_vocab(de);
	const struct kvd_model *m = kvd_engine_model(de);
	dr->n_ctx = m && kvd_model_hparams(m)->n_ctx_train > 0 ? (uint32_t)kvd_model_hparams(m)->n_ctx_train : UINT32_MAX;
	return dr;
}

struct kvd_spec_drafter *kvd_spec_drafter_free(struct kvd_spec_drafter *dr)
{
	if (!dr)
		return NULL;
	free(dr->items);
	free(dr->item_job);
	free(dr->logits);
	free(dr);
	return NULL;
}

const char *kvd_spec_drafter_model(const struct kvd_spec_drafter *dr)
{
	const struct kvd_model *m = kvd_engine_model(dr->de);
	return m ? kvd_model_name(m) : "(no model)";
}

uint32_t kvd_spec_drafter_n_ctx(const struct kvd_spec_drafter *dr) { return dr->n_ctx; }

uint32_t kvd_spec_drafter_pages_for(const struct kvd_spec_drafter *dr, uint32_t n_tokens)
{
	uint32_t bs = kvd_engine_kv_layout(dr->de)->block_size;
	return (n_tokens + bs - 1) / bs;
}

uint32_t kvd_spec_dseq_pages(const struct kvd_spec_drafter *dr, const struct kvd_spec_dseq *d)
{
	return d->has ? kvmm_seq_pages_held(dr->kv, d->seq) : 0;
}

void kvd_spec_drafter_pages(const struct kvd_spec_drafter *dr, uint64_t *ret_total, uint64_t *ret_used)
{
	*ret_total = kvmm_n_pages(dr->kv);
	if (ret_used) {
		struct kvmm_stats st;
		kvmm_get_stats(dr->kv, &st);
		*ret_used = st.pages_used;
	}
}

void kvd_spec_dseq_drop(struct kvd_spec_drafter *dr, struct kvd_spec_dseq *d)
{
	if (d->has)
		kvmm_seq_free(dr->kv, d->seq);
	*d = (struct kvd_spec_dseq){ 0 };
}

uint32_t kvd_spec_dseq_sync(struct kvd_spec_drafter *dr, struct kvd_spec_dseq *d, const int32_t *toks,
			    uint32_t n_toks)
{
	if (!d->has)
		return n_toks;
	/* valid: [0, base) are the request's tokens as they were; then the
	 * tail as far as it agrees with what the target emitted */
	uint32_t valid = d->base < n_toks ? d->base : n_toks;
	for (uint32_t i = 0; i < d->n_tail && valid == d->base + i && valid < n_toks; i++)
		if (toks[valid] == d->tail[i])
			valid++;
	if (valid > d->n)
		valid = d->n;
	/* the last token has no K/V of its own yet at the target either: it
	 * is fed again with the catch-up chunk, which gives its logits */
	if (valid == n_toks)
		valid--;
	if (valid < d->n && kvmm_seq_truncate(dr->kv, d->seq, valid) < 0) {
		kvd_spec_dseq_drop(dr, d);
		return n_toks;
	}
	d->n = d->base = valid;
	d->n_tail = 0;
	return n_toks - valid;
}

static int grow(struct kvd_spec_drafter *dr, size_t n)
{
	if (n <= dr->cap)
		return 0;
	struct kvd_engine_item *it = realloc(dr->items, n * sizeof(*it));
	if (!it)
		return -ENOMEM;
	dr->items = it;
	size_t *ij = realloc(dr->item_job, n * sizeof(*ij));
	if (!ij)
		return -ENOMEM;
	dr->item_job = ij;
	float *l = realloc(dr->logits, n * (size_t)dr->n_vocab * sizeof(*l));
	if (!l)
		return -ENOMEM;
	dr->logits = l;
	dr->cap = n;
	return 0;
}

static int32_t argmax(const float *l, int32_t n)
{
	int32_t best = 0;
	for (int32_t i = 1; i < n; i++)
		if (l[i] > l[best])
			best = i;
	return best;
}

/* Run the items built, leaving jobs out from the end until they fit the
 * draft pool; their sequences stay as they are (cut back, not caught up),
 * for a later run. Returns the jobs left out, or a backend error (the
 * sequences of the items are then dropped). */
static int step_fitting(struct kvd_spec_drafter *dr, struct kvd_spec_djob *jobs, size_t *n_items)
{
	int dropped = 0;
	uint32_t need;

	while (*n_items && kvd_engine_plan(dr->de, dr->items, *n_items, &need) == -ENOMEM) {
		struct kvd_spec_djob *j = &jobs[dr->item_job[--*n_items]];
		j->k = j->n_out = 0;
		dropped++;
	}
	if (!*n_items)
		return dropped;
	int r = kvd_engine_step(dr->de, dr->items, *n_items);
	if (r < 0) { /* their sequences hold unwritten slots */
		for (size_t i = 0; i < *n_items; i++) {
			struct kvd_spec_djob *j = &jobs[dr->item_job[i]];
			kvd_spec_dseq_drop(dr, j->d);
			j->k = j->n_out = 0;
		}
		*n_items = 0;
		return r;
	}
	return dropped;
}

int kvd_spec_drafter_run(struct kvd_spec_drafter *dr, struct kvd_spec_djob *jobs, size_t n,
			 int (*is_eog)(void *ud, int32_t t), void *ud)
{
	size_t n_items = 0;
	int left_out = 0, r;

	if (grow(dr, n) < 0)
		return -ENOMEM;
	/* step 1: catch up, with logits where a draft follows */
	for (size_t i = 0; i < n; i++) {
		struct kvd_spec_djob *j = &jobs[i];
		j->n_out = j->n_fed = 0;
		if (j->n_toks + (j->k ? j->k : 1) > dr->n_ctx) { /* never past the draft model's context */
			j->k = 0;
			continue;
		}
		uint32_t lag = kvd_spec_dseq_sync(dr, j->d, j->toks, j->n_toks);
		if (!j->d->has) {
			if (kvmm_seq_new(dr->kv, &j->d->seq) < 0) {
				left_out++;
				j->k = 0;
				continue;
			}
			j->d->has = 1;
		}
		uint32_t take = lag;
		if (take > KVD_SPEC_CATCHUP_TOKENS) { /* a chunk now, drafts once caught up */
			take = KVD_SPEC_CATCHUP_TOKENS;
			j->k = 0;
		}
		dr->items[n_items] = (struct kvd_engine_item){
			.seq = j->d->seq,
			.tokens = j->toks + j->d->n,
			.n_tokens = (int32_t)take,
			.logits = j->k ? dr->logits + n_items * (size_t)dr->n_vocab : NULL,
			.keep_local = 1,
			.defer_publish = 1,
		};
		dr->item_job[n_items++] = i;
	}
	r = step_fitting(dr, jobs, &n_items);
	if (r < 0)
		return left_out;
	left_out += r;
	for (size_t i = 0; i < n_items; i++) {
		struct kvd_spec_djob *j = &jobs[dr->item_job[i]];
		j->d->n += (uint32_t)dr->items[i].n_tokens;
		j->d->base = j->d->n;
		j->n_fed += (uint32_t)dr->items[i].n_tokens;
		if (j->k)
			j->out[j->n_out++] = argmax(dr->items[i].logits, dr->n_vocab);
	}
	/* steps 2 ..: one drafted token each while drafts are wanted */
	for (uint32_t step = 1;; step++) {
		n_items = 0;
		for (size_t i = 0; i < n; i++) {
			struct kvd_spec_djob *j = &jobs[i];
			if (j->n_out != step || j->k <= step || (is_eog && is_eog(ud, j->out[step - 1])))
				continue;
			dr->items[n_items] = (struct kvd_engine_item){
				.seq = j->d->seq,
				.tokens = &j->out[step - 1],
				.n_tokens = 1,
				.logits = dr->logits + n_items * (size_t)dr->n_vocab,
				.keep_local = 1,
				.defer_publish = 1,
			};
			dr->item_job[n_items++] = i;
		}
		if (!n_items)
			break;
		uint32_t need;
		if (kvd_engine_plan(dr->de, dr->items, n_items, &need) == -ENOMEM)
			break; /* the drafts so far stand */
		if (kvd_engine_step(dr->de, dr->items, n_items) < 0) {
			for (size_t i = 0; i < n_items; i++) {
				struct kvd_spec_djob *j = &jobs[dr->item_job[i]];
				kvd_spec_dseq_drop(dr, j->d);
				j->k = j->n_out = 0;
			}
			continue;
		}
		for (size_t i = 0; i < n_items; i++) {
			struct kvd_spec_djob *j = &jobs[dr->item_job[i]];
			j->d->tail[j->d->n_tail++] = j->out[step - 1];
			j->d->n++;
			j->n_fed++;
			j->out[j->n_out++] = argmax(dr->items[i].logits, dr->n_vocab);
		}
	}
	return left_out;
}
