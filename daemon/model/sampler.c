/*
 * daemon/model/sampler.c — the sampling chain and stop-string matcher
 * declared in sampler.h.
 *
 * Per token the sampler copies the logits once into a candidate array
 * (value, id) that it owns, so the caller's logits stay untouched and no
 * allocation happens on the hot path. Everything after that works on that
 * array in place:
 *
 *   penalty   distinct ids of the look-back window are found with an
 *             epoch-stamped "seen" array (O(window), no clearing per call);
 *   top-k     a k-element heap over the n candidates, then heapsort of the
 *             k survivors: O(n log k) worst case, close to O(n) in practice
 *             since most candidates lose against the heap root at once;
 *             49152 logits are never fully sorted when top_k is set;
 *   top-p     without top-k, the same heap selection grows geometrically
 *             (64, 256, ...) until the sorted prefix holds top_p of the
 *             mass, so peaked distributions sort only a few dozen entries;
 *   min-p     a threshold on (l - l_max) / T >= log(min_p), applied as an
 *             O(n) partition before top-p sorts anything (both keep a
 *             prefix of the same order, so they commute this way).
 *
 * Temperature is applied as (l - l_max) / T after top-k, which selects the
 * same set as applying it first (positive scaling keeps the order) and keeps
 * the softmax finite for any T > 0.
 */
#include "sampler.h"

#include <assert.h>
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

/* First prefix sorted when top-p runs without top-k; grows 4x per round. */
#define TOP_P_FIRST_PREFIX 64

struct cand {
	float v;    /* logit, later (logit - max) / temperature */
	int32_t id;
};

struct kvd_sampler {
	struct kvd_sampler_params p;
	int32_t n_vocab;
	uint64_t rng[4];     /* xoshiro256** state */
	struct cand *cand;   /* n_vocab entries, scratch for one call */
	uint32_t *seen;      /* seen[id] == epoch: id already penalised this call */
	uint32_t epoch;
};

/* ---- PRNG: xoshiro256** seeded by splitmix64 ---- */

static uint64_t splitmix64(uint64_t *x)
{
	uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k)
{
	return (x << k) | (x >> (64 - k));
}

static uint64_t rng_next(uint64_t s[4])
{
	uint64_t result = rotl(s[1] * 5, 7) * 9;
	uint64_t t = s[1] << 17;
	s[2] ^= s[0];
	s[3] ^= s[1];
	s[1] ^= s[2];
	s[0] ^= s[3];
	s[2] ^= t;
	s[3] = rotl(s[3], 45);
	return result;
}

/* Uniform in [0, 1) with 53 random bits. */
static double rng_uniform(uint64_t s[4])
{
	return (double)(rng_next(s) >> 11) * 0x1.0p-53;
}

uint64_t kvd_sample_seed(uint64_t seed, uint32_t i)
{
	if (i == 0)
		return seed;
	uint64_t x = seed + (uint64_t)(i - 1) * 0x9e3779b97f4a7c15ull;
	return splitmix64(&x); /* adds the constant once more: seed + i * constant */
}

/* ---- log-probabilities ---- */

static float lp_logit(const float *l, int32_t i)
{
	return isnan(l[i]) ? -INFINITY : l[i];
}

/* a before b in the sampler's order: larger logit, then lower id */
static bool lp_before(float va, int32_t a, float vb, int32_t b)
{
	return va > vb || (va == vb && a < b);
}

