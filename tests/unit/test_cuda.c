/*
 * tests/unit/test_cuda.c — the CUDA plug-in (libkvd-cuda.so): that it loads
 * and speaks the backend ABI, that it declines cleanly without a GPU, and,
 * where there is a GPU, that it computes what the CPU backend computes.
 *
 * The plug-in is found at $KVD_CUDA_PLUGIN, else $KVD_BUILD/lib/, else
 * build/lib/. A missing plug-in fails the test where nvcc exists (the build
 * should have made it) and skips it elsewhere. Tests that need a GPU call
 * skip() without one, so a GPU-less run reports them as skipped, never as
 * passed; with KVD_REQUIRE_GPU=1 (tests/gpu/run.sh) a missing GPU fails.
 * tests/gpu/t_cuda_emulated.sh runs this test against a CPU emulation build
 * of the plug-in (KVD_CUDA_EMULATED=1), so the conformance checks also run
 * on machines without a GPU, as a check of the plug-in's logic.
 *
 * Conformance. Tiny random-weight Llama models are built in memory, one per
 * weight type (f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_K, q5_K,
 * q6_K) plus MHA / MQA / odd head size / NeoX RoPE / untied output shapes,
 * and models with each architecture's departures from the Llama base
 * (Q/K/V biases, per-head Q/K norms, post-norms, GeGLU, embedding and
 * attention scales, windowed layers with their own RoPE base, rope_freqs
 * and linear RoPE scaling: make_model_features), which are compared with
 * the CPU backend only (the float64 reference is the Llama base). The same batches — one-chunk
 * prefill, chunked prefill, decodes, and mixed prefill+decode batches of
 * several sequences with scattered page tables — run on both backends
 * through the ops table. Compared are:
 *   - logits of every row, relative L2 error (||a - b|| / ||b||) against
 *     the CPU backend: <= TOL_CPU_QUANT for models with quantized
 *     matrices, TOL_CPU_FLOAT for float ones;
 *   - the same against a float64 reference forward pass that rounds what
 *     the CUDA backend rounds (fp16 weights and GEMM inputs, fp16 K/V):
 *     <= TOL_LOGITS_REF; this one isolates the kernels from the CPU
 *     backend's 8-bit activations;
 *   - every written KV page (K after RoPE, V) against the CPU pool:
 *     relative L2 within the same tolerance; layer 0's K/V exercise embedding, RMSNorm,
 *     the QKV GEMM, RoPE and the page stores alone;
 *   - page_copy, page_read/page_write and the batched pages_read/pages_write
 *     (gather/scatter) bit-exactly.
 * The KV element types other than f16 (f32, bf16, q8_0, q4_0: test_kvtype_*)
 * run the same batches with that type on both backends, the pages decoded
 * as the CPU reads its own (the layouts are one), then the CPU's pages are
 * written into the plug-in's pool and the plug-in's next step must read
 * them as the CPU does. kv_shift (test_kv_shift) must turn the same pages
 * into the CPU's bytes exactly.
 * The kernels are exercised through forward(): embedding lookup per weight
 * type, RMSNorm, RoPE (both styles), K/V page stores, the decode attention
 * (single-token items) and the tiled prefill attention (multi-token items),
 * SwiGLU and the projections.
 *
 * The tolerances are checked on any machine by test_reference_vs_cpu: the
 * CPU backend against the same float64 reference must be within them too,
 * so CUDA == reference up to fp16 rounding implies CUDA vs CPU within them.
 * Each comparison prints its worst error so a GPU run shows the margins.
 * KVD_CUDA_GEMV_MAX_TOKENS=8 in the environment sends steps of up to 8
 * tokens through the plug-in's dequantizing GEMV instead of cuBLAS, so the
 * same checks cover that path.
 */
#include <dlfcn.h>
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "backend.h"
#include "cpu/kvquant.h"
#include "cpu/ops.h"
#include "model.h"
#include "tokenizer.h"

/* Against the CPU backend: it multiplies quantized weights with 8-bit
 * activations (about 2-7% logits error on these models, measured by
 * test_reference_vs_cpu), float weights with f32 activations (< 1%). */
#define TOL_CPU_QUANT 1.2e-1
#define TOL_CPU_FLOAT 2e-2
/* Against the CPU backend with the same q4_0 KV cache: 4-bit keys make these
 * random models' logits very sensitive to the last bits of K (the CPU with
 * a q4_0 cache is 0.67 from itself with an f16 one on neox-hd64-f16), and
 * the two backends' keys differ in those bits before quantization, so a
 * few quants land one step apart (measured: 0.13 on that shape). */
#define TOL_CPU_Q4_KV 2.5e-1
/* Against the float64 reference that rounds what the CUDA backend rounds. */
#define TOL_LOGITS_REF 1e-2

#define BLOCK 16
#define POOL_PAGES 96
#define MAX_SEQ_PAGES 8
#define MAX_SEQ_LEN (BLOCK * MAX_SEQ_PAGES)

/* ---- plug-in loading ------------------------------------------------------ */

static const struct kvd_backend_ops *cuda_ops_g;
static int gpu_state = -1; /* -1 unknown, 0 none, 1 usable */

static const char *plugin_path(char *buf, size_t cap)
{
	const char *env = getenv("KVD_CUDA_PLUGIN");
	const char *b = getenv("KVD_BUILD");
	if (env && *env)
		return env;
	if (b && *b) {
		snprintf(buf, cap, "%s/lib/libkvd-cuda.so", b);
		if (access(buf, F_OK) == 0)
			return buf;
	}
	return "build/lib/libkvd-cuda.so";
}

static int have_nvcc(void)
{
	return system("command -v nvcc >/dev/null 2>&1") == 0 || access("/usr/local/cuda/bin/nvcc", X_OK) == 0;
}

/* The loaded ops table, or NULL after fail() / skip(). */
static const struct kvd_backend_ops *load_plugin(void)
{
	char buf[4096];
	const char *path;
	void *h;
	const struct kvd_backend_ops *(*entry)(void);

	if (cuda_ops_g)
		return cuda_ops_g;
	path = plugin_path(buf, sizeof(buf));
	if (access(path, F_OK) != 0) {
		const char *b = getenv("KVD_BUILD");
		if (have_nvcc() && (!b || !*b || !strcmp(b, "build") || getenv("KVD_CUDA_PLUGIN"))) {
			print_error("%s missing although nvcc is installed (make build/lib/libkvd-cuda.so)\n", path);
			fail();
		}
		print_message("skipped: no CUDA plug-in at %s\n", path);
		skip();
	}
	/* never dlclose()d: the CUDA runtime keeps state for the process */
	h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!h) {
		print_error("dlopen %s: %s\n", path, dlerror());
		fail();
	}
	*(void **)&entry = dlsym(h, "kvd_backend_plugin_entry");
	assert_non_null(entry);
	cuda_ops_g = entry();
	assert_non_null(cuda_ops_g);
	return cuda_ops_g;
}

/* KVD_CUDA_EMULATED=1: the plug-in is the CPU emulation build
 * (tests/gpu/t_cuda_emulated.sh); it has a "device" and exports its shims. */
static int emulated(void)
{
	const char *e = getenv("KVD_CUDA_EMULATED");
	return e && !strcmp(e, "1");
}

static int have_device_nodes(void)
{
	return access("/dev/nvidiactl", F_OK) == 0 || access("/dev/nvidia0", F_OK) == 0;
}

/* A usable GPU: init succeeds. Skips (or, with KVD_REQUIRE_GPU, fails)
 * otherwise. */
static const struct kvd_backend_ops *need_gpu(void)
{
	const struct kvd_backend_ops *ops = load_plugin();
	if (gpu_state < 0) {
		struct kvd_backend_config cfg = {.n_threads = 1, .device = 0};
		void *ctx = NULL;
		int r = ops->init(&cfg, &ctx);
		gpu_state = r == 0;
		if (r == 0)
			ops->destroy(ctx);
		else if (r != -ENODEV)
			print_error("cuda init: unexpected %d (%s)\n", r, strerror(-r));
	}
	if (!gpu_state) {
		const char *req = getenv("KVD_REQUIRE_GPU");
		if (req && !strcmp(req, "1")) {
			print_error("KVD_REQUIRE_GPU=1 but the CUDA backend finds no usable GPU\n");
			fail();
		}
		print_message("skipped: no GPU\n");
		skip();
	}
	return ops;
}

static void test_plugin_abi(void **state)
{
	(void)state;
	const struct kvd_backend_ops *ops = load_plugin();
	assert_int_equal(ops->version, KVD_BACKEND_ABI_VERSION);
	assert_string_equal(ops->name, "cuda");
	assert_non_null(ops->init);
	assert_non_null(ops->load);
	assert_non_null(ops->attach_kv);
	assert_non_null(ops->forward);
	assert_non_null(ops->page_copy);
	assert_non_null(ops->page_read);
	assert_non_null(ops->page_write);
	assert_non_null(ops->destroy);
	assert_non_null(ops->suggest_pool_pages);
	assert_non_null(ops->pages_read);
	assert_non_null(ops->pages_write);
	/* the device pool and batched swap are declared, not inferred */
	assert_int_equal(ops->caps, KVD_CAP_DEVICE_POOL | KVD_CAP_BATCHED_SWAP | KVD_CAP_PACKED_KV);
	assert_int_equal(kvd_backend_ops_check(ops), 0);
	ops->destroy(NULL); /* accepts NULL */
}

/* The plug-in exports one symbol: nothing else of it leaks into the
 * daemon's namespace. */
