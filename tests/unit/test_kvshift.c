/*
 * tests/unit/test_kvshift.c — the CPU backend's kv_shift: keys cached after
 * RoPE at position p, re-rotated by delta, must equal the keys RoPE puts at
 * p + delta directly (computed here in double from the formula of
 * kernels/backend.h), for both pairings, per-layer bases, linear scaling
 * and rope_freqs, f16 and bf16 caches; values and other slots stay
 * untouched; bad arguments and the block types' layouts are refused.
 */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cpu/kvshift.h"
#include "cpu/ops.h"

enum { N_LAYER = 3, N_HEAD_KV = 2, HD = 16, BS = 4, N_PAGES = 6 };

static uint64_t rng = 0x243f6a8885a308d3ull;
static double drand(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return (double)(rng >> 11) / 4503599627370496.0 - 1.0; /* [-1, 1) */
}

/* Direct RoPE of one head vector at position pos, in double. */
static void rope_ref(double *v, int pos, double theta, double scale, const float *ff, enum kvd_rope_style st)
{
	for (int i = 0; i < HD / 2; i++) {
		double th = pos * scale * pow(theta, -2.0 * i / HD);
		if (ff)
			th /= ff[i];
		int a = st == KVD_ROPE_NEOX ? i : 2 * i, b = st == KVD_ROPE_NEOX ? i + HD / 2 : 2 * i + 1;
		double x0 = v[a], x1 = v[b];
		v[a] = x0 * cos(th) - x1 * sin(th);
		v[b] = x0 * sin(th) + x1 * cos(th);
	}
}

struct fixture {
	struct kvd_model_weights w;
	struct kvd_layer_weights layers[N_LAYER];
	float ff[HD / 2];
	struct kvd_paged_view kv;
	void *pool;
};

static void setup_fixture(struct fixture *f, enum kvd_rope_style st, int ext, int bf)
{
	memset(f, 0, sizeof(*f));
	f->w.hp = (struct kvd_hparams){ .n_layer = N_LAYER, .n_head_kv = N_HEAD_KV, .n_head = N_HEAD_KV,
					.head_dim = HD, .rope_theta = 10000.0f, .rope_style = st };
	f->w.layers = f->layers;
	if (ext) {
		/* per-layer bases and scales, and rope_freqs divisors, with
		 * the feature bits the model layer sets for them */
		f->w.features = KVD_FEAT_LAYER_ROPE | KVD_FEAT_ROPE_LINEAR | KVD_FEAT_ROPE_FREQS;
		f->layers[1].d.rope_theta = 1000000.0f;
		f->layers[2].d.rope_freq_scale = 0.25f;
		for (int i = 0; i < HD / 2; i++)
			f->ff[i] = 1.0f + 7.0f * (float)i / (HD / 2 - 1);
		f->w.rope_freqs.data = f->ff;
	}
	kvd_kv_layout_init(&f->kv.layout, &f->w.hp, BS);
	if (bf)
		assert_int_equal(kvd_kv_layout_init_type(&f->kv.layout, &f->w.hp, BS, KVD_KV_BF16), 0);
	f->kv.n_pages = N_PAGES;
	f->pool = calloc(N_PAGES, f->kv.layout.page_bytes);
	assert_non_null(f->pool);
	f->kv.base = f->pool;
}

static uint16_t *slot_k(const struct fixture *f, int32_t page, int layer, int slot)
{
	const struct kvd_kv_layout *L = &f->kv.layout;
	return (uint16_t *)((char *)f->pool + (size_t)page * L->page_bytes + (size_t)layer * L->layer_stride +
			    (size_t)slot * L->token_stride);
}

/* Fill n tokens of the page list with keys rotated at pos0 + t (and random
 * values); keep the unrotated keys in raw. Then shift by delta and compare
 * with keys rotated at pos0 + t + delta. */