int kvd_logprobs_compute(const float *logits, int32_t n_vocab, int32_t token, uint32_t n_top,
			 struct kvd_logprobs *ret)
{
	if (token < 0 || token >= n_vocab || n_top > KVD_LOGPROBS_MAX_TOP || n_top > (uint32_t)n_vocab)
		return -EINVAL;
	float m = -INFINITY;
	for (int32_t i = 0; i < n_vocab; i++)
		if (lp_logit(logits, i) > m)
			m = lp_logit(logits, i);
	double sum = 0;
	if (isfinite(m))
		for (int32_t i = 0; i < n_vocab; i++)
			sum += exp((double)lp_logit(logits, i) - (double)m);
	/* all -inf (or +inf): no distribution; report a uniform one */
	double logz = isfinite(m) ? (double)m + log(sum) : 0;
	double uniform = -log((double)n_vocab);
#define LP(i) (isfinite(m) ? (float)((double)lp_logit(logits, i) - logz) : (float)uniform)
	/* top n_top: a sorted insertion list, entered only by values that beat
	 * its last entry (rare after the first few hundred ids) */
	uint32_t k = 0;
	int32_t *ids = ret->top_id;
	for (int32_t i = 0; i < n_vocab && n_top; i++) {
		float v = lp_logit(logits, i);
		if (k == n_top && !lp_before(v, i, lp_logit(logits, ids[k - 1]), ids[k - 1]))
			continue;
		uint32_t j = k < n_top ? k++ : k - 1;
		while (j > 0 && lp_before(v, i, lp_logit(logits, ids[j - 1]), ids[j - 1])) {
			ids[j] = ids[j - 1];
			j--;
		}
		ids[j] = i;
	}
	ret->token = token;
	ret->logprob = LP(token);
	ret->n_top = n_top;
	for (uint32_t j = 0; j < n_top; j++)
		ret->top_logprob[j] = LP(ids[j]);
#undef LP
	return 0;
}

/* ---- parameters ---- */

void kvd_sampler_params_default(struct kvd_sampler_params *p)
{
	*p = (struct kvd_sampler_params){
		.temperature = 0.8f,
		.top_k = 40,
		.top_p = 0.95f,
		.min_p = 0.05f,
		.repeat_penalty = 1.0f,
		.repeat_last_n = 64,
		.seed = 0,
	};
}

int kvd_sampler_params_check(const struct kvd_sampler_params *p)
{
	if (!p)
		return -EINVAL;
	/* Written so that NaN fails every test. */
	if (!(p->temperature >= 0) || !isfinite(p->temperature))
		return -EINVAL;
	if (!(p->top_p > 0))
		return -EINVAL;
	if (!(p->min_p < 1))
		return -EINVAL;
	if (!(p->repeat_penalty > 0) || !isfinite(p->repeat_penalty))
		return -EINVAL;
	if (p->repeat_last_n < 0)
		return -EINVAL;
	return 0;
}

struct kvd_sampler *kvd_sampler_new(const struct kvd_sampler_params *p, int32_t n_vocab)
{
	if (kvd_sampler_params_check(p) < 0 || n_vocab <= 0 || n_vocab > KVD_SAMPLER_MAX_VOCAB)
		return NULL;
	struct kvd_sampler *s = calloc(1, sizeof(*s));
	if (!s)
		return NULL;
	s->p = *p;
	s->n_vocab = n_vocab;
	s->cand = malloc((size_t)n_vocab * sizeof(*s->cand));
	s->seen = calloc((size_t)n_vocab, sizeof(*s->seen));
	if (!s->cand || !s->seen)
		return kvd_sampler_free(s);
	uint64_t x = p->seed;
	for (int i = 0; i < 4; i++)
		s->rng[i] = splitmix64(&x);
	return s;
}

struct kvd_sampler *kvd_sampler_free(struct kvd_sampler *s)
{
	if (!s)
		return NULL;
	free(s->cand);
	free(s->seen);
	free(s);
	return NULL;
}

/* ---- candidate order: higher value first, lower id on ties ---- */

static bool better(struct cand a, struct cand b)
{
	return a.v > b.v || (a.v == b.v && a.id < b.id);
}

static void swap_cand(struct cand *a, struct cand *b)
{
	struct cand t = *a;
	*a = *b;
	*b = t;
}

static size_t argmax(const struct cand *c, size_t n)
{
	size_t b = 0;
	for (size_t i = 1; i < n; i++)
		if (better(c[i], c[b]))
			b = i;
	return b;
}