static void test_plugin_exports(void **state)
{
	char buf[4096], cmd[4400];
	(void)state;
	const struct kvd_backend_ops *ops = load_plugin();
	(void)ops;
	const char *path = plugin_path(buf, sizeof(buf));
	if (emulated()) {
		print_message("skipped: the emulated plug-in's exports are not the shipped plug-in's\n");
		skip();
	}
	if (system("command -v nm >/dev/null 2>&1") != 0) {
		print_message("skipped: no nm (binutils) to list the plug-in's symbols\n");
		skip();
	}
	snprintf(cmd, sizeof(cmd), "nm -D --defined-only '%s' | awk '{print $3}' | grep -v '^$'", path);
	FILE *p = popen(cmd, "r");
	assert_non_null(p);
	char line[512];
	int n = 0, found = 0;
	while (fgets(line, sizeof(line), p)) {
		line[strcspn(line, "\n")] = 0;
		n++;
		if (!strcmp(line, "kvd_backend_plugin_entry"))
			found = 1;
		else
			print_error("unexpected export: %s\n", line);
	}
	pclose(p);
	assert_true(found);
	assert_int_equal(n, 1);
}

/* No driver, no GPU: init says -ENODEV, allocates nothing, crashes not. */
/* The capability query answers yes for every weight type, model feature
 * and KV element type of kernels/backend.h (the plug-in computes them all),
 * no for a quantized KV type whose blocks do not tile the head, and yes
 * to kv_shift exactly where the CPU backend has it (f16, bf16, f32). Asked of a started context
 * where there is a GPU (or the emulation), else skipped. */
static void test_query_types_and_features(void **state)
{
	static const enum kvd_wtype all[] = {KVD_WTYPE_F32, KVD_WTYPE_F16, KVD_WTYPE_BF16, KVD_WTYPE_Q8_0,
					     KVD_WTYPE_Q4_0, KVD_WTYPE_Q4_1, KVD_WTYPE_Q5_0, KVD_WTYPE_Q5_1,
					     KVD_WTYPE_Q4_K, KVD_WTYPE_Q5_K, KVD_WTYPE_Q6_K};
	struct kvd_backend_config cfg = {.n_threads = 1, .device = 0};
	const struct kvd_backend_ops *ops = need_gpu();
	void *ctx = NULL;
	(void)state;
	assert_int_equal(ops->init(&cfg, &ctx), 0);
	for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++) {
		struct kvd_cap_query q = {.kind = KVD_CAPQ_WEIGHT_TYPE, .wtype = all[i]};
		if (kvd_backend_supports(ops, ctx, &q) != 1)
			fail_msg("the plug-in says no to weight type %s", kvd_wtype_name(all[i]));
	}
	for (uint32_t bit = 1; bit & KVD_FEAT_ALL; bit <<= 1) {
		struct kvd_cap_query q = {.kind = KVD_CAPQ_MODEL_FEATURE, .feature = bit};
		if (kvd_backend_supports(ops, ctx, &q) != 1)
			fail_msg("the plug-in says no to %s", kvd_feature_name(bit));
	}
	/* every KV element type; kv_shift of the plain ones, as on the CPU */
	static const enum kvd_kv_type kvs[] = {KVD_KV_F16, KVD_KV_F32, KVD_KV_BF16, KVD_KV_Q8_0, KVD_KV_Q4_0};
	for (size_t i = 0; i < sizeof(kvs) / sizeof(kvs[0]); i++) {
		struct kvd_cap_query kv = {.kind = KVD_CAPQ_KV_TYPE, .kv_type = kvs[i], .head_dim = 64};
		int quant = kvs[i] == KVD_KV_Q8_0 || kvs[i] == KVD_KV_Q4_0;
		if (kvd_backend_supports(ops, ctx, &kv) != 1)
			fail_msg("the plug-in says no to a %s KV cache", kvd_kv_type_name(kvs[i]));
		kv.head_dim = 48; /* not a whole number of blocks */
		assert_int_equal(kvd_backend_supports(ops, ctx, &kv), !quant);
		struct kvd_cap_query sh = {.kind = KVD_CAPQ_KV_SHIFT, .kv_type = kvs[i]};
		if (kvd_backend_supports(ops, ctx, &sh) != !quant)
			fail_msg("kv_shift of a %s KV cache: the plug-in says %s", kvd_kv_type_name(kvs[i]),
				 quant ? "yes" : "no");
	}
	assert_true(kvd_backend_has_kv_shift(ops));
	struct kvd_cap_query rel = {.kind = KVD_CAPQ_RELEASED_PAGES};
	assert_int_equal(kvd_backend_supports(ops, ctx, &rel), 1);
	ops->destroy(ctx);
}

static void test_init_without_gpu(void **state)
{
	(void)state;
	const struct kvd_backend_ops *ops = load_plugin();
	struct kvd_backend_config cfg = {.n_threads = 1, .device = 0};
	void *ctx = (void *)0x1;
	int r = ops->init(&cfg, &ctx);
	if (r == 0) {
		ops->destroy(ctx);
		if (!have_device_nodes() && !emulated())
			fail_msg("init succeeded without /dev/nvidia* device nodes");
		print_message("skipped: a GPU is present (init succeeded)\n");
		skip();
	}
	assert_int_equal(r, -ENODEV);
	assert_ptr_equal(ctx, (void *)0x1); /* untouched on failure */
	/* twice, and with a device index past the end */
	cfg.device = 7;
	assert_int_equal(ops->init(&cfg, &ctx), -ENODEV);
	cfg.device = -1;
	assert_int_equal(ops->init(&cfg, &ctx), -ENODEV);
}

/* ---- tiny random models ------------------------------------------------------ */

static uint64_t rng_state = 0x2545f4914f6cdd1dull;
static uint32_t rnd_u32(void)
{
	rng_state ^= rng_state << 13;
	rng_state ^= rng_state >> 7;
	rng_state ^= rng_state << 17;
	return (uint32_t)(rng_state >> 16);
}
static float rnd_unit(void) { return (float)rnd_u32() / 4294967296.0f * 2.0f - 1.0f; } /* [-1, 1) */

struct tmodel {
	struct kvd_model_weights w;
	void *blobs[256];
	int n_blobs;
};

struct tshape {
	const char *name;
	int n_layer, n_embd, n_head, n_head_kv, n_ff, n_vocab;
	enum kvd_wtype wtype, etype, otype; /* big matrices, token embedding, output */
	int untied;
	enum kvd_rope_style rope;
	float rope_base, eps;
	uint32_t feats; /* KVD_FEAT_* departures built into the model (make_model_features) */
};

/* A tensor of random values of magnitude about `scale`. */
static struct kvd_tensor make_tensor(struct tmodel *m, enum kvd_wtype t, int64_t cols, int64_t rows, float scale)
{
	struct kvd_tensor ts = {0};
	size_t rb = kvd_wtype_row_bytes(t, cols);
	uint8_t *p = malloc(rb * (size_t)rows);
	assert_non_null(p);
	assert_true(m->n_blobs < 256);
	m->blobs[m->n_blobs++] = p;
	for (int64_t r = 0; r < rows; r++) {
		uint8_t *row = p + (size_t)r * rb;
		int kq = t == KVD_WTYPE_Q4_K || t == KVD_WTYPE_Q5_K || t == KVD_WTYPE_Q6_K;
		for (int64_t b = 0; b < (t == KVD_WTYPE_F32 || t == KVD_WTYPE_F16 || t == KVD_WTYPE_BF16 ? cols
					 : kq ? cols / 256 : cols / 32);
		     b++) {
			switch (t) {
			case KVD_WTYPE_F32: {
				float v = rnd_unit() * scale;
				memcpy(row + b * 4, &v, 4);
				break;
			}
			case KVD_WTYPE_F16: {
				uint16_t h = cpu_f32_to_fp16(rnd_unit() * scale);
				memcpy(row + b * 2, &h, 2);
				break;
			}
			case KVD_WTYPE_BF16: {
				float v = rnd_unit() * scale;
				uint32_t u;
				memcpy(&u, &v, 4);
				uint16_t h = (uint16_t)(u >> 16);
				memcpy(row + b * 2, &h, 2);
				break;
			}
			case KVD_WTYPE_Q8_0: {
				uint8_t *blk = row + b * 34;
				uint16_t d = cpu_f32_to_fp16(scale / 127.0f * (0.75f + 0.25f * rnd_unit()));
				memcpy(blk, &d, 2);
				for (int i = 0; i < 32; i++)
					blk[2 + i] = (uint8_t)(int8_t)((int)(rnd_u32() % 255) - 127);
				break;
			}
			case KVD_WTYPE_Q4_0: {
				uint8_t *blk = row + b * 18;
				uint16_t d = cpu_f32_to_fp16(scale / 8.0f * (0.75f + 0.25f * rnd_unit()));
				memcpy(blk, &d, 2);
				for (int i = 0; i < 16; i++)
					blk[2 + i] = (uint8_t)rnd_u32();
				break;
			}
			case KVD_WTYPE_Q4_1: {
				uint8_t *blk = row + b * 20;
				uint16_t d = cpu_f32_to_fp16(scale * 2.0f / 15.0f * (0.75f + 0.25f * rnd_unit()));
				uint16_t mm = cpu_f32_to_fp16(-scale * (0.75f + 0.25f * rnd_unit()));
				memcpy(blk, &d, 2);
				memcpy(blk + 2, &mm, 2);
				for (int i = 0; i < 16; i++)
					blk[4 + i] = (uint8_t)rnd_u32();
				break;
			}
			case KVD_WTYPE_Q5_0:
			case KVD_WTYPE_Q5_1: {
				/* random quants and fifth bits; q5_1's min centres them */
				int one = t == KVD_WTYPE_Q5_1;
				uint8_t *blk = row + b * (one ? 24 : 22);
				float d = scale / 16.0f * (0.75f + 0.25f * rnd_unit());
				uint16_t dh = cpu_f32_to_fp16(d), mh = cpu_f32_to_fp16(-16.0f * d);
				memcpy(blk, &dh, 2);
				if (one)
					memcpy(blk + 2, &mh, 2);
				for (int i = 0; i < 20; i++)
					blk[(one ? 4 : 2) + i] = (uint8_t)rnd_u32();
				break;
			}
			case KVD_WTYPE_Q4_K:
			case KVD_WTYPE_Q5_K: {
				/* random 6-bit scales and mins, random quants; dmin
				 * chosen so that a block averages about zero */
				int five = t == KVD_WTYPE_Q5_K;
				uint8_t *blk = row + b * (five ? 176 : 144);
				float qmax = five ? 31.0f : 15.0f;
				float d = 2.0f * scale / (qmax * 63.0f) * (0.75f + 0.25f * rnd_unit());
				uint16_t dh = cpu_f32_to_fp16(d), mh = cpu_f32_to_fp16(d * qmax / 2.0f);
				memcpy(blk, &dh, 2);
				memcpy(blk + 2, &mh, 2);
				for (int i = 4; i < (five ? 176 : 144); i++)
					blk[i] = (uint8_t)rnd_u32();
				break;
			}
			case KVD_WTYPE_Q6_K: {
				uint8_t *blk = row + b * 210;
				for (int i = 0; i < 192; i++)
					blk[i] = (uint8_t)rnd_u32();
				for (int i = 0; i < 16; i++)
					blk[192 + i] = (uint8_t)(int8_t)(1 + (int)(rnd_u32() % 63));
				uint16_t dh = cpu_f32_to_fp16(scale / (32.0f * 32.0f) * (0.75f + 0.25f * rnd_unit()));
				memcpy(blk + 208, &dh, 2);
				break;
			}
			}
		}
	}
	ts.data = p;
	ts.type = t;
	ts.cols = cols;
	ts.rows = rows;
	ts.row_bytes = rb;
	return ts;
}