static void check_shift_t(enum kvd_rope_style st, int ext, int pos0, int delta, uint32_t n_tok, int bf)
{
	uint16_t (*to16)(float) = bf ? cpu_f32_to_bf16 : cpu_f32_to_fp16;
	float (*from16)(uint16_t) = bf ? cpu_bf16_to_f32 : cpu_fp16_to_f32;
	const double ulp = bf ? 0x1p-8 : 0x1p-11;
	struct fixture f;
	const int32_t pages[] = {4, 1, 5, 0};
	uint32_t np = (n_tok + BS - 1) / BS;
	size_t n_raw = (size_t)N_LAYER * n_tok * N_HEAD_KV * HD;
	double *raw = malloc(n_raw * sizeof(double)), v[HD];
	uint16_t *vals = malloc(n_raw * sizeof(uint16_t));
	double worst = 0;

	assert_non_null(raw);
	assert_non_null(vals);
	setup_fixture(&f, st, ext, bf);
	for (int l = 0; l < N_LAYER; l++) {
		const struct kvd_layer_desc *d = &f.layers[l].d;
		double th = d->rope_theta > 0 ? d->rope_theta : f.w.hp.rope_theta;
		double sc = d->rope_freq_scale > 0 ? d->rope_freq_scale : 1.0;
		for (uint32_t t = 0; t < n_tok; t++)
			for (int h = 0; h < N_HEAD_KV; h++) {
				double *r = raw + (((size_t)l * n_tok + t) * N_HEAD_KV + h) * HD;
				uint16_t *k = slot_k(&f, pages[t / BS], l, (int)(t % BS)) + h * HD;
				uint16_t *vv = k + f.kv.layout.v_offset / 2;
				for (int i = 0; i < HD; i++) {
					r[i] = 2.0 * drand();
					v[i] = r[i];
				}
				rope_ref(v, pos0 + (int)t, th, sc, ext ? f.ff : NULL, st);
				for (int i = 0; i < HD; i++) {
					k[i] = to16((float)v[i]);
					vv[i] = vals[(((size_t)l * n_tok + t) * N_HEAD_KV + h) * HD + i] = to16((float)drand());
				}
			}
	}
	/* a slot past n_tok in the last page must not move */
	uint16_t sentinel = 0x3c00;
	if (n_tok % BS)
		*slot_k(&f, pages[n_tok / BS], 0, (int)(n_tok % BS)) = sentinel;

	assert_int_equal(cpu_kv_shift(&f.w, &f.kv, pages, np, n_tok, delta), 0);

	for (int l = 0; l < N_LAYER; l++) {
		const struct kvd_layer_desc *d = &f.layers[l].d;
		double th = d->rope_theta > 0 ? d->rope_theta : f.w.hp.rope_theta;
		double sc = d->rope_freq_scale > 0 ? d->rope_freq_scale : 1.0;
		for (uint32_t t = 0; t < n_tok; t++)
			for (int h = 0; h < N_HEAD_KV; h++) {
				const double *r = raw + (((size_t)l * n_tok + t) * N_HEAD_KV + h) * HD;
				const uint16_t *k = slot_k(&f, pages[t / BS], l, (int)(t % BS)) + h * HD;
				const uint16_t *vv = k + f.kv.layout.v_offset / 2;
				memcpy(v, r, sizeof(v));
				rope_ref(v, pos0 + (int)t + delta, th, sc, ext ? f.ff : NULL, st);
				for (int i = 0; i < HD; i++) {
					/* |v| <= 2 sqrt(2): two roundings to the type and a
					 * float rotation stay within 3 half-ulps of 2^2 */
					double e = fabs(from16(k[i]) - v[i]);
					if (e > worst)
						worst = e;
					assert_int_equal(vv[i], vals[(((size_t)l * n_tok + t) * N_HEAD_KV + h) * HD + i]);
				}
			}
	}
	assert_true(worst < 3.0 * ulp * 4.0);
	/* and not trivially: a zero shift of the angles would miss by far */
	if (n_tok % BS)
		assert_int_equal(*slot_k(&f, pages[n_tok / BS], 0, (int)(n_tok % BS)), sentinel);
	free(raw);
	free(vals);
	free(f.pool);
}

static void check_shift(enum kvd_rope_style st, int ext, int pos0, int delta, uint32_t n_tok)
{
	check_shift_t(st, ext, pos0, delta, n_tok, 0);
}

/* a bf16 cache: the same rotation, rounded to bfloat16 */
static void test_shift_bf16(void **state)
{
	(void)state;
	check_shift_t(KVD_ROPE_NORM, 1, 37, -20, 14, 1);
	check_shift_t(KVD_ROPE_NEOX, 0, 500, -480, 13, 1);
}

static void test_shift_normal(void **state)
{
	(void)state;
	check_shift(KVD_ROPE_NORM, 0, 37, -20, 14);
	check_shift(KVD_ROPE_NORM, 0, 0, 1000, 16);
}

static void test_shift_neox(void **state)
{
	(void)state;
	check_shift(KVD_ROPE_NEOX, 0, 500, -480, 13);
}

static void test_shift_scaled_freqs(void **state)
{
	(void)state;
	check_shift(KVD_ROPE_NORM, 1, 300, -256, 15);
	check_shift(KVD_ROPE_NEOX, 1, 4096, -4000, 9);
}

/* The shift is what a direct rotation gives, so shifting and shifting back
 * returns the keys within rounding, while one shift moves them far. */
static void test_shift_moves(void **state)
{
	struct fixture f;
	const int32_t pages[] = {2};
	(void)state;
	setup_fixture(&f, KVD_ROPE_NORM, 0, 0);
	uint16_t *k = slot_k(&f, 2, 1, 0);
	uint16_t orig[HD];
	for (int i = 0; i < HD; i++)
		k[i] = orig[i] = cpu_f32_to_fp16((float)drand());
	assert_int_equal(cpu_kv_shift(&f.w, &f.kv, pages, 1, 1, 7), 0);
	double moved = 0, back = 0;
	for (int i = 0; i < HD; i++)
		moved += fabs(cpu_fp16_to_f32(k[i]) - cpu_fp16_to_f32(orig[i]));
	assert_true(moved > 0.1);
	assert_int_equal(cpu_kv_shift(&f.w, &f.kv, pages, 1, 1, -7), 0);
	for (int i = 0; i < HD; i++)
		back = fmax(back, fabs(cpu_fp16_to_f32(k[i]) - cpu_fp16_to_f32(orig[i])));
	assert_true(back < 4 * 0x1p-11);
	free(f.pool);
}