/* Heap whose root is the worst element. */
static void sift_down(struct cand *h, size_t n, size_t i)
{
	for (;;) {
		size_t w = i, l = 2 * i + 1, r = l + 1;
		if (l < n && better(h[w], h[l]))
			w = l;
		if (r < n && better(h[w], h[r]))
			w = r;
		if (w == i)
			return;
		swap_cand(&h[i], &h[w]);
		i = w;
	}
}

/* Moves the best k of c[0 .. n) to c[0 .. k), sorted best first; the rest
 * stay in c[k .. n) in some order. */
static void select_top_sorted(struct cand *c, size_t n, size_t k)
{
	if (k > n)
		k = n;
	if (k == 0)
		return;
	for (size_t i = k / 2; i-- > 0;)
		sift_down(c, k, i);
	for (size_t i = k; i < n; i++) {
		if (better(c[i], c[0])) {
			swap_cand(&c[i], &c[0]);
			sift_down(c, k, 0);
		}
	}
	for (size_t end = k - 1; end > 0; end--) {
		swap_cand(&c[0], &c[end]);
		sift_down(c, end, 0);
	}
}

/* ---- the chain ---- */

static void apply_penalty(struct kvd_sampler *s, const int32_t *history, size_t n_history)
{
	float pen = s->p.repeat_penalty;
	if (pen == 1.0f || s->p.repeat_last_n <= 0 || n_history == 0 || !history)
		return;
	size_t n_look = n_history < (size_t)s->p.repeat_last_n ? n_history : (size_t)s->p.repeat_last_n;
	if (++s->epoch == 0) {
		memset(s->seen, 0, (size_t)s->n_vocab * sizeof(*s->seen));
		s->epoch = 1;
	}
	for (size_t j = n_history - n_look; j < n_history; j++) {
		int32_t t = history[j];
		if (t < 0 || t >= s->n_vocab || s->seen[t] == s->epoch)
			continue;
		s->seen[t] = s->epoch;
		float *l = &s->cand[t].v; /* candidates are still in id order */
		*l = *l > 0 ? *l / pen : *l * pen;
		if (*l > FLT_MAX) /* a penalty below 1 may overflow */
			*l = FLT_MAX;
	}
}

/* Length of the shortest prefix of c[0 .. n) (taken in candidate order)
 * holding `target` of the mass; sorts as much of c as it needs. */
static size_t top_p_prefix(struct cand *c, size_t n, bool sorted, double target)
{
	size_t k = sorted ? n : (n < TOP_P_FIRST_PREFIX ? n : TOP_P_FIRST_PREFIX);
	for (;;) {
		if (!sorted)
			select_top_sorted(c, n, k);
		double cum = 0;
		for (size_t i = 0; i < k; i++) {
			cum += exp((double)c[i].v);
			if (cum >= target)
				return i + 1;
		}
		if (k == n)
			return n;
		k = k > n / 4 ? n : k * 4;
	}
}

/* Greedy over the raw logits, with the candidates' rules (NaN never wins,
 * +inf counts as FLT_MAX, ties go to the lowest id, all masked gives id 0):
 * the maximum, then the first id holding it. */
static int32_t argmax_logits(const float *l, size_t n)
{
	/* eight independent maxima (a NaN v keeps m), so the max pass runs at
	 * several elements a cycle */
	float mm[8] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY};
	size_t i = 0;
	for (; i + 8 <= n; i += 8)
		for (int j = 0; j < 8; j++) {
			float v = l[i + j] > FLT_MAX ? FLT_MAX : l[i + j];
			mm[j] = v > mm[j] ? v : mm[j];
		}
	for (; i < n; i++) {
		float v = l[i] > FLT_MAX ? FLT_MAX : l[i];
		mm[0] = v > mm[0] ? v : mm[0];
	}
	float m = mm[0];
	for (int j = 1; j < 8; j++)
		m = mm[j] > m ? mm[j] : m;
	for (i = 0; i < n; i++)
		if ((l[i] > FLT_MAX ? FLT_MAX : l[i]) == m)
			return (int32_t)i;
	return 0;
}