static struct kvd_tensor make_norm(struct tmodel *m, int64_t n)
{
	struct kvd_tensor t = make_tensor(m, KVD_WTYPE_F32, n, 1, 0.2f);
	float *g = (float *)t.data;
	for (int64_t i = 0; i < n; i++)
		g[i] += 1.0f;
	return t;
}

/*
 * The departures from the Llama base that s->feats names, each as the
 * architectures use it: Q/K/V biases (Qwen 2), per-head Q/K norms (Qwen 3,
 * Gemma 3), post-norms, GeGLU and embedding scale (Gemma 3), a window of
 * 5 positions on every other layer with its own RoPE base (Gemma 3's local
 * layers, Mistral), rope_freqs and linear scaling (Llama 3.x), and an
 * attention scale other than 1/sqrt(head size) (Gemma 3's query scalar).
 */
static void make_model_features(struct tmodel *m, uint32_t feats)
{
	struct kvd_hparams *hp = &m->w.hp;
	int64_t ne = hp->n_embd, hd = hp->head_dim, qd = (int64_t)hp->n_head * hd, kvd = (int64_t)hp->n_head_kv * hd;

	m->w.features = feats;
	if (feats & KVD_FEAT_EMBD_SCALE)
		hp->embd_scale = 0.5f * sqrtf((float)ne) / 4.0f;
	if (feats & KVD_FEAT_ATTN_SCALE)
		hp->attn_scale = 0.8f / sqrtf((float)hd);
	if (feats & KVD_FEAT_ROPE_FREQS) {
		m->w.rope_freqs = make_tensor(m, KVD_WTYPE_F32, hd / 2, 1, 1.0f);
		float *f = (float *)m->w.rope_freqs.data;
		for (int64_t i = 0; i < hd / 2; i++)
			f[i] = 1.0f + 3.0f * (float)i / (float)hd + 0.5f * fabsf(f[i]);
	}
	for (int l = 0; l < hp->n_layer; l++) {
		struct kvd_layer_weights *L = &m->w.layers[l];
		int local = l % 2 == 0;
		if (feats & KVD_FEAT_QKV_BIAS) {
			L->bq = make_tensor(m, KVD_WTYPE_F32, qd, 1, 0.3f);
			L->bk = make_tensor(m, KVD_WTYPE_F32, kvd, 1, 0.3f);
			L->bv = make_tensor(m, KVD_WTYPE_F32, kvd, 1, 0.3f);
		}
		if (feats & KVD_FEAT_QK_NORM) {
			L->q_norm = make_norm(m, hd);
			L->k_norm = make_norm(m, hd);
		}
		if (feats & KVD_FEAT_POST_NORM) {
			L->post_attn_norm = make_norm(m, ne);
			L->post_ffn_norm = make_norm(m, ne);
		}
		if ((feats & KVD_FEAT_GELU) && !local)
			L->d.act = KVD_ACT_GELU_TANH;
		if ((feats & KVD_FEAT_WINDOW) && local)
			L->d.window = 5;
		if ((feats & KVD_FEAT_LAYER_ROPE) && local)
			L->d.rope_theta = 10000.0f;
		if ((feats & KVD_FEAT_ROPE_LINEAR) && !local)
			L->d.rope_freq_scale = 0.5f;
	}
}

static struct tmodel *make_model(const struct tshape *s, uint64_t seed)
{
	struct tmodel *m = calloc(1, sizeof(*m));
	struct kvd_hparams *hp = &m->w.hp;
	assert_non_null(m);
	rng_state = seed * 0x9e3779b97f4a7c15ull + 1;
	hp->n_vocab = s->n_vocab;
	hp->n_embd = s->n_embd;
	hp->n_layer = s->n_layer;
	hp->n_head = s->n_head;
	hp->n_head_kv = s->n_head_kv;
	hp->head_dim = s->n_embd / s->n_head;
	hp->n_ff = s->n_ff;
	hp->n_ctx_train = 4096;
	hp->rms_eps = s->eps > 0 ? s->eps : 1e-5f;
	hp->rope_theta = s->rope_base > 0 ? s->rope_base : 10000.0f;
	hp->rope_style = s->rope;
	int64_t ne = hp->n_embd, qd = (int64_t)hp->n_head * hp->head_dim, kvd = (int64_t)hp->n_head_kv * hp->head_dim;
	float gin = sqrtf(3.0f / (float)ne), gff = sqrtf(3.0f / (float)hp->n_ff), gq = sqrtf(3.0f / (float)qd);
	m->w.tok_embd = make_tensor(m, s->etype, ne, hp->n_vocab, 1.0f);
	m->w.output_norm = make_norm(m, ne);
	m->w.output = s->untied ? make_tensor(m, s->otype, ne, hp->n_vocab, 3.0f * gin) : m->w.tok_embd;
	m->w.layers = calloc((size_t)hp->n_layer, sizeof(*m->w.layers));
	assert_non_null(m->w.layers);
	for (int l = 0; l < hp->n_layer; l++) {
		struct kvd_layer_weights *L = &m->w.layers[l];
		L->attn_norm = make_norm(m, ne);
		L->ffn_norm = make_norm(m, ne);
		L->wq = make_tensor(m, s->wtype, ne, qd, 2.0f * gin);
		L->wk = make_tensor(m, s->wtype, ne, kvd, 2.0f * gin);
		L->wv = make_tensor(m, s->wtype, ne, kvd, gin);
		L->wo = make_tensor(m, s->wtype, qd, ne, gq);
		L->w_gate = make_tensor(m, s->wtype, ne, hp->n_ff, gin);
		L->w_up = make_tensor(m, s->wtype, ne, hp->n_ff, gin);
		L->w_down = make_tensor(m, s->wtype, hp->n_ff, ne, gff);
	}
	if (s->feats)
		make_model_features(m, s->feats);
	return m;
}

static void free_model(struct tmodel *m)
{
	if (!m)
		return;
	for (int i = 0; i < m->n_blobs; i++)
		free(m->blobs[i]);
	free(m->w.layers);
	free(m);
}

/* ---- float64 reference, rounding what the CUDA backend rounds ----------------- */

static double h16(double v) { return cpu_fp16_to_f32(cpu_f32_to_fp16((float)v)); }

/* W (rows x cols) dequantized, optionally rounded to fp16. */
static double *deq(const struct kvd_tensor *t, int f16)
{
	double *out = malloc(sizeof(double) * (size_t)t->rows * (size_t)t->cols);
	float *row = malloc(sizeof(float) * (size_t)t->cols);
	assert_non_null(out);
	assert_non_null(row);
	for (int64_t r = 0; r < t->rows; r++) {
		cpu_dequantize_row(t->type, (const char *)t->data + (size_t)r * t->row_bytes, row, t->cols);
		for (int64_t c = 0; c < t->cols; c++)
			out[r * t->cols + c] = f16 ? h16(row[c]) : row[c];
	}
	free(row);
	return out;
}

static void matvec(const double *W, int64_t rows, int64_t cols, const double *x, double *y)
{
	for (int64_t r = 0; r < rows; r++) {
		double a = 0;
		for (int64_t c = 0; c < cols; c++)
			a += W[r * cols + c] * x[c];
		y[r] = a;
	}
}

static void rmsnorm_d(const double *x, const float *g, int64_t n, double eps, double *out, int f16)
{
	double ss = 0;
	for (int64_t i = 0; i < n; i++)
		ss += x[i] * x[i];
	double sc = 1.0 / sqrt(ss / (double)n + eps);
	for (int64_t i = 0; i < n; i++)
		out[i] = f16 ? h16(x[i] * sc * g[i]) : x[i] * sc * g[i];
}

static void rope_d(double *v, int hd, int pos, double base, enum kvd_rope_style st)
{
	for (int i = 0; i < hd / 2; i++) {
		double th = (double)pos * pow(base, -2.0 * i / hd);
		int a = st == KVD_ROPE_NEOX ? i : 2 * i, b = st == KVD_ROPE_NEOX ? i + hd / 2 : 2 * i + 1;
		double x0 = v[a], x1 = v[b];
		v[a] = x0 * cos(th) - x1 * sin(th);
		v[b] = x0 * sin(th) + x1 * cos(th);
	}
}

