/*
 * tests/unit/test_cpu_ops.c — the CPU backend's numeric building blocks:
 * half-float conversions (exhaustively), activation quantization, and every
 * SIMD dot product against the portable version and against a float64
 * computation from dequantized weights.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cpu/attention.h"
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
		float f = cpu_fp16_to_f32((uint16_t)h);
		if (isnan(f)) {
			assert_true(isnan(cpu_fp16_to_f32(cpu_f32_to_fp16(f))));
			continue;
		}
		assert_int_equal(cpu_f32_to_fp16(f), h);
	}
}

/* float -> half rounds to nearest even, including ties and subnormals. */
static void test_fp16_rounding(void **state)
{
	(void)state;
	assert_int_equal(cpu_f32_to_fp16(1.0f), 0x3c00);
	/* 1 + 2^-11 is halfway between 1 and 1 + 2^-10: ties to even (1.0) */
	assert_int_equal(cpu_f32_to_fp16(1.0f + 0x1p-11f), 0x3c00);
	/* 1 + 3 * 2^-11 is halfway between 1+2^-10 and 1+2^-9: to even (1+2^-9) */
	assert_int_equal(cpu_f32_to_fp16(1.0f + 3 * 0x1p-11f), 0x3c02);
	assert_int_equal(cpu_f32_to_fp16(65504.0f), 0x7bff);
	assert_int_equal(cpu_f32_to_fp16(65520.0f), 0x7c00); /* rounds up to inf */
	assert_int_equal(cpu_f32_to_fp16(0x1p-24f), 0x0001); /* smallest subnormal */
	assert_int_equal(cpu_f32_to_fp16(0x1p-25f), 0x0000); /* tie to even: zero */
	assert_int_equal(cpu_f32_to_fp16(-2.0f), 0xc000);
	/* against the hardware conversion on random values, when present */
	struct cpu_kernels k;
	cpu_kernels_init(&k, 0);
	for (int i = 0; i < 200000; i++) {
		float f = frand() * (float)(1 << (next_u32() % 20)) * 0x1p-8f;
		uint16_t a, b;
		k.store_f16(&a, &f, 1);
		b = cpu_f32_to_fp16(f);
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
	assert_true(cpu_bf16_to_f32(0x3f80) == 1.0f);
	assert_true(cpu_bf16_to_f32(0xc040) == -3.0f);
}

/* q8 quantization: |x - q*d| <= d/2, sums consistent, SIMD == portable;
 * quantize_q8 with a scale per block of 32 (max |x| / 127 of its own),
 * quantize_q8k with one per 256 (and per shorter tail), every block of
 * the span holding it. */
static void test_quantize_q8(void **state)
{
	struct cpu_kernels kg, kv;
	(void)state;
	assert_int_equal(q8_row_len(256), 10);
	assert_int_equal(q8_row_len(768), 29);
	assert_int_equal(q8_row_len(320), 12);
	cpu_kernels_init(&kg, 1);
	cpu_kernels_init(&kv, 0);
	for (int it = 0; it < 2000; it++) {
		const int kform = it & 1, n = it % 3 == 2 ? 320 : 256, nb = n / 32;
		float x[320];
		struct q8_block a[12], b[12]; /* q8_row_len(320) */
		float scale = (float)(next_u32() % 1000) * 0.01f;
		for (int i = 0; i < n; i++)
			x[i] = frand() * scale;
		if (it < 2)
			memset(x, 0, sizeof(x));
		memset(a, 0, sizeof(a));
		memset(b, 0xa5, sizeof(b));
		(kform ? kg.quantize_q8k : kg.quantize_q8)(x, a, n);
		(kform ? kv.quantize_q8k : kv.quantize_q8)(x, b, n);
		assert_memory_equal(a, b, (size_t)nb * sizeof(a[0]) + 2 * (size_t)nb * sizeof(int32_t));
		for (int bl = 0; bl < nb; bl++) {
			/* the span's scale: max |x| over it / 127 */
			int s0 = kform ? bl / 8 * 8 : bl, s1 = kform ? (s0 + 8 < nb ? s0 + 8 : nb) : bl + 1;
			float amax = 0;
			for (int i = 32 * s0; i < 32 * s1; i++)
				amax = fmaxf(amax, fabsf(x[i]));
			assert_true(a[bl].d == amax / 127.0f);
			int sum = 0;
			for (int i = 0; i < 32; i++) {
				if (i == 16)
					assert_int_equal(q8_row_half_sums(a, nb)[bl], sum);
				float err = fabsf(x[bl * 32 + i] - a[bl].q[i] * a[bl].d);
				assert_true(err <= a[bl].d * 0.5f * 1.0001f + 1e-30f);
				assert_true(a[bl].q[i] >= -127 && a[bl].q[i] <= 127);
				sum += a[bl].q[i];
			}
			assert_true(a[bl].s == a[bl].d * (float)sum);
			assert_int_equal(q8_row_sums(a, nb)[bl], sum);
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
	if (t == KVD_WTYPE_Q4_0 || t == KVD_WTYPE_Q8_0 || t == KVD_WTYPE_Q4_1 || t == KVD_WTYPE_Q5_0 ||
	    t == KVD_WTYPE_Q5_1) {
		size_t bb = bytes / (size_t)(n / 32);
		for (int64_t b = 0; b < n / 32; b++) {
			uint16_t d = cpu_f32_to_fp16(frand() * 0.05f);
			memcpy(p + b * bb, &d, 2);
			if (t == KVD_WTYPE_Q4_1 || t == KVD_WTYPE_Q5_1) {
				uint16_t m = cpu_f32_to_fp16(frand() * 0.1f);
				memcpy(p + b * bb + 2, &m, 2);
			}
		}
	} else if (t == KVD_WTYPE_Q4_K || t == KVD_WTYPE_Q5_K || t == KVD_WTYPE_Q6_K) {
		size_t bb = bytes / (size_t)(n / 256);
		for (int64_t b = 0; b < n / 256; b++) {
			uint16_t d = cpu_f32_to_fp16(frand() * 0.002f), dmin = cpu_f32_to_fp16(frand() * 0.004f);
			memcpy(p + b * bb + (t == KVD_WTYPE_Q6_K ? 208 : 0), &d, 2);
			if (t != KVD_WTYPE_Q6_K)
				memcpy(p + b * bb + 2, &dmin, 2);
		}
	} else if (t == KVD_WTYPE_F16) {
		uint16_t *h = w;
		for (int64_t i = 0; i < n; i++)
			h[i] = cpu_f32_to_fp16(frand());
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
	const enum kvd_wtype types[] = {KVD_WTYPE_F32,  KVD_WTYPE_F16,  KVD_WTYPE_BF16, KVD_WTYPE_Q4_0,
					KVD_WTYPE_Q4_1, KVD_WTYPE_Q5_0, KVD_WTYPE_Q5_1, KVD_WTYPE_Q8_0,
					KVD_WTYPE_Q4_K, KVD_WTYPE_Q5_K, KVD_WTYPE_Q6_K};
	struct cpu_kernels kg, kv;
	(void)state;
	cpu_kernels_init(&kg, 1);
	cpu_kernels_init(&kv, 0);
	for (size_t ti = 0; ti < sizeof(types) / sizeof(types[0]); ti++) {
		enum kvd_wtype t = types[ti];
		for (int it = 0; it < 200; it++) {
			int kq = t == KVD_WTYPE_Q4_K || t == KVD_WTYPE_Q5_K || t == KVD_WTYPE_Q6_K;
			int64_t n = kq ? 256 * (1 + next_u32() % 3) : 32 * (1 + next_u32() % 24);
			uint8_t w[24 * 32 * 4];
			float x[24 * 32], wf[24 * 32];
			struct q8_block xq[29]; /* q8_row_len(768) */
			fill_weights(t, w, n);
			for (int64_t i = 0; i < n; i++)
				x[i] = frand();
			(kq ? kg.quantize_q8k : kg.quantize_q8)(x, xq, n);
			cpu_dequantize_row(t, w, wf, n);
			double ref = 0, mag = 0;
			for (int64_t i = 0; i < n; i++) {
				double xi = wtype_is_quantized(t) ? xq[i / 32].q[i % 32] * (double)xq[i / 32].d : x[i];
				ref += (double)wf[i] * xi;
				mag += fabs((double)wf[i] * xi);
			}
			float a = kg.dot[t](w, x, xq, n), b = kv.dot[t](w, x, xq, n);
			double tol = 1e-5 * mag + 1e-6;
			/* the vector K-quant dots repeat the portable arithmetic */
			if (kq && a != b)
				fail_msg("%s n=%lld: generic %.9g, %s %.9g: not bit-identical", kvd_wtype_name(t), (long long)n,
					 a, kv.isa, b);
			if (fabs(a - ref) > tol || fabs(b - ref) > tol)
				fail_msg("%s n=%lld: generic %g, %s %g, float64 %g", kvd_wtype_name(t), (long long)n, a,
					 kv.isa, b, ref);
		}
	}
}

/* Packing: a group block holds lane r's bytes where the kernels expect
 * them (checked through the scales and the first quant vector), and rows
 * past the matrix's end are zero. q6_K split into 4 + 2 bits takes the
 * file's bytes, widened 1.3 times as many; q5_K split into 4 + 1, 2.5 %
 * more than the file's. */
static void test_gemm_pack_layout(void **state)
{
	(void)state;
	assert_int_equal(cpu_gemm_packed_bytes(KVD_WTYPE_Q6_K, 32, 512, CPU_PACK_Q6_SPLIT),
			 kvd_wtype_row_bytes(KVD_WTYPE_Q6_K, 512) * 32);
	assert_int_equal(cpu_gemm_packed_bytes(KVD_WTYPE_Q6_K, 32, 512, 0), 2 * 2 * (8 * 512 + 256 + 32));
	assert_int_equal(cpu_gemm_packed_bytes(KVD_WTYPE_Q5_K, 32, 512, CPU_PACK_Q5_SPLIT), 2 * 2 * (8 * 320 + 256 + 64));
	for (int t = KVD_WTYPE_Q4_0; t <= KVD_WTYPE_Q8_0; t++) {
		if (!cpu_gemm_group_block_bytes((enum kvd_wtype)t, 0))
			continue;
		int64_t rows = 19, n = 64;
		size_t rb = kvd_wtype_row_bytes((enum kvd_wtype)t, n), gb = cpu_gemm_group_block_bytes((enum kvd_wtype)t, 0);
		uint8_t w[19 * 68], p[2 * 2 * GEMM_ROWS * 36];
		assert_int_equal(cpu_gemm_packed_bytes((enum kvd_wtype)t, rows, n, 0), 2 * 2 * gb);
		for (size_t i = 0; i < rows * rb; i++)
			w[i] = (uint8_t)next_u32();
		memset(p, 0x5a, sizeof(p));
		cpu_gemm_pack((enum kvd_wtype)t, w, rb, rows, n, p, 0);
		int q51 = t == KVD_WTYPE_Q5_1;
		int nq = t == KVD_WTYPE_Q8_0 || t == KVD_WTYPE_Q5_0 || q51 ? 8 : 4, hdr = t == KVD_WTYPE_Q4_1 ? 4 : 2;
		for (int64_t r = 0; r < 2 * GEMM_ROWS; r++)
			for (int b = 0; b < 2; b++) {
				const uint8_t *gblk = p + ((size_t)(r / GEMM_ROWS) * 2 + (size_t)b) * gb;
				const uint8_t *src = w + (size_t)r * rb + (size_t)b * (rb / 2);
				int lane = (int)(r % GEMM_ROWS);
				uint16_t d;
				memcpy(&d, gblk + 64 * nq + 2 * lane, 2);
				uint8_t q5[32];
				if ((t == KVD_WTYPE_Q5_0 || q51) && r < rows)
					cpu_q5_block_quants(src + 2 + 2 * q51, src + 6 + 2 * q51, q5);
				for (int i = 0; i < 4; i++) {
					uint8_t want = r < rows ? src[hdr + i] : 0;
					if (t == KVD_WTYPE_Q5_0 && r < rows) /* converted to q8_0 */
						want = (uint8_t)((q5[i] - 16) ^ 0x80);
					else if (q51 && r < rows) /* its quants as bytes */
						want = q5[i];
					else if (t == KVD_WTYPE_Q8_0 && r < rows)
						want ^= 0x80;
					assert_int_equal(gblk[4 * lane + i], want);
				}
				assert_int_equal(d, r < rows ? (uint16_t)(src[0] | src[1] << 8) : 0);
			}
	}
}

/* every type with tiled kernels */
static const enum kvd_wtype tile_types[] = {KVD_WTYPE_Q4_0, KVD_WTYPE_Q4_1, KVD_WTYPE_Q5_0, KVD_WTYPE_Q5_1,
					    KVD_WTYPE_Q8_0, KVD_WTYPE_Q4_K, KVD_WTYPE_Q5_K, KVD_WTYPE_Q6_K,
					    KVD_WTYPE_F32,  KVD_WTYPE_F16,  KVD_WTYPE_BF16};
#define N_TILE_TYPES (sizeof(tile_types) / sizeof(tile_types[0]))

/* One tile of the test's matrices (3 groups, activations 29 q8 blocks or
 * 768 floats apart) through the quantized or the float kernel. */
static void tile_call(const struct cpu_kernels *kv, enum kvd_wtype t, const uint8_t *wp, int64_t nb, int R,
		      const struct q8_block *xq, const float *x, int C, float *y)
{
	if (wtype_is_quantized(t))
		kv->gemm[t](wp, nb, R, xq, 29, C, y, 3 * GEMM_ROWS);
	else
		kv->gemmf[t](wp, nb, R, x, 24 * 32, C, y, 3 * GEMM_ROWS);
}

/* Tiled kernels: every (row, token) result is bit-identical for every
 * number of tokens and valid rows, and close to the portable dot product
 * on the stored weights. */
static void gemm_tiles(struct cpu_kernels *kv, const float *want, float *keep)
{
	enum { NR = 2 * GEMM_ROWS + 5, NC = GEMM_COLS + 3, LDQ = 29 /* q8_row_len(768) */ };
	struct cpu_kernels kg;
	cpu_kernels_init(&kg, 1);
	rng = 0x2545f4914f6cdd1dull; /* the same data for every kernel set */
	static uint8_t w[NR * 24 * 32 * 4], wp[3 * 24 * GEMM_ROWS * 32 * 4];
	static float x[NC][24 * 32], full[NC][3 * GEMM_ROWS], part[NC][3 * GEMM_ROWS];
	static struct q8_block xq[NC][LDQ];
	for (size_t ti = 0; ti < N_TILE_TYPES; ti++) {
		enum kvd_wtype t = tile_types[ti];
		int kq = t == KVD_WTYPE_Q4_K || t == KVD_WTYPE_Q5_K || t == KVD_WTYPE_Q6_K;
		assert_true(kv->gemm[t] || kv->gemmf[t]);
		for (int it = 0; it < 40; it++) {
			int64_t n = kq ? 256 * (1 + next_u32() % 3) : 32 * (1 + next_u32() % 24), nb = n / 32;
			size_t rb = kvd_wtype_row_bytes(t, n), gbytes = cpu_gemm_group_block_bytes(t, kv->pack_flags) * (size_t)nb;
			for (int r = 0; r < NR; r++)
				fill_weights(t, w + r * rb, n);
			cpu_gemm_pack(t, w, rb, NR, n, wp, kv->pack_flags);
			/* the stored rows come back from the packed copy, byte for
			 * byte, for the types whose packing keeps them */
			for (int r = 0; r < NR; r++) {
				static uint8_t back[24 * 32 * 4];
				int keeps = t == KVD_WTYPE_Q4_0 || t == KVD_WTYPE_Q4_1 || t == KVD_WTYPE_Q8_0 ||
					    t == KVD_WTYPE_F32 || t == KVD_WTYPE_F16 || t == KVD_WTYPE_BF16;
				assert_int_equal(cpu_gemm_unpack_row(t, wp, n, r, back), keeps ? 0 : -1);
				if (keeps)
					assert_memory_equal(back, w + r * rb, rb);
			}
			for (int c = 0; c < NC; c++) {
				for (int64_t i = 0; i < n; i++)
					x[c][i] = frand();
				/* an all-zero token and a constant one */
				if (c == 1)
					memset(x[c], 0, sizeof(x[c]));
				if (c == 2)
					for (int64_t i = 0; i < n; i++)
						x[c][i] = 0.75f;
				(kq ? kg.quantize_q8k : kg.quantize_q8)(x[c], xq[c], n);
			}
			/* reference: one token at a time, full groups */
			for (int c = 0; c < NC; c++)
				for (int g = 0; g < 3; g++)
					tile_call(kv, t, wp + g * gbytes, nb, GEMM_ROWS, &xq[c][0], x[c], 1, &full[c][g * GEMM_ROWS]);
			for (int C = 1; C <= GEMM_COLS; C++)
				for (int c0 = 0; c0 + C <= NC; c0 += 1 + (C & 1))
					for (int g = 0; g < 3; g++) {
						int R = g == 2 ? NR - 2 * GEMM_ROWS : GEMM_ROWS - (C + c0) % 3;
						memset(part, 0x7f, sizeof(part));
						tile_call(kv, t, wp + g * gbytes, nb, R, &xq[c0][0], x[c0], C,
							  &part[c0][g * GEMM_ROWS]);
						for (int c = c0; c < c0 + C; c++) {
							assert_memory_equal(&part[c][g * GEMM_ROWS], &full[c][g * GEMM_ROWS],
									    sizeof(float) * (size_t)R);
							/* rows past R are left alone */
							if (R < GEMM_ROWS) {
								uint32_t u;
								memcpy(&u, &part[c][g * GEMM_ROWS + R], 4);
								assert_int_equal(u, 0x7f7f7f7fu);
							}
						}
					}
			/* another kernel set gave these bits for the same data */
			if (want) {
				assert_memory_equal(want, full, sizeof(full));
				want += sizeof(full) / sizeof(float);
			}
			if (keep) {
				memcpy(keep, full, sizeof(full));
				keep += sizeof(full) / sizeof(float);
			}
			for (int c = 0; c < NC; c++)
				for (int r = 0; r < NR; r++) {
					float ref = kg.dot[t](w + r * rb, x[c], xq[c], n);
					if (fabsf(ref - full[c][r]) > 1e-4f * (1 + fabsf(ref)))
						fail_msg("%s n=%lld (%d,%d): %g vs portable %g", kvd_wtype_name(t),
							 (long long)n, r, c, full[c][r], ref);
				}
		}
	}
}

/* The AVX-512 and the AVX2 tiled kernels: each against itself and the
 * portable dot product, and the two bit-identical (the results of every
 * case are kept from the first set to compare with the second). */
static void test_gemm_tiles(void **state)
{
	struct cpu_kernels k512, k2;
	int have512, have2;
	(void)state;
	memset(&k512, 0, sizeof(k512));
	memset(&k2, 0, sizeof(k2));
	have512 = cpu_kernels_init_gemm_avx512(&k512);
	have2 = cpu_kernels_init_gemm_avx2(&k2);
	if (!have512 && !have2)
		skip();
	size_t per = (size_t)(GEMM_COLS + 3) * 3 * GEMM_ROWS;
	float *saved = calloc(N_TILE_TYPES * 40 * per, sizeof(float));
	assert_non_null(saved);
	if (have512)
		gemm_tiles(&k512, NULL, saved);
	if (have2)
		gemm_tiles(&k2, have512 ? saved : NULL, NULL);
	free(saved);
}

/* The AMX tiles of 16 tokens (gemm16, two tiles a call): for every type it
 * takes, every
 * (row, token) result bit-identical to the AVX-512 VNNI kernel's for that
 * token alone, for full and partial row groups and K from one block (or
 * super-block) to 24 (or 3). */
static void test_gemm16_amx(void **state)
{
	enum { NR = 2 * GEMM_ROWS + 5, NC = 2 * GEMM16_COLS + 3, LDQ = 29 /* q8_row_len(768) */ };
	struct cpu_kernels k, kg;
	(void)state;
	memset(&k, 0, sizeof(k));
	if (!cpu_kernels_init_gemm_avx512(&k) || !cpu_kernels_init_gemm_amx(&k)) {
		printf("skipped: this CPU (or kernel) offers no AMX-INT8 tiles beside AVX-512 VNNI: nothing to compare\n");
		skip();
	}
	cpu_kernels_init(&kg, 1);
	rng = 0x9e3779b97f4a7c15ull;
	static uint8_t w[NR * 24 * 32 * 4], wp[3 * 24 * GEMM_ROWS * 32 * 4];
	static float x[24 * 32], one[NC][3 * GEMM_ROWS], tile16[NC][3 * GEMM_ROWS];
	static struct q8_block xq[NC][LDQ];
	int checked = 0;
	for (size_t ti = 0; ti < N_TILE_TYPES; ti++) {
		enum kvd_wtype t = tile_types[ti];
		int kq = t == KVD_WTYPE_Q4_K || t == KVD_WTYPE_Q5_K || t == KVD_WTYPE_Q6_K;
		if (!k.gemm[t] || !k.gemm16[t]) /* q6_K, float weights: the VNNI kernel */
			continue;
		for (int it = 0; it < 12; it++) {
			int64_t n = kq ? 256 * (1 + next_u32() % 3) : 32 * (1 + next_u32() % 24), nb = n / 32;
			size_t rb = kvd_wtype_row_bytes(t, n), gbytes = cpu_gemm_group_block_bytes(t, k.pack_flags) * (size_t)nb;
			for (int r = 0; r < NR; r++)
				fill_weights(t, w + r * rb, n);
			cpu_gemm_pack(t, w, rb, NR, n, wp, k.pack_flags);
			for (int c = 0; c < NC; c++) {
				for (int64_t i = 0; i < n; i++)
					x[i] = c == 1 ? 0.0f : c == 2 ? 0.75f : frand() * (c == 5 ? 40.0f : 1.0f);
				(kq ? kg.quantize_q8k : kg.quantize_q8)(x, xq[c], n);
			}
			for (int c = 0; c < NC; c++)
				for (int g = 0; g < 3; g++)
					k.gemm[t](wp + g * gbytes, nb, GEMM_ROWS, xq[c], LDQ, 1, &one[c][g * GEMM_ROWS],
						  3 * GEMM_ROWS);
			for (int c0 = 0; c0 + 2 * GEMM16_COLS <= NC; c0 += 3)
				for (int g = 0; g < 3; g++) {
					int R = g == 2 ? NR - 2 * GEMM_ROWS : GEMM_ROWS - (c0 + it) % 4;
					memset(tile16, 0x7f, sizeof(tile16));
					assert_int_equal(k.gemm16[t](wp + g * gbytes, nb, R, xq[c0], LDQ, 2,
								     &tile16[c0][g * GEMM_ROWS], 3 * GEMM_ROWS), 0);
					for (int c = c0; c < c0 + 2 * GEMM16_COLS; c++) {
						if (memcmp(&tile16[c][g * GEMM_ROWS], &one[c][g * GEMM_ROWS],
							   sizeof(float) * (size_t)R))
							fail_msg("%s n=%lld group %d token %d: AMX tile differs from VNNI",
								 kvd_wtype_name(t), (long long)n, g, c);
						if (R < GEMM_ROWS) {
							uint32_t u;
							memcpy(&u, &tile16[c][g * GEMM_ROWS + R], 4);
							assert_int_equal(u, 0x7f7f7f7fu);
						}
					}
					checked++;
				}
		}
	}
	printf("AMX: %d calls of two tiles of 16 tokens bit-identical to the VNNI kernel\n", checked);
}

/* 128 positions of random K (in [-2, 2)) and V (in [-1, 1)) rows of hd
 * elements stored by to16 (f16 or bf16), and their row pointers. */
static void fill_kv(uint16_t kv[2][128][256], int hd, uint16_t (*to16)(float), const uint16_t **kp,
		    const uint16_t **vp)
{
	for (int p = 0; p < 128; p++) {
		for (int i = 0; i < hd; i++) {
			kv[0][p][i] = to16(frand() * 2.0f);
			kv[1][p][i] = to16(frand());
		}
		kp[p] = kv[0][p];
		vp[p] = kv[1][p];
	}
}

/* The tiled attention kernel: each row's max, sum and weighted V rows
 * match float64, and a row alone gives the same bits as in any tile. */
static void check_attn_rows_as(attn_rows_fn (*kernel_for)(int hd), uint16_t (*to16)(float), float (*from16)(uint16_t))
{
	for (int hd = 64; hd <= 256; hd *= 2) {
		attn_rows_fn fn = kernel_for(hd);
		if (!fn) {
			printf("skipped: no attention kernel of this ISA on this CPU\n");
			skip();
		}
		static uint16_t kv[2][128][256];
		static float q[12][256], o[12][256], o1[256], scratch[ATTN_ROWS_SCRATCH(12, 256)];
		const uint16_t *kp[128], *vp[128];
		for (int it = 0; it < 30; it++) {
			int nr = 1 + (int)(next_u32() % 12), len[12];
			const float *qp[12];
			float ml[12][2], *mlp[12], *op[12], ml1[2], *ml1p = ml1, *o1p = o1;
			float scale = 1.0f / sqrtf((float)hd);
			fill_kv(kv, hd, to16, kp, vp);
			for (int r = 0; r < nr; r++) {
				len[r] = 1 + (int)(next_u32() % 128);
				for (int i = 0; i < hd; i++)
					q[r][i] = frand() * 3.0f;
				qp[r] = q[r];
				mlp[r] = ml[r];
				op[r] = o[r];
			}
			fn(nr, qp, len, kp, vp, scale, mlp, op, scratch);
			for (int r = 0; r < nr; r++) {
				double sc[128], mx = -INFINITY, l = 0;
				for (int p = 0; p < len[r]; p++) {
					double d = 0;
					for (int i = 0; i < hd; i++)
						d += (double)q[r][i] * from16(kv[0][p][i]);
					sc[p] = d * scale;
					mx = sc[p] > mx ? sc[p] : mx;
				}
				for (int p = 0; p < len[r]; p++)
					l += exp(sc[p] - mx);
				assert_true(fabs(ml[r][0] - mx) <= 1e-5 * (1 + fabs(mx)));
				assert_true(fabs(ml[r][1] - l) <= 1e-5 * l);
				for (int i = 0; i < hd; i++) {
					double acc = 0, mag = 0;
					for (int p = 0; p < len[r]; p++) {
						acc += exp(sc[p] - mx) * from16(kv[1][p][i]);
						mag += exp(sc[p] - mx) * fabs(from16(kv[1][p][i]));
					}
					if (fabs(o[r][i] - acc) > 1e-5 * mag + 1e-6)
						fail_msg("hd %d row %d len %d elem %d: %g vs %g", hd, r, len[r], i, o[r][i], acc);
				}
				/* alone */
				fn(1, &qp[r], &len[r], kp, vp, scale, &ml1p, &o1p, scratch);
				assert_memory_equal(ml1, ml[r], sizeof(ml1));
				assert_memory_equal(o1, o[r], sizeof(float) * (size_t)hd);
			}
		}
	}
}

static void check_attn_rows(attn_rows_fn (*kernel_for)(int hd))
{
	check_attn_rows_as(kernel_for, cpu_f32_to_fp16, cpu_fp16_to_f32);
}

/* Which kernel a bf16 cache's attention takes for each cpu_isa: with
 * AVX-512 BF16 allowed ("avx512", and "best", which also allows AMX tiles,
 * whether or not the CPU has them) the bfloat16 products that
 * KVD_CAPQ_KV_FAST and the reference's "bf16-products" describe; with
 * "avx2" the AVX2 kernel; with "generic" neither (the float products).
 * (Regression: "best" took the AVX2 kernel on AVX-512 BF16 hosts.) */
static void test_attn_bf16_kernel_choice(void **state)
{
	(void)state;
	struct kvd_hparams hp;
	memset(&hp, 0, sizeof(hp));
	hp.n_head = 4;
	hp.n_head_kv = 1;
	hp.head_dim = 64;
	const enum kvd_cpu_isa isas[] = {KVD_CPU_ISA_BEST, KVD_CPU_ISA_AVX512, KVD_CPU_ISA_AVX2, KVD_CPU_ISA_GENERIC};
	int checked = 0;
	for (size_t i = 0; i < sizeof(isas) / sizeof(isas[0]); i++) {
		struct cpu_kernels k;
		struct cpu_attn a;
		memset(&k, 0, sizeof(k));
		memset(&a, 0, sizeof(a));
		cpu_kernels_init_isa(&k, isas[i]);
		cpu_attn_setup(&a, NULL, &k, &hp, 0.125f);
		attn_rows_fn want = NULL;
		if (strcmp(k.isa, "generic")) {
			if (isas[i] != KVD_CPU_ISA_AVX2)
				want = cpu_attn_rows_bf16(64);
			if (!want)
				want = cpu_attn_rows_bf16_avx2(64);
		}
		if (a.rows_bf16 != want)
			fail_msg("cpu_isa %s (kernels %s): the bf16 attention kernel is not the one it allows",
				 kvd_cpu_isa_name(isas[i]), k.isa);
		checked += want != NULL && want == cpu_attn_rows_bf16(64);
		cpu_attn_free(&a);
	}
	if (!checked)
		printf("note: this CPU has no AVX-512 BF16: only the AVX2 and portable choices were checked\n");
}

/* The AVX-512 and AVX2 attention kernels (whose bits differ: other
 * reduction trees, another exp) agree within float tolerance on tiles as
 * large as a prefill's, lengths from 1 to a whole chunk; and the AVX-512
 * kernel gives a row the same bits in a large tile as alone. */
static void test_attn_rows_avx2_avx512_agree(void **state)
{
	(void)state;
	enum { NR = 48, NP = 128 };
	for (int hd = 64; hd <= 256; hd *= 2) {
		attn_rows_fn f512 = cpu_attn_rows_avx512(hd), f2 = cpu_attn_rows_avx2(hd);
		if (!f512 || !f2) {
			printf("skipped: this CPU lacks AVX-512 or AVX2: nothing to compare\n");
			skip();
		}
		static uint16_t kv[2][NP][256];
		static float q[NR][256], o[2][NR][256], ml[2][NR][2], scratch[ATTN_ROWS_SCRATCH(NR, 256)];
		const uint16_t *kp[NP], *vp[NP];
		for (int it = 0; it < 20; it++) {
			int nr = 1 + (int)(next_u32() % NR), len[NR];
			const float *qp[NR];
			float *mlp[2][NR], *op[2][NR];
			float scale = 1.0f / sqrtf((float)hd);
			fill_kv(kv, hd, cpu_f32_to_fp16, kp, vp);
			for (int r = 0; r < nr; r++) {
				len[r] = it % 2 ? NP - (int)(next_u32() % 8) : 1 + (int)(next_u32() % NP);
				for (int i = 0; i < hd; i++)
					q[r][i] = frand() * 3.0f;
				qp[r] = q[r];
				for (int k = 0; k < 2; k++) {
					mlp[k][r] = ml[k][r];
					op[k][r] = o[k][r];
				}
			}
			f512(nr, qp, len, kp, vp, scale, mlp[0], op[0], scratch);
			f2(nr, qp, len, kp, vp, scale, mlp[1], op[1], scratch);
			for (int r = 0; r < nr; r++) {
				float mla[2], oa[256], *mlap = mla, *oap = oa;
				assert_true(fabsf(ml[0][r][0] - ml[1][r][0]) <= 1e-5f * (1 + fabsf(ml[0][r][0])));
				assert_true(fabsf(ml[0][r][1] - ml[1][r][1]) <= 1e-5f * ml[0][r][1]);
				for (int i = 0; i < hd; i++)
					if (fabsf(o[0][r][i] - o[1][r][i]) > 1e-5f * ml[0][r][1] + 1e-6f)
						fail_msg("hd %d row %d elem %d: %g vs %g", hd, r, i, o[0][r][i], o[1][r][i]);
				f512(1, &qp[r], &len[r], kp, vp, scale, &mlap, &oap, scratch);
				assert_memory_equal(mla, ml[0][r], sizeof(mla));
				assert_memory_equal(oa, o[0][r], sizeof(float) * (size_t)hd);
			}
		}
	}
}

/* The bfloat16 kernel (K/V stored as bf16, [kv] cache_type = bf16): each
 * row's max, sum and weighted V rows against float64 of the stated
 * arithmetic (the query rounded to bfloat16; the weights rounded too, so
 * the sum and the output carry up to 2^-8 of each weight), and a row alone
 * gives the same bits as in any tile. */
static void test_attn_rows_bf16(void **state)
{
	(void)state;
	for (int hd = 64; hd <= 256; hd *= 2) {
		attn_rows_fn fn = cpu_attn_rows_bf16(hd);
		if (!fn) {
			printf("skipped: this CPU has no AVX-512 BF16: no bfloat16 attention kernel\n");
			skip();
		}
		enum { NR = 40, NP = 128 };
		static uint16_t kv[2][NP][256];
		static float q[NR][256], o[NR][256], o1[256], scratch[ATTN_ROWS_SCRATCH(NR, 256)];
		const uint16_t *kp[NP], *vp[NP];
		for (int it = 0; it < 30; it++) {
			int nr = 1 + (int)(next_u32() % NR), len[NR];
			const float *qp[NR];
			float ml[NR][2], *mlp[NR], *op[NR], ml1[2], *ml1p = ml1, *o1p = o1;
			float scale = 1.0f / sqrtf((float)hd);
			fill_kv(kv, hd, cpu_f32_to_bf16, kp, vp);
			for (int r = 0; r < nr; r++) {
				len[r] = it % 3 ? 1 + (int)(next_u32() % NP) : NP - r / 3; /* a prefill tile's */
				for (int i = 0; i < hd; i++)
					q[r][i] = frand() * 3.0f;
				qp[r] = q[r];
				mlp[r] = ml[r];
				op[r] = o[r];
			}
			fn(nr, qp, len, kp, vp, scale, mlp, op, scratch);
			for (int r = 0; r < nr; r++) {
				double sc[NP], mx = -INFINITY, l = 0;
				for (int p = 0; p < len[r]; p++) {
					double d = 0;
					for (int i = 0; i < hd; i++)
						d += (double)cpu_bf16_to_f32(cpu_f32_to_bf16(q[r][i])) * cpu_bf16_to_f32(kv[0][p][i]);
					sc[p] = d * scale;
					mx = sc[p] > mx ? sc[p] : mx;
				}
				for (int p = 0; p < len[r]; p++)
					l += exp(sc[p] - mx);
				if (!(fabs(ml[r][0] - mx) <= 1e-5 * (1 + fabs(mx))))
					fail_msg("hd %d row %d: max %g vs %g", hd, r, ml[r][0], mx);
				if (!(fabs(ml[r][1] - l) <= (0x1p-8 + 1e-5) * l))
					fail_msg("hd %d row %d: sum %g vs %g", hd, r, ml[r][1], l);
				for (int i = 0; i < hd; i++) {
					double acc = 0, mag = 0;
					for (int p = 0; p < len[r]; p++) {
						acc += exp(sc[p] - mx) * cpu_bf16_to_f32(kv[1][p][i]);
						mag += exp(sc[p] - mx) * fabs(cpu_bf16_to_f32(kv[1][p][i]));
					}
					if (fabs(o[r][i] - acc) > (0x1p-8 + 1e-5) * mag + 1e-6)
						fail_msg("hd %d row %d len %d elem %d: %g vs %g", hd, r, len[r], i, o[r][i], acc);
				}
				fn(1, &qp[r], &len[r], kp, vp, scale, &ml1p, &o1p, scratch);
				assert_memory_equal(ml1, ml[r], sizeof(ml1));
				assert_memory_equal(o1, o[r], sizeof(float) * (size_t)hd);
			}
		}
	}
}

static void test_attn_rows_avx512(void **state)
{
	(void)state;
	check_attn_rows(cpu_attn_rows_avx512);
}

static void test_attn_rows_avx2(void **state)
{
	(void)state;
	check_attn_rows(cpu_attn_rows_avx2);
}

/* The AVX2 kernel over bf16 K/V ([kv] cache_type = bf16 without AVX-512
 * BF16): the f16 kernel's arithmetic on the exactly widened elements, so
 * the same float64 checks and tolerances as f16's */
static void test_attn_rows_bf16_avx2(void **state)
{
	(void)state;
	check_attn_rows_as(cpu_attn_rows_bf16_avx2, cpu_f32_to_bf16, cpu_bf16_to_f32);
}

/* A heads kernel (attn_heads_fn) against its per-head kernel fr: 24
 * random cases of G heads of nr rows over n positions (full chunks and
 * ragged ones), every head's (m, l) and output bit for bit; the number of
 * rows compared. */
static int heads_vs_rows(attn_heads_fn fh, attn_rows_fn fr, int bf, int hd, const char *what)
{
	enum { GM = 8, NP = 128 };
	static uint16_t kv[2][NP][GM * 256];
	static float q[ATTN_HEADS_MAX_ROWS][256], o[ATTN_HEADS_MAX_ROWS][256], o1[8][256];
	static float scratch[ATTN_HEADS_MAX_ROWS * (128 + 128) + 16 * 256];
	int checked = 0;
	uint16_t (*to16)(float) = bf ? cpu_f32_to_bf16 : cpu_f32_to_fp16;
	for (int it = 0; it < 24; it++) {
		int G = 1 + (int)(next_u32() % GM), nr = 1 + (int)(next_u32() % 8);
		int n = it % 3 ? 1 + (int)(next_u32() % NP) : NP - (int)(next_u32() % 3);
		const uint16_t *kp[NP], *vp[NP];
		const float *qp[ATTN_HEADS_MAX_ROWS];
		float ml[ATTN_HEADS_MAX_ROWS][2], *mlp[ATTN_HEADS_MAX_ROWS], *op[ATTN_HEADS_MAX_ROWS];
		float scale = 1.0f / sqrtf((float)hd);
		for (int p = 0; p < n; p++) {
			for (int i = 0; i < G * hd; i++) {
				kv[0][p][i] = to16(frand() * 2.0f);
				kv[1][p][i] = to16(frand());
			}
			kp[p] = kv[0][p];
			vp[p] = kv[1][p];
		}
		for (int r = 0; r < G * nr; r++) {
			for (int i = 0; i < hd; i++)
				q[r][i] = frand() * 3.0f;
			qp[r] = q[r];
			mlp[r] = ml[r];
			op[r] = o[r];
		}
		fh(G, nr, n, qp, kp, vp, scale, mlp, op, scratch);
		for (int g = 0; g < G; g++) {
			const uint16_t *kg[NP], *vg[NP];
			float ml1[8][2], *ml1p[8], *o1p[8];
			int len[8];
			for (int p = 0; p < n; p++) {
				kg[p] = kp[p] + g * hd;
				vg[p] = vp[p] + g * hd;
			}
			for (int r = 0; r < nr; r++) {
				len[r] = n;
				ml1p[r] = ml1[r];
				o1p[r] = o1[r];
			}
			fr(nr, qp + g * nr, len, kg, vg, scale, ml1p, o1p, scratch);
			for (int r = 0; r < nr; r++) {
				if (memcmp(ml1[r], ml[g * nr + r], sizeof(ml1[r])) ||
				    memcmp(o1[r], o[g * nr + r], sizeof(float) * (size_t)hd))
					fail_msg("%s hd %d: %d heads of %d rows over %d positions: head %d row %d "
						 "differs from the per-head kernel",
						 what, hd, G, nr, n, g, r);
				checked++;
			}
		}
	}
	return checked;
}

/* The heads kernel (a chunk of G KV heads at once, their rows side by
 * side in each position's K and V rows): each head's max, sum and V sums
 * the same bits as the per-head kernel's for its rows, f16 and bf16, head
 * sizes 64-256, 1-8 heads of 1-8 rows, every chunk length. */
static void test_attn_heads_avx2(void **state)
{
	(void)state;
	int checked = 0;
	for (int bf = 0; bf < 2; bf++)
		for (int hd = 64; hd <= 256; hd *= 2) {
			attn_heads_fn fh = cpu_attn_heads_avx2(hd, bf);
			attn_rows_fn fr = bf ? cpu_attn_rows_bf16_avx2(hd) : cpu_attn_rows_avx2(hd);
			if (!fh || !fr) {
				printf("skipped: this CPU lacks AVX2: no heads kernel\n");
				skip();
			}
			checked += heads_vs_rows(fh, fr, bf, hd, bf ? "bf16" : "f16");
		}
	printf("heads kernel: %d rows bit-identical to the per-head kernel\n", checked);
}

/* The same for the heads kernel of the bfloat16 products (AVX-512 BF16) */
static void test_attn_heads_bf16(void **state)
{
	(void)state;
	int checked = 0;
	for (int hd = 64; hd <= 256; hd *= 2) {
		attn_heads_fn fh = cpu_attn_heads_bf16(hd);
		attn_rows_fn fr = cpu_attn_rows_bf16(hd);
		if (!fh || !fr) {
			printf("skipped: this CPU lacks AVX-512 BF16: no bfloat16 heads kernel\n");
			skip();
		}
		checked += heads_vs_rows(fh, fr, 1, hd, "bf16 products");
	}
	printf("bfloat16 heads kernel: %d rows bit-identical to the per-head kernel\n", checked);
}

/* silu(g) * u in both tables against float64, over the whole range of
 * gates, tails of every length included */
static void test_swiglu(void **state)
{
	struct cpu_kernels ks[2];
	(void)state;
	cpu_kernels_init(&ks[0], 1);
	cpu_kernels_init(&ks[1], 0);
	for (int which = 0; which < 2; which++) {
		for (int n = 1; n <= 67; n += 3) {
			float g[67], u[67], g0[67];
			for (int i = 0; i < n; i++) {
				g0[i] = g[i] = (i % 7 == 3) ? (frand() * 400.0f) : frand() * 12.0f;
				u[i] = frand() * 2.0f;
			}
			ks[which].swiglu(g, u, n);
			for (int i = 0; i < n; i++) {
				double x = g0[i], want = x / (1.0 + exp(-x)) * u[i];
				if (fabs(g[i] - want) > 2e-6 * fabs(want) + 1e-30)
					fail_msg("%s: silu(%g) * %g = %g, want %g", ks[which].isa, g0[i], u[i], g[i], want);
			}
		}
	}
}

/* RMS norm: every version the same bits as the portable one (in place
 * too), and the portable one against a plain double computation */
static void test_rmsnorm(void **state)
{
	struct cpu_kernels ks[2];
	(void)state;
	cpu_kernels_init(&ks[0], 1);
	cpu_kernels_init(&ks[1], 0);
	for (int n = 1; n <= 700; n += (n < 40 ? 1 : 37)) {
		float x[700], g[700], y0[700], y1[700];
		double ss = 0;
		for (int i = 0; i < n; i++) {
			x[i] = (i % 11 == 5) ? frand() * 300.0f : frand() * 3.0f;
			g[i] = 0.5f + frand();
			ss += (double)x[i] * x[i];
		}
		ks[0].rmsnorm(y0, x, g, n, 1e-6f);
		ks[1].rmsnorm(y1, x, g, n, 1e-6f);
		assert_memory_equal(y0, y1, sizeof(float) * (size_t)n);
		double s = 1.0 / sqrt(ss / n + 1e-6f);
		for (int i = 0; i < n; i++)
			if (fabs(y0[i] - x[i] * s * g[i]) > 1e-6 * fabs(x[i] * s * g[i]) + 1e-30)
				fail_msg("n %d: rmsnorm[%d] = %g, want %g", n, i, y0[i], x[i] * s * g[i]);
		ks[1].rmsnorm(x, x, g, n, 1e-6f);
		assert_memory_equal(x, y1, sizeof(float) * (size_t)n);
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
			k[i] = cpu_f32_to_fp16(frand());
			ref += (double)q[i] * cpu_fp16_to_f32(k[i]);
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
			k2[i] = cpu_f32_to_fp16(frand());
		rows[2] = k2;
		float o4g[4], o4v[4];
		kg.dot4_f32_f16(q, rows, n, o4g);
		kv.dot4_f32_f16(q, rows, n, o4v);
		for (int j = 0; j < 4; j++) {
			double rj = 0;
			for (int i = 0; i < n; i++)
				rj += (double)q[i] * cpu_fp16_to_f32(rows[j][i]);
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
		cmocka_unit_test(test_gemm_pack_layout),
		cmocka_unit_test(test_gemm_tiles),
		cmocka_unit_test(test_gemm16_amx),
		cmocka_unit_test(test_attn_rows_avx512),
		cmocka_unit_test(test_attn_rows_avx2),
		cmocka_unit_test(test_attn_bf16_kernel_choice),
		cmocka_unit_test(test_attn_rows_avx2_avx512_agree),
		cmocka_unit_test(test_attn_rows_bf16),
		cmocka_unit_test(test_attn_rows_bf16_avx2),
		cmocka_unit_test(test_attn_heads_avx2),
		cmocka_unit_test(test_attn_heads_bf16),
		cmocka_unit_test(test_attention_helpers),
		cmocka_unit_test(test_swiglu),
		cmocka_unit_test(test_rmsnorm),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
