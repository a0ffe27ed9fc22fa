/*
 * tests/unit/test_cpu_ops.c — the CPU backend's numeric building blocks:
 * half-float conversions (exhaustively), activation quantization, and every
 * SIMD dot product against the portable version and against a float64
 * computation from dequantized weights.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cpu/ops.h"

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint32_t next_u32(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return (uint32_t)(rng >> 11);
}
static float frand(void) { return (float)next_u32() / 2147483648.0f - 1.0f; }

/* Every half value converts to float and back unchanged (NaNs stay NaN). */
static void test_fp16_roundtrip_exhaustive(void **state)
{
	(void)state;
	for (uint32_t h = 0; h < 65536; h++) {
		float f = fp16_to_f32((uint16_t)h);
		if (isnan(f)) {
			assert_true(isnan(fp16_to_f32(f32_to_fp16(f))));
			continue;
		}
		assert_int_equal(f32_to_fp16(f), h);
	}
}

/* float -> half rounds to nearest even, including ties and subnormals. */
static void test_fp16_rounding(void **state)
{
	(void)state;
	assert_int_equal(f32_to_fp16(1.0f), 0x3c00);
	/* 1 + 2^-11 is halfway between 1 and 1 + 2^-10: ties to even (1.0) */
	assert_int_equal(f32_to_fp16(1.0f + 0x1p-11f), 0x3c00);
	/* 1 + 3 * 2^-11 is halfway between 1+2^-10 and 1+2^-9: to even (1+2^-9) */
	assert_int_equal(f32_to_fp16(1.0f + 3 * 0x1p-11f), 0x3c02);
	assert_int_equal(f32_to_fp16(65504.0f), 0x7bff);
	assert_int_equal(f32_to_fp16(65520.0f), 0x7c00); /* rounds up to inf */
	assert_int_equal(f32_to_fp16(0x1p-24f), 0x0001); /* smallest subnormal */
	assert_int_equal(f32_to_fp16(0x1p-25f), 0x0000); /* tie to even: zero */
	assert_int_equal(f32_to_fp16(-2.0f), 0xc000);
	/* against the hardware conversion on random values, when present */
	struct cpu_kernels k;
	cpu_kernels_init(&k, 0);
	for (int i = 0; i < 200000; i++) {
		float f = frand() * (float)(1 << (next_u32() % 20)) * 0x1p-8f;
		uint16_t a, b;
		k.store_f16(&a, &f, 1);
		b = f32_to_fp16(f);
		float src[8] = {f, f, f, f, f, f, f, f};
		uint16_t dst[8];
		k.store_f16(dst, src, 8); /* vector path */
		assert_int_equal(a, b);
		assert_int_equal(dst[3], b);
	}
}

static void test_bf16(void **state)
{
	(void)state;
	assert_true(bf16_to_f32(0x3f80) == 1.0f);
	assert_true(bf16_to_f32(0xc040) == -3.0f);
}

/* q8 quantization: |x - q*d| <= d/2, sums consistent, SIMD == portable. */
static void test_quantize_q8(void **state)
{
	struct cpu_kernels kg, kv;
	(void)state;
	cpu_kernels_init(&kg, 1);
	cpu_kernels_init(&kv, 0);
	for (int it = 0; it < 1000; it++) {
		float x[256];
		struct q8_block a[28], b[28]; /* q8_row_len(256) */
		float scale = (float)(next_u32() % 1000) * 0.01f;
		for (int i = 0; i < 256; i++)
			x[i] = frand() * scale;
		if (it == 0)
			memset(x, 0, sizeof(x));
		kg.quantize_q8(x, a, 256);
		kv.quantize_q8(x, b, 256);
		assert_memory_equal(a, b, sizeof(a));
		for (int bl = 0; bl < 8; bl++) {
			int sum = 0;
			for (int i = 0; i < 32; i++) {
				float err = fabsf(x[bl * 32 + i] - a[bl].q[i] * a[bl].d);
				assert_true(err <= a[bl].d * 0.5f * 1.0001f + 1e-30f);
				assert_true(a[bl].q[i] >= -127 && a[bl].q[i] <= 127);
				sum += a[bl].q[i];
			}
			assert_true(a[bl].s == a[bl].d * (float)sum);
		}
	}
}