/* Logits of every position of tokens[0..n) (out: n x n_vocab floats). */
static void reference_forward(const struct kvd_model_weights *w, const int32_t *tokens, int n, int f16, float *out)
{
	const struct kvd_hparams *hp = &w->hp;
	int64_t ne = hp->n_embd, hd = hp->head_dim, qd = hp->n_head * hd, kvd = hp->n_head_kv * hd, nff = hp->n_ff;
	int n_rep = hp->n_head / hp->n_head_kv;
	double *x = calloc((size_t)n * ne, sizeof(double)), *xn = malloc(sizeof(double) * (size_t)(ne > nff ? ne : nff) * 2);
	double *q = malloc(sizeof(double) * (size_t)n * qd), *K = malloc(sizeof(double) * (size_t)n * kvd);
	double *V = malloc(sizeof(double) * (size_t)n * kvd), *att = malloc(sizeof(double) * (size_t)qd);
	double *tmp = malloc(sizeof(double) * (size_t)(ne > nff ? ne : nff)), *g = malloc(sizeof(double) * (size_t)nff);
	double *u = malloc(sizeof(double) * (size_t)nff), *sc = malloc(sizeof(double) * (size_t)n);
	float *row = malloc(sizeof(float) * (size_t)ne);
	assert_true(x && xn && q && K && V && att && tmp && g && u && sc && row);

	for (int t = 0; t < n; t++) {
		cpu_dequantize_row(w->tok_embd.type, (const char *)w->tok_embd.data + (size_t)tokens[t] * w->tok_embd.row_bytes,
			       row, ne);
		for (int64_t i = 0; i < ne; i++)
			x[t * ne + i] = row[i];
	}
	for (int l = 0; l < hp->n_layer; l++) {
		const struct kvd_layer_weights *L = &w->layers[l];
		double *Wq = deq(&L->wq, f16), *Wk = deq(&L->wk, f16), *Wv = deq(&L->wv, f16), *Wo = deq(&L->wo, f16);
		double *Wg = deq(&L->w_gate, f16), *Wu = deq(&L->w_up, f16), *Wd = deq(&L->w_down, f16);
		for (int t = 0; t < n; t++) {
			rmsnorm_d(x + t * ne, L->attn_norm.data, ne, hp->rms_eps, xn, f16);
			matvec(Wq, qd, ne, xn, q + t * qd);
			matvec(Wk, kvd, ne, xn, K + t * kvd);
			matvec(Wv, kvd, ne, xn, V + t * kvd);
			for (int h = 0; h < hp->n_head; h++)
				rope_d(q + t * qd + h * hd, (int)hd, t, hp->rope_theta, hp->rope_style);
			for (int h = 0; h < hp->n_head_kv; h++)
				rope_d(K + t * kvd + h * hd, (int)hd, t, hp->rope_theta, hp->rope_style);
			for (int64_t i = 0; i < kvd; i++) { /* both backends keep K/V as fp16 */
				K[t * kvd + i] = h16(K[t * kvd + i]);
				V[t * kvd + i] = h16(V[t * kvd + i]);
			}
		}
		for (int t = 0; t < n; t++) {
			for (int h = 0; h < hp->n_head; h++) {
				int gk = h / n_rep;
				double mx = -INFINITY, sum = 0;
				for (int p = 0; p <= t; p++) {
					double d = 0;
					for (int64_t i = 0; i < hd; i++)
						d += q[t * qd + h * hd + i] * K[p * kvd + gk * hd + i];
					sc[p] = d / sqrt((double)hd);
					if (sc[p] > mx)
						mx = sc[p];
				}
				for (int p = 0; p <= t; p++) {
					sc[p] = exp(sc[p] - mx);
					sum += sc[p];
				}
				for (int64_t i = 0; i < hd; i++) {
					double a = 0;
					for (int p = 0; p <= t; p++)
						a += sc[p] * V[p * kvd + gk * hd + i];
					att[h * hd + i] = f16 ? h16(a / sum) : a / sum;
				}
			}
			matvec(Wo, ne, qd, att, tmp);
			for (int64_t i = 0; i < ne; i++)
				x[t * ne + i] += tmp[i];
			rmsnorm_d(x + t * ne, L->ffn_norm.data, ne, hp->rms_eps, xn, f16);
			matvec(Wg, nff, ne, xn, g);
			matvec(Wu, nff, ne, xn, u);
			for (int64_t i = 0; i < nff; i++) {
				double h = g[i] / (1.0 + exp(-g[i])) * u[i];
				g[i] = f16 ? h16(h) : h;
			}
			matvec(Wd, ne, nff, g, tmp);
			for (int64_t i = 0; i < ne; i++)
				x[t * ne + i] += tmp[i];
		}
		free(Wq); free(Wk); free(Wv); free(Wo); free(Wg); free(Wu); free(Wd);
	}
	double *Wout = deq(&w->output, f16), *lg = malloc(sizeof(double) * (size_t)hp->n_vocab);
	assert_non_null(lg);
	for (int t = 0; t < n; t++) {
		rmsnorm_d(x + t * ne, w->output_norm.data, ne, hp->rms_eps, xn, f16);
		matvec(Wout, hp->n_vocab, ne, xn, lg);
		for (int i = 0; i < hp->n_vocab; i++)
			out[(size_t)t * hp->n_vocab + i] = (float)lg[i];
	}
	free(Wout); free(lg);
	free(x); free(xn); free(q); free(K); free(V); free(att); free(tmp); free(g); free(u); free(sc); free(row);
}