static bool allowed(const uint32_t *mask, size_t i)
{
	return !mask || (mask[i / 32] >> (i % 32) & 1u);
}

/* Greedy over the allowed raw logits, with argmax_logits' rules. */
static int32_t argmax_logits_masked(const float *l, size_t n, const uint32_t *mask)
{
	float m = -INFINITY;
	int32_t best = -1;
	for (size_t i = 0; i < n; i++) {
		if (!allowed(mask, i))
			continue;
		float v = isnan(l[i]) ? -INFINITY : l[i] > FLT_MAX ? FLT_MAX : l[i];
		if (best < 0 || v > m) {
			m = v;
			best = (int32_t)i;
		}
	}
	return best < 0 ? 0 : best;
}

/* The lowest allowed id (all allowed candidates at -inf). */
static int32_t first_allowed(const uint32_t *mask, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (allowed(mask, i))
			return (int32_t)i;
	return 0;
}

/* The candidate array in id order: disallowed and NaN logits at -inf,
 * +inf clamped to FLT_MAX (keeps l - max finite). */
static void fill_cands(struct kvd_sampler *s, const float *logits, const uint32_t *mask)
{
	struct cand *c = s->cand;
	for (size_t i = 0; i < (size_t)s->n_vocab; i++) {
		float l = logits[i];
		if (!allowed(mask, i))
			l = -INFINITY;
		else if (isnan(l))
			l = -INFINITY;
		else if (l > FLT_MAX)
			l = FLT_MAX;
		c[i] = (struct cand){ l, (int32_t)i };
	}
}

/* kvd_sampler_sample_checked's callback and its verdict. */
struct chain_check {
	int (*fn)(void *ud, int32_t token);
	void *ud;
	int rc; /* 1 decided, 0 not (nothing drawn), < 0 the callback's error */
};

/* The chain; mask (may be NULL) puts every token it does not allow at
 * -inf before anything else happens. With chk, there is no mask: the
 * unmasked top-k set is asked of chk->fn after the truncation and, unless
 * every member is allowed, the chain stops there (chk->rc <= 0, no random
 * number drawn, the return value meaningless); otherwise it goes on as the
 * masked chain would (see kvd_sampler_sample_checked). */