static void fill_weights(enum kvd_wtype t, void *w, int64_t n)
{
	uint8_t *p = w;
	size_t bytes = kvd_wtype_row_bytes(t, n);
	for (size_t i = 0; i < bytes; i++)
		p[i] = (uint8_t)next_u32();
	/* keep scales finite and modest */
	if (t == KVD_WTYPE_Q4_0 || t == KVD_WTYPE_Q8_0 || t == KVD_WTYPE_Q4_1) {
		size_t bb = bytes / (size_t)(n / 32);
		for (int64_t b = 0; b < n / 32; b++) {
			uint16_t d = f32_to_fp16(frand() * 0.05f);
			memcpy(p + b * bb, &d, 2);
			if (t == KVD_WTYPE_Q4_1) {
				uint16_t m = f32_to_fp16(frand() * 0.1f);
				memcpy(p + b * bb + 2, &m, 2);
			}
		}
	} else if (t == KVD_WTYPE_F16) {
		uint16_t *h = w;
		for (int64_t i = 0; i < n; i++)
			h[i] = f32_to_fp16(frand());
	} else if (t == KVD_WTYPE_BF16) {
		uint16_t *h = w;
		for (int64_t i = 0; i < n; i++) {
			float f = frand();
			uint32_t u;
			memcpy(&u, &f, 4);
			h[i] = (uint16_t)(u >> 16);
		}
	} else {
		float *f = w;
		for (int64_t i = 0; i < n; i++)
			f[i] = frand();
	}
}

/* Each dot product matches a float64 dot of the dequantized row with the
 * (dequantized, for quantized types) activations, on both code paths. */
static void test_dot_products(void **state)
{
	const enum kvd_wtype types[] = {KVD_WTYPE_F32, KVD_WTYPE_F16, KVD_WTYPE_BF16,
					KVD_WTYPE_Q4_0, KVD_WTYPE_Q4_1, KVD_WTYPE_Q8_0};
	struct cpu_kernels kg, kv;
	(void)state;
	cpu_kernels_init(&kg, 1);
	cpu_kernels_init(&kv, 0);
	for (size_t ti = 0; ti < sizeof(types) / sizeof(types[0]); ti++) {
		enum kvd_wtype t = types[ti];
		for (int it = 0; it < 200; it++) {
			int64_t n = 32 * (1 + next_u32() % 24);
			uint8_t w[24 * 32 * 4];
			float x[24 * 32], wf[24 * 32];
			struct q8_block xq[84]; /* q8_row_len(768) */
			fill_weights(t, w, n);
			for (int64_t i = 0; i < n; i++)
				x[i] = frand();
			kg.quantize_q8(x, xq, n);
			dequantize_row(t, w, wf, n);
			double ref = 0, mag = 0;
			for (int64_t i = 0; i < n; i++) {
				double xi = wtype_is_quantized(t) ? xq[i / 32].q[i % 32] * (double)xq[i / 32].d : x[i];
				ref += (double)wf[i] * xi;
				mag += fabs((double)wf[i] * xi);
			}
			float a = kg.dot[t](w, x, xq, n), b = kv.dot[t](w, x, xq, n);
			double tol = 1e-5 * mag + 1e-6;
			if (fabs(a - ref) > tol || fabs(b - ref) > tol)
				fail_msg("%s n=%lld: generic %g, %s %g, float64 %g", kvd_wtype_name(t), (long long)n, a,
					 kv.isa, b, ref);
		}
	}
}

/* Tiled kernels: every (row, token) result is bit-identical for every tile
 * shape, and close to the portable dot product. */