static double rel_l2(const float *a, const float *b, size_t n)
{
	double num = 0, den = 0;
	for (size_t i = 0; i < n; i++) {
		double d = (double)a[i] - b[i];
		num += d * d;
		den += (double)b[i] * b[i];
	}
	if (!isfinite(num))
		return INFINITY;
	return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* ---- a backend instance with its own pool ------------------------------------- */

struct inst {
	const struct kvd_backend_ops *ops;
	void *ctx;
	void *pool; /* host pool (CPU) or host tier (CUDA) */
	struct kvd_kv_layout layout;
};

static void inst_open_kv(struct inst *in, const struct kvd_backend_ops *ops, const struct kvd_model_weights *w,
			 enum kvd_kv_type kt)
{
	struct kvd_backend_config cfg = {.n_threads = 2, .device = 0};
	memset(in, 0, sizeof(*in));
	in->ops = ops;
	assert_int_equal(ops->init(&cfg, &in->ctx), 0);
	assert_int_equal(ops->load(in->ctx, w), 0);
	assert_int_equal(kvd_kv_layout_init_type(&in->layout, &w->hp, BLOCK, kt), 0);
	assert_int_equal(posix_memalign(&in->pool, 4096, in->layout.page_bytes * POOL_PAGES), 0);
	memset(in->pool, 0, in->layout.page_bytes * POOL_PAGES);
	struct kvd_paged_view v = {.base = in->pool, .n_pages = POOL_PAGES, .layout = in->layout};
	assert_int_equal(ops->attach_kv(in->ctx, &v), 0);
}

static void inst_open(struct inst *in, const struct kvd_backend_ops *ops, const struct kvd_model_weights *w)
{
	inst_open_kv(in, ops, w, KVD_KV_F16);
}

static void inst_close(struct inst *in)
{
	in->ops->destroy(in->ctx);
	free(in->pool);
}

/* ---- conformance ---------------------------------------------------------------- */

struct tseq {
	int32_t pages[MAX_SEQ_PAGES];
	int32_t hist[MAX_SEQ_LEN];
	int len;
};

struct conf {
	const struct kvd_model_weights *w;
	struct inst cpu, gpu;
	struct tseq seqs[6];
	int n_seqs;
	double tol_cpu; /* TOL_CPU_QUANT or TOL_CPU_FLOAT */
	int ref;        /* compared with reference_forward too (Llama-base models: it knows no features) */
	double worst_cpu, worst_ref, worst_kv;
};

/* One step on both backends: sequence which[i] gets ntok[i] new random
 * tokens; all logits rows are compared. */
static void conf_step(struct conf *C, int n, const int *which, const int *ntok)
{
	const struct kvd_hparams *hp = &C->w->hp;
	struct kvd_batch_seq bs[8];
	int32_t toks[8][MAX_SEQ_LEN];
	float *lc[8], *lg[8];
	assert_true(n <= 8);
	for (int i = 0; i < n; i++) {
		struct tseq *s = &C->seqs[which[i]];
		assert_true(s->len + ntok[i] <= MAX_SEQ_LEN);
		for (int j = 0; j < ntok[i]; j++)
			toks[i][j] = (int32_t)(rnd_u32() % (uint32_t)hp->n_vocab);
		lc[i] = malloc(sizeof(float) * (size_t)ntok[i] * hp->n_vocab);
		lg[i] = malloc(sizeof(float) * (size_t)ntok[i] * hp->n_vocab);
		assert_true(lc[i] && lg[i]);
		bs[i] = (struct kvd_batch_seq){.tokens = toks[i], .n_tokens = ntok[i], .pos0 = s->len, .pages = s->pages,
					       .n_pages = MAX_SEQ_PAGES, .all_logits = 1, .logits = lc[i]};
	}
	struct kvd_batch b = {.n_seqs = n, .seqs = bs};
	assert_int_equal(C->cpu.ops->forward(C->cpu.ctx, &b), 0);
	for (int i = 0; i < n; i++)
		bs[i].logits = lg[i];
	assert_int_equal(C->gpu.ops->forward(C->gpu.ctx, &b), 0);
	for (int i = 0; i < n; i++) {
		struct tseq *s = &C->seqs[which[i]];
		memcpy(s->hist + s->len, toks[i], sizeof(int32_t) * (size_t)ntok[i]);
		s->len += ntok[i];
		float *ref = C->ref ? malloc(sizeof(float) * (size_t)s->len * hp->n_vocab) : NULL;
		assert_true(ref || !C->ref);
		if (ref)
			reference_forward(C->w, s->hist, s->len, 1, ref);
		for (int j = 0; j < ntok[i]; j++) {
			size_t nv = (size_t)hp->n_vocab;
			double ec = rel_l2(lg[i] + j * nv, lc[i] + j * nv, nv);
			double er = ref ? rel_l2(lg[i] + j * nv, ref + (size_t)(s->len - ntok[i] + j) * nv, nv) : 0.0;
			if (ec > C->worst_cpu)
				C->worst_cpu = ec;
			if (er > C->worst_ref)
				C->worst_ref = er;
			if (ec > C->tol_cpu || er > TOL_LOGITS_REF)
				fail_msg("seq %d pos %d: logits error vs cpu %.3g (tol %.3g), vs reference %.3g (tol %.3g)",
					 which[i], s->len - ntok[i] + j, ec, C->tol_cpu, er, TOL_LOGITS_REF);
		}
		free(ref);
		free(lc[i]);
		free(lg[i]);
	}
}

/* Every page in use: the CUDA pool (via page_read) against the CPU pool,
 * per layer and K/V block, over the rows the sequences have written. */
static void conf_check_kv(struct conf *C)
{
	const struct kvd_kv_layout *L = &C->cpu.layout;
	char *pg = malloc(L->page_bytes);
	float *a = malloc(sizeof(float) * BLOCK * L->kv_dim), *b = malloc(sizeof(float) * BLOCK * L->kv_dim);
	assert_true(pg && a && b);
	for (int si = 0; si < C->n_seqs; si++) {
		const struct tseq *s = &C->seqs[si];
		for (int p = 0; p * BLOCK < s->len; p++) {
			int rows = s->len - p * BLOCK < BLOCK ? s->len - p * BLOCK : BLOCK;
			uint32_t page = (uint32_t)s->pages[p];
			assert_int_equal(C->gpu.ops->page_read(C->gpu.ctx, page, pg), 0);
			const char *cp = (const char *)C->cpu.pool + (size_t)page * L->page_bytes;
			for (uint32_t blk = 0; blk < 2 * L->n_layer; blk++) {
				/* both pools decoded as the CPU reads its own: the
				 * plug-in's bytes are in the CPU's layout */
				for (int t = 0; t < rows; t++) {
					size_t o = blk * L->v_offset + (size_t)t * L->token_stride;
					cpu_kvq_load_row(L->type, pg + o, a + (size_t)t * L->kv_dim, (int)L->kv_dim);
					cpu_kvq_load_row(L->type, cp + o, b + (size_t)t * L->kv_dim, (int)L->kv_dim);
				}
				double e = rel_l2(a, b, (size_t)rows * L->kv_dim);
				if (e > C->worst_kv)
					C->worst_kv = e;
				if (e > C->tol_cpu)
					fail_msg("seq %d page %u layer %u %s: error %.3g > %.3g", si, page, blk / 2,
						 blk % 2 ? "V" : "K", e, C->tol_cpu);
			}
		}
	}
	free(pg);
	free(a);
	free(b);
}

static const struct tshape shapes[] = {
	{"gqa-q4_1", 3, 256, 8, 2, 512, 300, KVD_WTYPE_Q4_1, KVD_WTYPE_Q8_0, 0, 0, KVD_ROPE_NORM, 0, 0, 0},
	{"mha-f16", 2, 128, 4, 4, 256, 300, KVD_WTYPE_F16, KVD_WTYPE_F16, 0, 0, KVD_ROPE_NORM, 0, 0, 0},
	{"mqa-q4_0", 2, 128, 4, 1, 384, 300, KVD_WTYPE_Q4_0, KVD_WTYPE_Q4_0, 0, 0, KVD_ROPE_NORM, 0, 0, 0},
	{"untied-q8_0", 2, 128, 4, 2, 256, 300, KVD_WTYPE_Q8_0, KVD_WTYPE_F32, KVD_WTYPE_Q8_0, 1, KVD_ROPE_NORM, 0, 0, 0},
	{"odd-q4_1", 3, 96, 3, 1, 224, 301, KVD_WTYPE_Q4_1, KVD_WTYPE_Q4_1, 0, 0, KVD_ROPE_NORM, 500000.0f, 1e-6f, 0},
	{"type-f32", 2, 128, 4, 2, 320, 300, KVD_WTYPE_F32, KVD_WTYPE_F32, 0, 0, KVD_ROPE_NORM, 0, 0, 0},
	{"type-bf16", 2, 128, 4, 2, 320, 300, KVD_WTYPE_BF16, KVD_WTYPE_BF16, 0, 0, KVD_ROPE_NORM, 0, 0, 0},
	{"type-q8_0", 2, 128, 4, 2, 320, 300, KVD_WTYPE_Q8_0, KVD_WTYPE_Q8_0, 0, 0, KVD_ROPE_NORM, 0, 0, 0},
	{"type-q4_0", 2, 128, 4, 2, 320, 300, KVD_WTYPE_Q4_0, KVD_WTYPE_Q4_0, 0, 0, KVD_ROPE_NORM, 0, 0, 0},
	{"neox-hd64-f16", 2, 256, 4, 2, 256, 300, KVD_WTYPE_F16, KVD_WTYPE_Q8_0, 0, 0, KVD_ROPE_NEOX, 0, 0, 0},
	{"gqa16-hd32", 2, 512, 16, 1, 256, 300, KVD_WTYPE_Q8_0, KVD_WTYPE_F16, 0, 0, KVD_ROPE_NORM, 0, 0, 0},
	/* the weight types K-quant files are made of */
	{"type-q5_0", 2, 128, 4, 2, 320, 300, KVD_WTYPE_Q5_0, KVD_WTYPE_Q5_1, 0, 0, KVD_ROPE_NORM, 0, 0, 0},
	{"type-q5_1", 2, 128, 4, 2, 320, 300, KVD_WTYPE_Q5_1, KVD_WTYPE_Q5_0, 0, 0, KVD_ROPE_NORM, 0, 0, 0},
	{"type-q4_K", 2, 256, 4, 2, 512, 300, KVD_WTYPE_Q4_K, KVD_WTYPE_Q6_K, 0, 0, KVD_ROPE_NORM, 0, 0, 0},
	{"type-q5_K", 2, 256, 4, 2, 512, 300, KVD_WTYPE_Q5_K, KVD_WTYPE_Q4_K, KVD_WTYPE_Q6_K, 1, KVD_ROPE_NORM, 0, 0, 0},
	{"type-q6_K", 2, 256, 4, 2, 512, 300, KVD_WTYPE_Q6_K, KVD_WTYPE_Q5_K, 0, 0, KVD_ROPE_NORM, 0, 0, 0},
	/* the architectures' departures from the Llama base (make_model_features) */
	{"qwen2-bias", 2, 128, 4, 2, 256, 300, KVD_WTYPE_Q8_0, KVD_WTYPE_Q8_0, 0, 0, KVD_ROPE_NEOX, 1000000.0f, 1e-6f,
	 KVD_FEAT_QKV_BIAS},
	{"qwen3-qknorm", 2, 128, 4, 2, 256, 300, KVD_WTYPE_F16, KVD_WTYPE_F16, 0, 0, KVD_ROPE_NEOX, 1000000.0f, 1e-6f,
	 KVD_FEAT_QK_NORM},
	{"gemma3-like", 4, 256, 4, 1, 512, 300, KVD_WTYPE_Q8_0, KVD_WTYPE_Q8_0, 0, 0, KVD_ROPE_NEOX, 1000000.0f, 1e-6f,
	 KVD_FEAT_QK_NORM | KVD_FEAT_POST_NORM | KVD_FEAT_GELU | KVD_FEAT_WINDOW | KVD_FEAT_LAYER_ROPE |
		 KVD_FEAT_EMBD_SCALE | KVD_FEAT_ATTN_SCALE},
	{"llama3-rope", 2, 128, 4, 2, 256, 300, KVD_WTYPE_F16, KVD_WTYPE_F16, 0, 0, KVD_ROPE_NORM, 500000.0f, 0,
	 KVD_FEAT_ROPE_FREQS | KVD_FEAT_ROPE_LINEAR},
	{"mistral-window", 2, 128, 4, 2, 256, 300, KVD_WTYPE_Q4_0, KVD_WTYPE_Q4_0, 0, 0, KVD_ROPE_NORM, 0, 0,
	 KVD_FEAT_WINDOW},
};

static double tol_cpu(const struct tshape *sh)
{
	enum kvd_wtype out = sh->untied ? sh->otype : sh->etype;
	return wtype_is_quantized(sh->wtype) || wtype_is_quantized(out) ? TOL_CPU_QUANT : TOL_CPU_FLOAT;
}

/* Physical pages handed out in a shuffled order, so page tables are
 * scattered over the pool. */
static void assign_pages(struct conf *C, int n_seqs)
{
	int32_t perm[POOL_PAGES];
	for (int i = 0; i < POOL_PAGES; i++)
		perm[i] = i;
	for (int i = POOL_PAGES - 1; i > 0; i--) {
		int j = (int)(rnd_u32() % (uint32_t)(i + 1));
		int32_t t = perm[i];
		perm[i] = perm[j];
		perm[j] = t;
	}
	assert_true(n_seqs * MAX_SEQ_PAGES <= POOL_PAGES - 2);
	C->n_seqs = n_seqs;
	for (int s = 0; s < n_seqs; s++) {
		memset(&C->seqs[s], 0, sizeof(C->seqs[s]));
		for (int p = 0; p < MAX_SEQ_PAGES; p++)
			C->seqs[s].pages[p] = perm[s * MAX_SEQ_PAGES + p];
	}
}

/* Every sequence's written pages of the CPU pool copied into the plug-in's
 * (page_write: a page is bytes in one layout on both backends), so the
 * steps after start from the same cache on both. */
static void conf_share_pages(struct conf *C)
{
	const struct kvd_kv_layout *L = &C->cpu.layout;
	for (int si = 0; si < C->n_seqs; si++)
		for (int p = 0; p * BLOCK < C->seqs[si].len; p++) {
			uint32_t page = (uint32_t)C->seqs[si].pages[p];
			assert_int_equal(C->gpu.ops->page_write(C->gpu.ctx, page,
							       (const char *)C->cpu.pool + (size_t)page * L->page_bytes), 0);
		}
}

/* The conformance batches on shape sh with a KV pool of element type kt on
 * both backends. With a type other than f16 the float64 reference (which
 * rounds K/V to f16) is left out; the CPU backend with the same type is the
 * reference, and after the KV check the CPU's pages are handed to the
 * plug-in, whose next steps must then read them as the CPU does. */
static void run_conformance_kv(const struct tshape *sh, enum kvd_kv_type kt)
{
	const struct kvd_backend_ops *ops = need_gpu();
	struct tmodel *m = make_model(sh, 7 + (uint64_t)(sh - shapes));
	struct conf *C = calloc(1, sizeof(*C));
	assert_non_null(C);
	C->w = &m->w;
	C->tol_cpu = kt == KVD_KV_Q4_0 ? TOL_CPU_Q4_KV : kt == KVD_KV_Q8_0 ? TOL_CPU_QUANT : tol_cpu(sh);
	C->ref = sh->feats == 0 && kt == KVD_KV_F16;
	inst_open_kv(&C->cpu, &kvd_cpu_backend, &m->w, kt);
	inst_open_kv(&C->gpu, ops, &m->w, kt);
	assign_pages(C, 5);

	/* one-chunk prefill of 37 tokens (spans three pages) */
	{ int w[] = {0}, n[] = {37}; conf_step(C, 1, w, n); }
	conf_check_kv(C);
	/* decodes */
	for (int k = 0; k < 3; k++) { int w[] = {0}, n[] = {1}; conf_step(C, 1, w, n); }
	/* chunked prefill of seq 1 (chunks end mid-page), beside decodes of seq 0 */
	{ int w[] = {1, 0}, n[] = {13, 1}; conf_step(C, 2, w, n); }
	{ int w[] = {0, 1}, n[] = {1, 20}; conf_step(C, 2, w, n); }
	/* a mixed batch: a long prefill, a 1-token prompt, decodes, a 2-token chunk */
	{ int w[] = {2, 3, 0, 1, 4}, n[] = {70, 1, 1, 1, 2}; conf_step(C, 5, w, n); }
	{ int w[] = {3, 2, 4, 1}, n[] = {1, 1, 1, 1}; conf_step(C, 4, w, n); }
	/* a decode at a page boundary and beyond */
	while (C->seqs[1].len < 2 * BLOCK + 1) { int w[] = {1}, n[] = {1}; conf_step(C, 1, w, n); }
	conf_check_kv(C);
	if (kt != KVD_KV_F16) {
		conf_share_pages(C);
		int w[] = {0, 1, 2, 3, 4}, n[] = {1, 1, 3, 1, 1};
		conf_step(C, 5, w, n);
	}
	if (kt != KVD_KV_F16)
		print_message("%s, %s KV: worst logits error vs cpu %.3g (tol %.3g), kv %.3g (tol %.3g)\n", sh->name,
			      kvd_kv_type_name(kt), C->worst_cpu, C->tol_cpu, C->worst_kv, C->tol_cpu);
	else if (C->ref)
		print_message("%s: worst logits error vs cpu %.3g (tol %.3g), vs reference %.3g (tol %.3g), kv %.3g (tol %.3g)\n",
			      sh->name, C->worst_cpu, C->tol_cpu, C->worst_ref, TOL_LOGITS_REF, C->worst_kv, C->tol_cpu);
	else
		print_message("%s: worst logits error vs cpu %.3g (tol %.3g), kv %.3g (tol %.3g)\n", sh->name,
			      C->worst_cpu, C->tol_cpu, C->worst_kv, C->tol_cpu);
	inst_close(&C->gpu);
	inst_close(&C->cpu);
	free(C);
	free_model(m);
}

static void run_conformance(const struct tshape *sh)
{
	run_conformance_kv(sh, KVD_KV_F16);
}

#define CONF_TEST(i) \
	static void test_conformance_##i(void **state) { (void)state; run_conformance(&shapes[i]); }
CONF_TEST(0) CONF_TEST(1) CONF_TEST(2) CONF_TEST(3) CONF_TEST(4) CONF_TEST(5)
CONF_TEST(6) CONF_TEST(7) CONF_TEST(8) CONF_TEST(9) CONF_TEST(10)
CONF_TEST(11) CONF_TEST(12) CONF_TEST(13) CONF_TEST(14) CONF_TEST(15)
CONF_TEST(16) CONF_TEST(17) CONF_TEST(18) CONF_TEST(19) CONF_TEST(20)

/* The KV element types other than f16, each on a shape that reaches a
 * different path of the attention tiles: q8_0 with head size 32 (34-byte
 * heads, copied in 16-bit words), q4_0 with 64 (36-byte heads, 32-bit
 * words) and NeoX RoPE, bf16 and f32. Named apart from test_conformance_*,
 * which t_cuda_emulated.sh runs again through the GEMV (the projections,
 * not the KV types). */
static void test_kvtype_f32(void **state) { (void)state; run_conformance_kv(&shapes[5], KVD_KV_F32); }
static void test_kvtype_bf16(void **state) { (void)state; run_conformance_kv(&shapes[1], KVD_KV_BF16); }
static void test_kvtype_q8_0(void **state) { (void)state; run_conformance_kv(&shapes[0], KVD_KV_Q8_0); }
static void test_kvtype_q4_0(void **state) { (void)state; run_conformance_kv(&shapes[9], KVD_KV_Q4_0); }

/*
 * kv_shift on the plug-in against the CPU's: the same cache (the CPU's
 * pages after a prefill, written into the plug-in's pool) re-rotated by the
 * same deltas must give the very same bytes on both (the rotation table is
 * the CPU's, the rotation rounds as the CPU's does), for each KV type the
 * CPU shifts, with each RoPE variant: NeoX pairs with per-layer bases
 * (gemma3-like) and normal pairs with rope_freqs and linear scaling
 * (llama3-rope). A decode step after the shifts must then agree with the
 * CPU's within the conformance tolerance. The block-quantized types are
 * refused (-ENOTSUP), as the CPU refuses them; bad page tables are
 * -EINVAL.
 */
static void shift_case(const struct kvd_backend_ops *ops, const struct tshape *sh, enum kvd_kv_type kt)
{
	struct tmodel *m = make_model(sh, 11 + (uint64_t)(sh - shapes));
	struct conf *C = calloc(1, sizeof(*C));
	const struct kvd_hparams *hp = &m->w.hp;
	assert_non_null(C);
	C->w = &m->w;
	C->tol_cpu = tol_cpu(sh);
	inst_open_kv(&C->cpu, &kvd_cpu_backend, &m->w, kt);
	inst_open_kv(&C->gpu, ops, &m->w, kt);
	assign_pages(C, 1);
	struct tseq *s = &C->seqs[0];
	int32_t toks[37];
	for (int i = 0; i < 37; i++)
		toks[i] = (int32_t)(rnd_u32() % (uint32_t)hp->n_vocab);
	struct kvd_batch_seq bs = {.tokens = toks, .n_tokens = 37, .pos0 = 0, .pages = s->pages,
				   .n_pages = MAX_SEQ_PAGES};
	struct kvd_batch b = {.n_seqs = 1, .seqs = &bs};
	assert_int_equal(C->cpu.ops->forward(C->cpu.ctx, &b), 0);
	s->len = 37;
	conf_share_pages(C);
	const struct kvd_kv_layout *L = &C->cpu.layout;
	char *pg = malloc(L->page_bytes);
	assert_non_null(pg);
	if (kt == KVD_KV_Q8_0 || kt == KVD_KV_Q4_0) {
		assert_int_equal(C->gpu.ops->kv_shift(C->gpu.ctx, s->pages, 3, 37, -16), -ENOTSUP);
		goto done;
	}
	static const int32_t deltas[] = {-16, 7, -3};
	for (size_t k = 0; k < sizeof(deltas) / sizeof(deltas[0]); k++) {
		assert_int_equal(C->cpu.ops->kv_shift(C->cpu.ctx, s->pages, 3, 37, deltas[k]), 0);
		assert_int_equal(C->gpu.ops->kv_shift(C->gpu.ctx, s->pages, 3, 37, deltas[k]), 0);
	}
	for (int p = 0; p < 3; p++) {
		const char *cp = (const char *)C->cpu.pool + (size_t)s->pages[p] * L->page_bytes;
		assert_int_equal(C->gpu.ops->page_read(C->gpu.ctx, (uint32_t)s->pages[p], pg), 0);
		for (size_t o = 0; o < L->page_bytes; o++)
			if (pg[o] != cp[o])
				fail_msg("%s, %s KV: page %d differs from the CPU's after kv_shift at byte %zu (layer %zu)",
					 sh->name, kvd_kv_type_name(kt), p, o, o / L->layer_stride);
	}
	{ int w[] = {0}, n[] = {1}; conf_step(C, 1, w, n); }
	/* bad arguments change nothing */
	int32_t bad[3] = {s->pages[0], POOL_PAGES, s->pages[2]};
	assert_int_equal(C->gpu.ops->kv_shift(C->gpu.ctx, bad, 3, 37, 5), -EINVAL);
	assert_int_equal(C->gpu.ops->kv_shift(C->gpu.ctx, s->pages, 2, 37, 5), -EINVAL);
	print_message("%s, %s KV: kv_shift by -16, 7, -3 identical to the CPU's; next logits error %.3g\n", sh->name,
		      kvd_kv_type_name(kt), C->worst_cpu);
done:
	free(pg);
	inst_close(&C->gpu);
	inst_close(&C->cpu);
	free(C);
	free_model(m);
}

/* One decode of token tok at position pos of seq s (page table pages) on
 * instance in; its logits to out. Returns forward's result. */
static int decode_at(struct inst *in, const int32_t *pages, int32_t tok, int32_t pos, float *out)
{
	struct kvd_batch_seq bs = {.tokens = &tok, .n_tokens = 1, .pos0 = pos, .pages = pages,
				   .n_pages = MAX_SEQ_PAGES, .logits = out};
	struct kvd_batch b = {.n_seqs = 1, .seqs = &bs};
	return in->ops->forward(in->ctx, &b);
}

/* Slot `slot` of packed page dst := the layers without a window of page src,
 * in the instance's pool (through page_read / page_write on the plug-in,
 * as the engine does for a device pool), then src scribbled over, so that
 * a forward still reading it would show. */
static void pack_page(struct inst *in, const struct kvd_model_weights *w, int32_t dst, uint32_t slot, int32_t src,
		      uint32_t n_global)
{
	const struct kvd_kv_layout *L = &in->layout;
	int dev = in->ops != &kvd_cpu_backend;
	char *d = dev ? malloc(L->page_bytes) : (char *)in->pool + (size_t)dst * L->page_bytes;
	char *s = dev ? malloc(L->page_bytes) : (char *)in->pool + (size_t)src * L->page_bytes;
	assert_true(d && s);
	if (dev) {
		assert_int_equal(in->ops->page_read(in->ctx, (uint32_t)dst, d), 0);
		assert_int_equal(in->ops->page_read(in->ctx, (uint32_t)src, s), 0);
	}
	for (int l = 0, g = 0; l < w->hp.n_layer; l++)
		if (w->layers[l].d.window <= 0)
			memcpy(d + ((size_t)slot * n_global + (size_t)g++) * L->layer_stride, s + (size_t)l * L->layer_stride,
			       L->layer_stride);
	memset(s, 0x7f, L->page_bytes); /* f16 NaNs */
	if (dev) {
		assert_int_equal(in->ops->page_write(in->ctx, (uint32_t)dst, d), 0);
		assert_int_equal(in->ops->page_write(in->ctx, (uint32_t)src, s), 0);
		free(d);
		free(s);
	}
}

/*
 * Released pages (KVD_CAP_PACKED_KV) on the plug-in: on a Gemma-like model
 * (windowed local layers, global ones), the first two pages of a 40-token
 * sequence are packed into slots of another page (their global layers'
 * K/V) and scribbled over; a decode through the page table naming the
 * packed entries gives the very logits the plain table gave (the same
 * bytes are read), and the CPU's within the tolerance. Entries a windowed
 * layer still reads, a slot past the packed page's and a page past the
 * pool are -EINVAL.
 */
static void test_released_pages(void **state)
{
	const struct kvd_backend_ops *ops = need_gpu();
	const struct tshape *sh = &shapes[18]; /* gemma3-like */
	struct tmodel *m = make_model(sh, 23);
	const struct kvd_hparams *hp = &m->w.hp;
	struct conf *C = calloc(1, sizeof(*C));
	uint32_t n_global = 0, max_window = 0, slots = kvd_kv_pack_slots(&m->w, &n_global, &max_window);
	size_t nv = (size_t)hp->n_vocab;
	float *plain = malloc(sizeof(float) * nv), *rel = malloc(sizeof(float) * nv), *cpu = malloc(sizeof(float) * nv);
	(void)state;
	assert_true(C && plain && rel && cpu);
	assert_true(slots >= 2 && max_window > 0 && max_window < BLOCK);
	C->w = &m->w;
	inst_open(&C->cpu, &kvd_cpu_backend, &m->w);
	inst_open(&C->gpu, ops, &m->w);
	assign_pages(C, 1);
	struct tseq *s = &C->seqs[0];
	{ int w[] = {0}, n[] = {40}; C->tol_cpu = tol_cpu(sh); conf_step(C, 1, w, n); }
	int32_t tok = 17, packed = s->pages[MAX_SEQ_PAGES - 1];
	assert_int_equal(decode_at(&C->gpu, s->pages, tok, 40, plain), 0);
	for (int i = 0; i < 2; i++) {
		pack_page(&C->gpu, &m->w, packed, (uint32_t)i, s->pages[i], n_global);
		pack_page(&C->cpu, &m->w, packed, (uint32_t)i, s->pages[i], n_global);
	}
	int32_t t[MAX_SEQ_PAGES];
	memcpy(t, s->pages, sizeof(t));
	t[0] = kvd_page_packed((uint32_t)packed, 0);
	t[1] = kvd_page_packed((uint32_t)packed, 1);
	assert_int_equal(decode_at(&C->gpu, t, tok, 40, rel), 0);
	assert_int_equal(decode_at(&C->cpu, t, tok, 40, cpu), 0);
	if (memcmp(plain, rel, sizeof(float) * nv))
		fail_msg("logits through the packed pages differ from the plain table's (error %.3g)", rel_l2(rel, plain, nv));
	double e = rel_l2(rel, cpu, nv);
	if (e > C->tol_cpu)
		fail_msg("logits through the packed pages: error vs cpu %.3g > %.3g", e, C->tol_cpu);
	/* page 2 (positions 32..47) is still in the windowed layers' window of
	 * position 40; a slot and a page out of range */
	int32_t bad[MAX_SEQ_PAGES];
	memcpy(bad, t, sizeof(bad));
	bad[2] = kvd_page_packed((uint32_t)packed, 2);
	assert_int_equal(decode_at(&C->gpu, bad, tok, 40, rel), -EINVAL);
	memcpy(bad, t, sizeof(bad));
	bad[1] = kvd_page_packed((uint32_t)packed, slots);
	assert_int_equal(decode_at(&C->gpu, bad, tok, 40, rel), -EINVAL);
	bad[1] = kvd_page_packed(POOL_PAGES, 1);
	assert_int_equal(decode_at(&C->gpu, bad, tok, 40, rel), -EINVAL);
	print_message("%s: a decode through %u-slot packed pages gives the plain table's logits; vs cpu %.3g\n",
		      sh->name, slots, e);
	inst_close(&C->gpu);
	inst_close(&C->cpu);
	free(plain);
	free(rel);
	free(cpu);
	free(C);
	free_model(m);
}

static void test_kv_shift(void **state)
{
	const struct kvd_backend_ops *ops = need_gpu();
	(void)state;
	assert_true(kvd_backend_has_kv_shift(ops));
	shift_case(ops, &shapes[18], KVD_KV_F16);  /* gemma3-like: NeoX, per-layer bases */
	shift_case(ops, &shapes[19], KVD_KV_F16);  /* llama3-rope: rope_freqs, linear scaling */
	shift_case(ops, &shapes[19], KVD_KV_BF16);
	shift_case(ops, &shapes[18], KVD_KV_F32);
	shift_case(ops, &shapes[19], KVD_KV_Q8_0); /* refused */
	shift_case(ops, &shapes[18], KVD_KV_Q4_0);
}

/* The tolerances hold for the CPU backend against the same reference, so
 * they are attainable by a correct CUDA backend (runs without a GPU). */
static void test_reference_vs_cpu(void **state)
{
	int bad = 0;
	(void)state;
	for (size_t si = 0; si < sizeof(shapes) / sizeof(shapes[0]); si++) {
		const struct tshape *sh = &shapes[si];
		if (sh->feats) /* the reference is the Llama base; these compare with the CPU only */
			continue;
		struct tmodel *m = make_model(sh, 7 + si);
		struct inst cpu;
		const int n = 40;
		int32_t toks[40];
		size_t nv = (size_t)m->w.hp.n_vocab;
		float *lc = malloc(sizeof(float) * n * nv), *ref = malloc(sizeof(float) * n * nv);
		double worst = 0;
		assert_true(lc && ref);
		inst_open(&cpu, &kvd_cpu_backend, &m->w);
		for (int i = 0; i < n; i++)
			toks[i] = (int32_t)(rnd_u32() % (uint32_t)nv);
		int32_t pages[MAX_SEQ_PAGES] = {5, 2, 9, 0, 7, 1, 3, 4};
		struct kvd_batch_seq s = {.tokens = toks, .n_tokens = n, .pos0 = 0, .pages = pages,
					  .n_pages = MAX_SEQ_PAGES, .all_logits = 1, .logits = lc};
		struct kvd_batch b = {.n_seqs = 1, .seqs = &s};
		assert_int_equal(cpu.ops->forward(cpu.ctx, &b), 0);
		reference_forward(&m->w, toks, n, 1, ref);
		for (int t = 0; t < n; t++) {
			double e = rel_l2(lc + t * nv, ref + t * nv, nv);
			if (e > worst)
				worst = e;
		}
		print_message("%s: cpu vs fp16-rounding reference: worst logits error %.3g\n", sh->name, worst);
		/* CUDA must be within TOL_LOGITS_REF of the reference and
		 * tol_cpu() of the CPU: leave room for both */
		if (worst + TOL_LOGITS_REF > tol_cpu(sh))
			bad++;
		inst_close(&cpu);
		free(lc);
		free(ref);
		free_model(m);
	}
	assert_int_equal(bad, 0);
}

/* Page moves are exact: page_write/page_read round trip, page_copy of the
 * first n rows (and nothing else), gather/scatter of many pages. */
static void test_page_ops(void **state)
{
	(void)state;
	const struct kvd_backend_ops *ops = need_gpu();
	struct tmodel *m = make_model(&shapes[0], 99);
	struct inst g;
	inst_open(&g, ops, &m->w);
	size_t pb = g.layout.page_bytes;
	uint8_t *a = malloc(pb * 8), *b = malloc(pb * 8);
	assert_true(a && b);
	for (size_t i = 0; i < pb * 8; i++)
		a[i] = (uint8_t)rnd_u32();
	/* single pages, into pageable memory and into the registered host tier */
	assert_int_equal(ops->page_write(g.ctx, 3, a), 0);
	assert_int_equal(ops->page_read(g.ctx, 3, b), 0);
	assert_memory_equal(a, b, pb);
	assert_int_equal(ops->page_read(g.ctx, 3, (char *)g.pool + 3 * pb), 0);
	assert_memory_equal(a, (char *)g.pool + 3 * pb, pb);
	assert_int_equal(ops->page_read(g.ctx, POOL_PAGES, b), -EINVAL);
	/* copy-on-write: first 5 rows of every K/V block */
	assert_int_equal(ops->page_write(g.ctx, 4, a + pb), 0);
	assert_int_equal(ops->page_copy(g.ctx, 4, 3, 5), 0);
	assert_int_equal(ops->page_read(g.ctx, 4, b), 0);
	for (uint32_t blk = 0; blk < 2 * g.layout.n_layer; blk++) {
		size_t off = blk * g.layout.v_offset, n = 5 * g.layout.token_stride;
		assert_memory_equal(b + off, a + off, n);
		assert_memory_equal(b + off + n, a + pb + off + n, g.layout.v_offset - n);
	}
	assert_int_equal(ops->page_copy(g.ctx, 4, 3, BLOCK + 1), -EINVAL);
	/* gather / scatter */
	uint32_t pl[6] = {10, 2, 40, 41, 7, 90};
	assert_int_equal(ops->pages_write(g.ctx, pl, 6, a), 0);
	memset(b, 0, pb * 8);
	assert_int_equal(ops->pages_read(g.ctx, pl, 6, b), 0);
	assert_memory_equal(a, b, pb * 6);
	for (int i = 0; i < 6; i++) {
		assert_int_equal(ops->page_read(g.ctx, pl[i], b), 0);
		assert_memory_equal(a + (size_t)i * pb, b, pb);
	}
	pl[0] = POOL_PAGES;
	assert_int_equal(ops->pages_read(g.ctx, pl, 6, b), -EINVAL);
	/* pool sizing */
	uint32_t np = 0;
	assert_int_equal(ops->suggest_pool_pages(g.ctx, pb, 0.5, &np), 0);
	assert_true(np > 0);
	assert_int_equal(ops->suggest_pool_pages(g.ctx, pb, 0.0, &np), -EINVAL);
	free(a);
	free(b);
	inst_close(&g);
	free_model(m);
}

/* Bad input is refused before anything runs on the device. */
static void test_forward_validation(void **state)
{
	(void)state;
	const struct kvd_backend_ops *ops = need_gpu();
	struct tmodel *m = make_model(&shapes[1], 5);
	struct inst g;
	inst_open(&g, ops, &m->w);
	int32_t tok[2] = {1, 300}, pages[2] = {0, POOL_PAGES};
	struct kvd_batch_seq s = {.tokens = tok, .n_tokens = 2, .pos0 = 0, .pages = pages, .n_pages = 1};
	struct kvd_batch b = {.n_seqs = 1, .seqs = &s};
	assert_int_equal(ops->forward(g.ctx, &b), -EINVAL); /* token out of range */
	tok[1] = 2;
	s.pos0 = BLOCK - 1;
	assert_int_equal(ops->forward(g.ctx, &b), -E2BIG); /* past the page table */
	s.n_pages = 2;
	assert_int_equal(ops->forward(g.ctx, &b), -EINVAL); /* page out of the pool */
	pages[1] = 1;
	assert_int_equal(ops->forward(g.ctx, &b), 0);
	/* wrong model shapes are refused at load */
	struct kvd_backend_config cfg = {.n_threads = 1};
	void *ctx;
	assert_int_equal(ops->init(&cfg, &ctx), 0);
	struct kvd_model_weights bad = m->w;
	bad.hp.n_head_kv = 3;
	assert_int_equal(ops->load(ctx, &bad), -EINVAL);
	ops->destroy(ctx);
	inst_close(&g);
	free_model(m);
}

/* Greedy decoding of the default model on both backends, fed the same
 * tokens (the CPU's choices): the argmax agrees at every step but near-ties
 * of the CPU logits (top-2 gap within 4x the rms logit difference between
 * the backends), and those are at most 1 step in 4. */
static void test_default_model_greedy(void **state)
{
	(void)state;
	const struct kvd_backend_ops *ops = need_gpu();
	const char *path = getenv("KVD_TEST_MODEL");
	if (!path || !*path)
		path = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
	if (strcmp(path, "none") == 0) {
		print_message("skipped: the default model's test is turned off here (KVD_TEST_MODEL=none)\n");
		skip();
	}
	if (access(path, R_OK) != 0) {
		print_message("skipped: the default model %s is not present (scripts/setup fetches it)\n", path);
		skip();
	}
	struct kvd_model *model = NULL;
	char err[256];
	assert_int_equal(kvd_model_load(path, &model, err, sizeof(err)), 0);
	const struct kvd_model_weights *w = kvd_model_weights(model);
	struct inst cpu, gpu;
	inst_open(&cpu, &kvd_cpu_backend, w);
	inst_open(&gpu, ops, w);
	size_t nv = (size_t)w->hp.n_vocab;
	float *lc = malloc(sizeof(float) * nv), *lg = malloc(sizeof(float) * nv);
	assert_true(lc && lg);
	int32_t toks[64];
	const char *prompt = "The sky is blue because";
	const int steps = 40;
	int n = kvd_tokenize(kvd_model_tokenizer(model), prompt, strlen(prompt), 0, 0, toks, 16);
	assert_true(n > 0 && n <= 16);
	int32_t pages[4] = {3, 1, 2, 0};
	int pos = 0, fed = n, flips = 0;
	double worst = 0;
	for (int step = 0; step < steps; step++) {
		struct kvd_batch_seq s = {.tokens = toks + pos, .n_tokens = fed, .pos0 = pos, .pages = pages,
					  .n_pages = 4, .logits = lc};
		struct kvd_batch b = {.n_seqs = 1, .seqs = &s};
		assert_int_equal(cpu.ops->forward(cpu.ctx, &b), 0);
		s.logits = lg;
		assert_int_equal(gpu.ops->forward(gpu.ctx, &b), 0);
		int32_t ac = 0, ag = 0, second = -1;
		for (size_t i = 1; i < nv; i++) {
			if (lc[i] > lc[ac])
				ac = (int32_t)i;
			if (lg[i] > lg[ag])
				ag = (int32_t)i;
		}
		for (size_t i = 0; i < nv; i++)
			if ((int32_t)i != ac && (second < 0 || lc[i] > lc[second]))
				second = (int32_t)i;
		double e = rel_l2(lg, lc, nv), ms = 0;
		for (size_t i = 0; i < nv; i++)
			ms += ((double)lg[i] - lc[i]) * ((double)lg[i] - lc[i]);
		double rms = sqrt(ms / (double)nv);
		if (e > worst)
			worst = e;
		assert_true(e < TOL_CPU_QUANT);
		if (ac != ag) {
			float gap = lc[ac] - lc[second];
			print_message("step %d: cpu %d, cuda %d, cpu top-2 gap %.4f, rms logit difference %.4f\n", step,
				      ac, ag, gap, rms);
			assert_true(gap <= 4.0 * rms + 1e-3);
			flips++;
		}
		pos += fed;
		toks[pos] = ac;
		fed = 1;
	}
	print_message("default model: argmax equal at %d of %d steps, worst logits error %.3g\n", steps - flips,
		      steps, worst);
	assert_true(flips * 4 <= steps);
	free(lc);
	free(lg);
	inst_close(&gpu);
	inst_close(&cpu);
	kvd_model_free(model);
}

int main(void)
{
	/* KVD_TEST_LIST_SHAPES=1: print "index name" of each conformance shape
	 * (test_conformance_<index>) and exit, so scripts pick shapes by name */
	if (getenv("KVD_TEST_LIST_SHAPES")) {
		for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
			printf("%zu %s\n", i, shapes[i].name);
		return 0;
	}
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_plugin_abi),
		cmocka_unit_test(test_plugin_exports),
		cmocka_unit_test(test_init_without_gpu),
		cmocka_unit_test(test_query_types_and_features),
		cmocka_unit_test(test_reference_vs_cpu),
		cmocka_unit_test(test_page_ops),
		cmocka_unit_test(test_forward_validation),
		cmocka_unit_test(test_conformance_0),
		cmocka_unit_test(test_conformance_1),
		cmocka_unit_test(test_conformance_2),
		cmocka_unit_test(test_conformance_3),
		cmocka_unit_test(test_conformance_4),
		cmocka_unit_test(test_conformance_5),
		cmocka_unit_test(test_conformance_6),
		cmocka_unit_test(test_conformance_7),
		cmocka_unit_test(test_conformance_8),
		cmocka_unit_test(test_conformance_9),
		cmocka_unit_test(test_conformance_10),
		cmocka_unit_test(test_conformance_11),
		cmocka_unit_test(test_conformance_12),
		cmocka_unit_test(test_conformance_13),
		cmocka_unit_test(test_conformance_14),
		cmocka_unit_test(test_conformance_15),
		cmocka_unit_test(test_conformance_16),
		cmocka_unit_test(test_conformance_17),
		cmocka_unit_test(test_conformance_18),
		cmocka_unit_test(test_conformance_19),
		cmocka_unit_test(test_conformance_20),
		cmocka_unit_test(test_kvtype_f32),
		cmocka_unit_test(test_kvtype_bf16),
		cmocka_unit_test(test_kvtype_q8_0),
		cmocka_unit_test(test_kvtype_q4_0),
		cmocka_unit_test(test_kv_shift),
		cmocka_unit_test(test_released_pages),
		cmocka_unit_test(test_default_model_greedy),
	};
	/* KVD_TEST_FILTER=pattern (cmocka wildcards) runs a subset */
	const char *filter = getenv("KVD_TEST_FILTER");
	if (filter && *filter)
		cmocka_set_test_filter(filter);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