static int32_t sample_chain(struct kvd_sampler *s, const float *logits, const int32_t *history, size_t n_history,
			    const uint32_t *mask, struct chain_check *chk)
{
	const struct kvd_sampler_params *p = &s->p;
	struct cand *c = s->cand;
	size_t n = (size_t)s->n_vocab;
	bool masked = mask || chk;

	/* greedy with no penalty to apply: no candidate array */
	if ((p->temperature == 0 || p->top_k == 1) &&
	    (p->repeat_penalty == 1.0f || p->repeat_last_n <= 0 || n_history == 0 || !history))
		return mask ? argmax_logits_masked(logits, n, mask) : argmax_logits(logits, n);

	fill_cands(s, logits, mask);
	apply_penalty(s, history, n_history);

	if (p->temperature == 0 || p->top_k == 1)
		return c[argmax(c, n)].id;

	/* top-k first: temperature does not change the order. */
	size_t m = n;
	bool sorted = false;
	if (p->top_k > 0 && (size_t)p->top_k < n) {
		select_top_sorted(c, n, (size_t)p->top_k);
		m = (size_t)p->top_k;
		sorted = true;
	}
	if (chk) {
		chk->rc = 0;
		if (!sorted || c[0].v == -INFINITY)
			return 0;
		for (size_t i = 0; i < m; i++) {
			int r = chk->fn(chk->ud, c[i].id);
			if (r != 1) {
				chk->rc = r < 0 ? r : 0;
				return 0;
			}
		}
		chk->rc = 1;
	}
	float max = sorted ? c[0].v : c[argmax(c, m)].v;
	if (max == -INFINITY) /* every logit masked: fall back to greedy */
		return mask ? first_allowed(mask, n) : c[argmax(c, m)].id;
	for (size_t i = 0; i < m; i++)
		c[i].v = (c[i].v - max) / p->temperature; /* <= 0; the best is 0 */

	/* The top-p mass is taken over the top-k survivors, before min-p. */
	double z = 0;
	if (p->top_p < 1)
		for (size_t i = 0; i < m; i++)
			z += exp((double)c[i].v);

	if (p->min_p > 0) {
		float thr = logf(p->min_p); /* p >= min_p * p_max  <=>  v >= log(min_p) */
		size_t keep = 0;
		for (size_t i = 0; i < m; i++)
			if (c[i].v >= thr)
				swap_cand(&c[keep++], &c[i]); /* keeps order when sorted */
		m = keep;
	}
	if (p->top_p < 1)
		m = top_p_prefix(c, m, sorted, (double)p->top_p * z);

	double total = 0;
	for (size_t i = 0; i < m; i++)
		total += exp((double)c[i].v);
	double r = rng_uniform(s->rng) * total, acc = 0;
	for (size_t i = 0; i < m; i++) {
		acc += exp((double)c[i].v);
		if (r < acc)
			return c[i].id;
	}
	/* rounding left r at the very top: the last candidate with mass (with a
	 * mask, a disallowed one at -inf may sit at the end) */
	if (masked)
		while (m > 1 && exp((double)c[m - 1].v) == 0)
			m--;
	return c[m - 1].id;
}

int32_t kvd_sampler_sample(struct kvd_sampler *s, const float *logits, const int32_t *history, size_t n_history)
{
	return sample_chain(s, logits, history, n_history, NULL, NULL);
}

int32_t kvd_sampler_sample_masked(struct kvd_sampler *s, const float *logits, const int32_t *history,
				  size_t n_history, const uint32_t *mask)
{
	return sample_chain(s, logits, history, n_history, mask, NULL);
}

/*
 * Why the check is exact (the order `better` is total: value, then id).
 * Let T be the unmasked top-k, every member allowed and the best finite.
 * Allowed tokens carry the same value in the masked candidate array as in
 * the unmasked one (the penalty acts token by token); a token outside T
 * keeps its value or, disallowed, drops to -inf, so it only gets worse:
 * it was worse than every member of T and still is (if a member is at
 * -inf, the outsider already was at -inf with a larger id). So the masked
 * top-k is T, in the same sorted order with the same values, and every
 * later stage — the maximum, temperature, top-p's mass over the top-k,
 * min-p against the best, the total and the one uniform draw — reads only
 * c[0 .. k): the same token, the same random number consumed. The masked
 * chain's two special cases agree too: all allowed logits -inf is excluded
 * (the best is finite), and its rounding fallback (the last candidate with
 * mass) is applied here as well.
 */
int kvd_sampler_sample_checked(struct kvd_sampler *s, const float *logits, const int32_t *history,
			       size_t n_history, int (*allowed_fn)(void *ud, int32_t token), void *ud,
			       int32_t *ret_token)
{
	struct chain_check chk = { allowed_fn, ud, 0 };
	if (kvd_sampler_is_greedy(s)) {
		/* the masked greedy pick (either of its paths: the raw argmax, or
		 * the argmax of the penalised candidates) is the best allowed
		 * token in `better`'s order over the same values; the first
		 * allowed of the best k overall is it, as every allowed token
		 * outside them is worse than all of them. Stopping at -inf keeps
		 * clear of the all -inf special cases. */
		struct cand *c = s->cand;
		size_t k = KVD_SAMPLER_GREEDY_CHECK_K < (size_t)s->n_vocab ? KVD_SAMPLER_GREEDY_CHECK_K : (size_t)s->n_vocab;
		fill_cands(s, logits, NULL);
		apply_penalty(s, history, n_history);
		select_top_sorted(c, (size_t)s->n_vocab, k);
		for (size_t i = 0; i < k && c[i].v > -INFINITY; i++) {
			int r = allowed_fn(ud, c[i].id);
			if (r < 0)
				return r;
			if (r == 1) {
				*ret_token = c[i].id;
				return 1;
			}
		}
		return 0;
	}
	if (s->p.top_k <= 0 || s->p.top_k >= s->n_vocab)
		return 0;
	int32_t t = sample_chain(s, logits, history, n_history, NULL, &chk);
	if (chk.rc == 1)
		*ret_token = t;
	return chk.rc;
}