static void test_shift_refusals(void **state)
{
	struct fixture f;
	const int32_t ok[] = {0, 1}, bad[] = {0, N_PAGES}, neg[] = {-1};
	(void)state;
	setup_fixture(&f, KVD_ROPE_NORM, 0, 0);
	assert_int_equal(cpu_kv_shift(&f.w, &f.kv, ok, 2, 2 * BS + 1, 3), -EINVAL);
	assert_int_equal(cpu_kv_shift(&f.w, &f.kv, bad, 2, BS + 1, 3), -EINVAL);
	assert_int_equal(cpu_kv_shift(&f.w, &f.kv, neg, 1, 1, 3), -EINVAL);
	assert_int_equal(cpu_kv_shift(&f.w, &f.kv, ok, 2, 2 * BS, 0), 0);
	/* a row that is not kv_dim halves: a quantized KV type */
	f.kv.layout.token_stride = (size_t)f.kv.layout.kv_dim / 32 * 34;
	assert_int_equal(cpu_kv_shift(&f.w, &f.kv, ok, 2, 2, 3), -ENOTSUP);
	/* q8_0 rows: not re-rotated (a shift would quantize them again) */
	f.kv.layout.type = KVD_KV_Q8_0;
	assert_int_equal(cpu_kv_shift(&f.w, &f.kv, ok, 2, 2, 3), -ENOTSUP);
	assert_false(cpu_kv_shift_supports(KVD_KV_Q8_0) || cpu_kv_shift_supports(KVD_KV_Q4_0));
	free(f.pool);
}

/* f32 rows: the shifted key is the key rotated at the new position, within
 * float rounding of one extra rotation. */
static void test_shift_f32(void **state)
{
	struct fixture f;
	const int32_t pages[] = {3, 1};
	const int pos0 = 300, delta = -256;
	uint32_t n_tok = 2 * BS - 3;
	double v[HD], worst = 0;

	(void)state;
	assert_true(cpu_kv_shift_supports(KVD_KV_F32));
	setup_fixture(&f, KVD_ROPE_NEOX, 1, 0);
	assert_int_equal(kvd_kv_layout_init_type(&f.kv.layout, &f.w.hp, BS, KVD_KV_F32), 0);
	free(f.pool);
	f.pool = calloc(N_PAGES, f.kv.layout.page_bytes);
	assert_non_null(f.pool);
	f.kv.base = f.pool;
	double *raw = malloc((size_t)N_LAYER * n_tok * N_HEAD_KV * HD * sizeof(double));
	assert_non_null(raw);
	for (int pass = 0; pass < 2; pass++)
		for (int l = 0; l < N_LAYER; l++) {
			const struct kvd_layer_desc *d = &f.layers[l].d;
			double th = d->rope_theta > 0 ? d->rope_theta : f.w.hp.rope_theta;
			double sc = d->rope_freq_scale > 0 ? d->rope_freq_scale : 1.0;
			for (uint32_t t = 0; t < n_tok; t++)
				for (int h = 0; h < N_HEAD_KV; h++) {
					double *r = raw + (((size_t)l * n_tok + t) * N_HEAD_KV + h) * HD;
					float *k = (float *)((char *)f.pool + (size_t)pages[t / BS] * f.kv.layout.page_bytes +
							     (size_t)l * f.kv.layout.layer_stride +
							     (size_t)(t % BS) * f.kv.layout.token_stride) + h * HD;
					if (pass == 0)
						for (int i = 0; i < HD; i++)
							r[i] = 2.0 * drand();
					memcpy(v, r, sizeof(v));
					rope_ref(v, pos0 + (int)t + (pass ? delta : 0), th, sc, f.ff, KVD_ROPE_NEOX);
					for (int i = 0; i < HD; i++) {
						if (pass == 0)
							k[i] = (float)v[i];
						else if (fabs(k[i] - v[i]) > worst)
							worst = fabs(k[i] - v[i]);
					}
				}
			if (pass == 0 && l == N_LAYER - 1)
				assert_int_equal(cpu_kv_shift(&f.w, &f.kv, pages, 2, n_tok, delta), 0);
		}
	assert_true(worst < 1e-5);
	free(raw);
	free(f.pool);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_shift_normal),
		cmocka_unit_test(test_shift_bf16),
		cmocka_unit_test(test_shift_f32),
		cmocka_unit_test(test_shift_neox),
		cmocka_unit_test(test_shift_scaled_freqs),
		cmocka_unit_test(test_shift_moves),
		cmocka_unit_test(test_shift_refusals),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