static void test_gemm_tiles(void **state)
{
	const enum kvd_wtype types[] = {KVD_WTYPE_Q4_0, KVD_WTYPE_Q4_1, KVD_WTYPE_Q8_0};
	struct cpu_kernels kg, kv;
	(void)state;
	cpu_kernels_init(&kg, 1);
	memset(&kv, 0, sizeof(kv));
	if (!cpu_kernels_init_gemm_avx512(&kv))
		skip();
	for (size_t ti = 0; ti < sizeof(types) / sizeof(types[0]); ti++) {
		enum kvd_wtype t = types[ti];
		for (int it = 0; it < 60; it++) {
			int64_t n = 32 * (1 + next_u32() % 24);
			size_t rb = kvd_wtype_row_bytes(t, n);
			uint8_t w[GEMM_R * 24 * 34];
			float x[GEMM_C][24 * 32];
			struct q8_block xq[GEMM_C][84]; /* rows of q8_row_len(768) */
			float full[GEMM_C][GEMM_R];
			for (int r = 0; r < GEMM_R; r++)
				fill_weights(t, w + r * rb, n);
			for (int c = 0; c < GEMM_C; c++) {
				for (int64_t i = 0; i < n; i++)
					x[c][i] = frand();
				kg.quantize_q8(x[c], xq[c], n);
			}
			kv.gemm[t](w, rb, GEMM_R, &xq[0][0], 84, GEMM_C, n, &full[0][0], GEMM_R);
			for (int R = 1; R <= GEMM_R; R++)
				for (int C = 1; C <= GEMM_C; C++)
					for (int r0 = 0; r0 + R <= GEMM_R; r0++)
						for (int c0 = 0; c0 + C <= GEMM_C; c0++) {
							float part[GEMM_C][GEMM_R];
							kv.gemm[t](w + r0 * rb, rb, R, &xq[c0][0], 84, C, n, &part[0][0], GEMM_R);
							for (int c = 0; c < C; c++)
								assert_memory_equal(&part[c][0], &full[c0 + c][r0],
										    sizeof(float) * (size_t)R);
						}
			for (int c = 0; c < GEMM_C; c++)
				for (int r = 0; r < GEMM_R; r++) {
					float ref = kg.dot[t](w + r * rb, x[c], xq[c], n);
					if (fabsf(ref - full[c][r]) > 1e-4f * (1 + fabsf(ref)))
						fail_msg("%s n=%lld (%d,%d): %g vs portable %g", kvd_wtype_name(t),
							 (long long)n, r, c, full[c][r], ref);
				}
		}
	}
}

static void test_attention_helpers(void **state)
{
	struct cpu_kernels kg, kv;
	(void)state;
	cpu_kernels_init(&kg, 1);
	cpu_kernels_init(&kv, 0);
	for (int it = 0; it < 500; it++) {
		int n = 1 + (int)(next_u32() % 130);
		float q[130], y1[130], y2[130];
		uint16_t k[130];
		double ref = 0;
		for (int i = 0; i < n; i++) {
			q[i] = frand();
			k[i] = f32_to_fp16(frand());
			ref += (double)q[i] * fp16_to_f32(k[i]);
			y1[i] = y2[i] = frand();
		}
		assert_true(fabs(kg.dot_f32_f16(q, k, n) - ref) < 1e-4);
		assert_true(fabs(kv.dot_f32_f16(q, k, n) - ref) < 1e-4);
		kg.axpy_f16(y1, 0.5f, k, n);
		kv.axpy_f16(y2, 0.5f, k, n);
		for (int i = 0; i < n; i++)
			assert_true(fabsf(y1[i] - y2[i]) < 1e-6f);
		/* four rows at once: each equals its own dot product */
		const uint16_t *rows[4] = {k, k, k, k};
		uint16_t k2[130];
		for (int i = 0; i < n; i++)
			k2[i] = f32_to_fp16(frand());
		rows[2] = k2;
		float o4g[4], o4v[4];
		kg.dot4_f32_f16(q, rows, n, o4g);
		kv.dot4_f32_f16(q, rows, n, o4v);
		for (int j = 0; j < 4; j++) {
			double rj = 0;
			for (int i = 0; i < n; i++)
				rj += (double)q[i] * fp16_to_f32(rows[j][i]);
			assert_true(fabs(o4g[j] - rj) < 1e-4);
			assert_true(fabs(o4v[j] - rj) < 1e-4);
		}
		/* one V row into three accumulators */
		float acc_g[3 * 130], acc_v[3 * 130], w3[3] = {0.25f, -1.5f, 2.0f};
		for (int i = 0; i < 3 * n; i++)
			acc_g[i] = acc_v[i] = frand();
		kg.axpyn_f16(acc_g, n, w3, 3, k, n);
		kv.axpyn_f16(acc_v, n, w3, 3, k, n);
		for (int i = 0; i < 3 * n; i++)
			assert_true(fabsf(acc_g[i] - acc_v[i]) < 1e-5f);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_fp16_roundtrip_exhaustive),
		cmocka_unit_test(test_fp16_rounding),
		cmocka_unit_test(test_bf16),
		cmocka_unit_test(test_quantize_q8),
		cmocka_unit_test(test_dot_products),
		cmocka_unit_test(test_gemm_tiles),
		cmocka_unit_test(test_attention_helpers),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