int kvd_sampler_is_greedy(const struct kvd_sampler *s)
{
	return s->p.temperature == 0 || s->p.top_k == 1;
}

/* ---- stop strings ---- */

int kvd_stop_init(struct kvd_stop *st, const char *const *strs, size_t n)
{
	size_t len[KVD_SAMPLER_MAX_STOPS];
	if (!st || (n > 0 && !strs))
		return -EINVAL;
	if (n > KVD_SAMPLER_MAX_STOPS)
		return -E2BIG;
	for (size_t i = 0; i < n; i++) {
		if (!strs[i])
			return -EINVAL;
		len[i] = strnlen(strs[i], KVD_SAMPLER_MAX_STOP_LEN + 1);
		if (len[i] == 0)
			return -EINVAL;
		if (len[i] > KVD_SAMPLER_MAX_STOP_LEN)
			return -E2BIG;
	}
	memset(st, 0, sizeof(*st));
	st->n = (uint32_t)n;
	for (size_t i = 0; i < n; i++) {
		memcpy(st->str[i], strs[i], len[i]);
		st->len[i] = (uint32_t)len[i];
	}
	return 0;
}

size_t kvd_stop_feed(struct kvd_stop *st, const char *text, size_t len, char *out, size_t cap, int *ret_hit)
{
	size_t nb = st->n_tail + len;
	assert(cap >= nb);
	(void)cap;
	if (ret_hit)
		*ret_hit = 0;

	/* Work on held-back text + new text, laid out in out. No stop lies
	 * entirely inside the held-back part (it would have hit before), and
	 * any stop that began before it would be a longer held-back suffix. */
	memcpy(out, st->tail, st->n_tail);
	if (len > 0)
		memcpy(out + st->n_tail, text, len);

	size_t best_end = SIZE_MAX, best_start = 0;
	for (uint32_t i = 0; i < st->n; i++) {
		const char *hit = memmem(out, nb, st->str[i], st->len[i]);
		if (!hit)
			continue;
		size_t start = (size_t)(hit - out), end = start + st->len[i];
		if (end < best_end || (end == best_end && start < best_start)) {
			best_end = end;
			best_start = start;
		}
	}
	if (best_end != SIZE_MAX) {
		st->n_tail = 0;
		if (ret_hit)
			*ret_hit = 1;
		return best_start;
	}

	/* Hold back the longest suffix that is a proper prefix of a stop. */
	size_t hold = 0;
	for (uint32_t i = 0; i < st->n; i++) {
		size_t k = st->len[i] - 1 < nb ? st->len[i] - 1 : nb;
		for (; k > hold; k--) {
			if (out[nb - k] == st->str[i][0] && memcmp(out + nb - k, st->str[i], k) == 0) {
				hold = k;
				break;
			}
		}
	}
	memcpy(st->tail, out + nb - hold, hold);
	st->n_tail = (uint32_t)hold;
	return nb - hold;
}

size_t kvd_stop_flush(struct kvd_stop *st, char *out, size_t cap)
{
	size_t n = st->n_tail;
	assert(cap >= n);
	(void)cap;
	memcpy(out, st->tail, n);
	st->n_tail = 0;
	return n;
}
