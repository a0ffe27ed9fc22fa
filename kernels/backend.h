/*
 * kernels/backend.h — the one interface between kvd's engine and a compute
 * backend (the CPU backend in kernels/cpu, the CUDA plug-in in kernels/cuda).
 *
 * A backend is a const table of function pointers plus an opaque context,
 * in the manner of ggml's backends and SQLite's VFS: the engine never knows
 * which device computes. Backends see the KV cache only as a *paged view*:
 * a pool base pointer, a page layout, and for every sequence of a batch an
 * int array mapping its logical pages to physical pages. They never include
 * kvmm, and kvmm never includes them.
 *
 * Errors are negative errno values. Contexts are not thread safe: one engine
 * thread drives a backend; a backend may use its own worker threads inside.
 */
#ifndef KVD_BACKEND_H
#define KVD_BACKEND_H

#include <stddef.h>
#include <stdint.h>

/*
 * The table's version (struct kvd_backend_ops.version), as SQLite's VFS has
 * iVersion: a table of version v has exactly the slots the versions up to v
 * define, and the engine reads a slot only when the table's version says it
 * is there (kvd_backend_ops_check() takes versions KVD_BACKEND_ABI_MIN ..
 * KVD_BACKEND_ABI_VERSION). A backend built against an older header keeps
 * working; a newer one fills the new slots and says so with its version.
 *
 *   3  name .. caps: the required slots, the swap slots and the device pool
 *   4  kv_shift and supports (the capability query), which answers for
 *      model features instead of the `features` word
 */
#define KVD_BACKEND_ABI_VERSION 4
#define KVD_BACKEND_ABI_MIN     3

/* Weight storage types; the numeric values are ggml's, as stored in GGUF. */
enum kvd_wtype {
	KVD_WTYPE_F32 = 0,
	KVD_WTYPE_F16 = 1,
	KVD_WTYPE_Q4_0 = 2,
	KVD_WTYPE_Q4_1 = 3,
	KVD_WTYPE_Q5_0 = 6,
	KVD_WTYPE_Q5_1 = 7,
	KVD_WTYPE_Q8_0 = 8,
	KVD_WTYPE_Q4_K = 12,
	KVD_WTYPE_Q5_K = 13,
	KVD_WTYPE_Q6_K = 14,
	KVD_WTYPE_BF16 = 30,
};

/* A 2-D weight matrix as stored: `rows` rows of `cols` elements each, rows
 * contiguous, row r at data + r * row_bytes. Quantized rows hold cols/32
 * blocks. `data` points into the model mapping and is not owned. */
struct kvd_tensor {
	const void *data;
	enum kvd_wtype type;
	int64_t cols;
	int64_t rows;
	size_t row_bytes;
};

enum kvd_rope_style {
	KVD_ROPE_NORM = 0, /* rotate pairs (2i, 2i+1): Llama GGUF layout */
	KVD_ROPE_NEOX = 1, /* rotate pairs (i, i + d/2) */
};

/* Feed-forward activation of a gated FFN: down(act(gate(x)) * up(x)). */
enum kvd_act {
	KVD_ACT_SILU = 0,      /* SwiGLU: silu(g) = g / (1 + exp(-g)) */
	KVD_ACT_GELU_TANH = 1, /* GeGLU: 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))) */
};

/*
 * What a model needs beyond the Llama base structure. The base is: pre-norm
 * RMSNorm before attention and before the FFN, no biases, no Q/K norms,
 * SwiGLU, full causal attention, one RoPE base for every layer with no
 * scaling (either pairing style), no embedding scale and attention scores
 * scaled by 1/sqrt(head_dim). Each bit below names one departure; the model
 * layer sets a bit in kvd_model_weights.features when any layer uses it.
 */
#define KVD_FEAT_QKV_BIAS     (1u << 0) /* bq, bk, bv added after the projections */
#define KVD_FEAT_QK_NORM      (1u << 1) /* per-head RMSNorm of Q and K (before RoPE) */
#define KVD_FEAT_POST_NORM    (1u << 2) /* RMSNorm of the attention / FFN output before the residual add */
#define KVD_FEAT_GELU         (1u << 3) /* some layer uses KVD_ACT_GELU_TANH */
#define KVD_FEAT_WINDOW       (1u << 4) /* some layer attends over a sliding window */
#define KVD_FEAT_LAYER_ROPE   (1u << 5) /* RoPE base differs between layers */
#define KVD_FEAT_ROPE_FREQS   (1u << 6) /* per-dimension frequency divisors (rope_freqs) */
#define KVD_FEAT_ROPE_LINEAR  (1u << 7) /* positions scaled by rope_freq_scale != 1 */
#define KVD_FEAT_EMBD_SCALE   (1u << 8) /* embeddings multiplied by embd_scale != 1 */
#define KVD_FEAT_ATTN_SCALE   (1u << 9) /* scores scaled by attn_scale != 1/sqrt(head_dim) */
#define KVD_FEAT_ALL          ((1u << 10) - 1)

/* Name of the lowest feature bit set in `missing` ("q/k/v biases"), for
 * messages; "none" for 0. */
static inline const char *kvd_feature_name(uint32_t missing)
{
	static const char *const names[] = {
		"q/k/v biases", "per-head q/k norms", "post-attention/post-ffn norms", "GeGLU (tanh GELU)",
		"sliding-window attention", "per-layer rope base", "rope frequency factors (rope_freqs)",
		"linear rope scaling", "embedding scale", "attention scale other than 1/sqrt(head size)",
	};
	for (unsigned i = 0; i < sizeof(names) / sizeof(names[0]); i++)
		if (missing & (1u << i))
			return names[i];
	return missing ? "unknown feature" : "none";
}

/* Hyper-parameters of a model (values shared by every layer). */
struct kvd_hparams {
	int32_t n_vocab;
	int32_t n_embd;
	int32_t n_layer;
	int32_t n_head;
	int32_t n_head_kv;
	int32_t head_dim;   /* n_embd / n_head unless the file says otherwise */
	int32_t n_ff;
	int32_t n_ctx_train;
	float rms_eps;
	float rope_theta;   /* base of the global layers; each layer has its own in kvd_layer_desc */
	enum kvd_rope_style rope_style;
	/* 0 in the two below means the Llama value (1 and 1/sqrt(head_dim)) */
	float embd_scale;   /* token embeddings are multiplied by this (Gemma: sqrt(n_embd)) */
	float attn_scale;   /* Q.K scores are multiplied by this */
};

/*
 * One layer's structure. With h the residual stream and norm(x, w) the
 * RMSNorm x / sqrt(mean(x^2) + rms_eps) * w:
 *
 *   a = norm(h, attn_norm)
 *   q = wq a (+ bq), k = wk a (+ bk), v = wv a (+ bv)
 *   q, k per head: norm(., q_norm / k_norm) when present (weights of head_dim)
 *   q, k: RoPE at position p with frequencies
 *         theta_i = rope_freq_scale * p * rope_theta^(-2i/head_dim) / freq_factor_i
 *         (freq_factor_i from kvd_model_weights.rope_freqs, else 1)
 *   o = wo softmax(attn_scale * q.k over keys j with p - window < j <= p,
 *                  or 0 <= j <= p when window == 0) v
 *   h += post_attn_norm ? norm(o, post_attn_norm) : o
 *   f = norm(h, ffn_norm)
 *   g = w_down (act(w_gate f) * (w_up f))
 *   h += post_ffn_norm ? norm(g, post_ffn_norm) : g
 *
 * After the last layer: logits = output norm(h, output_norm); before the
 * first: h = embd_scale * tok_embd[token].
 *
 * No backend turns this into a layer loop of its own: kernels/program.h
 * builds it, once, into the forward program (a list of typed operations)
 * that every backend executes, fusing adjacent operations where it likes.
 */
struct kvd_layer_desc {
	enum kvd_act act;
	int32_t window;        /* 0: full causal attention; else the last `window` positions */
	float rope_theta;      /* 0: hp.rope_theta */
	float rope_freq_scale; /* 0 or 1: none; linear scaling multiplies positions by it */
};

struct kvd_layer_weights {
	struct kvd_layer_desc d;
	struct kvd_tensor attn_norm; /* F32 vector of n_embd (rows = 1) */
	struct kvd_tensor wq, wk, wv, wo;
	struct kvd_tensor bq, bk, bv;             /* optional (data NULL): F32 vectors of q/kv dim */
	struct kvd_tensor q_norm, k_norm;         /* optional: F32 vectors of head_dim */
	struct kvd_tensor post_attn_norm;         /* optional: F32 vector of n_embd */
	struct kvd_tensor ffn_norm;
	struct kvd_tensor w_gate, w_up, w_down;
	struct kvd_tensor post_ffn_norm;          /* optional: F32 vector of n_embd */
};

/*
 * The model as every backend receives it: hyper-parameters, one
 * description per layer, and the weights bound in place.
 *
 * Contract (ABI 2): `features` is the union over layers of the KVD_FEAT_*
 * departures from the Llama base. A backend implements some set of them;
 * the engine asks it about each bit (KVD_CAPQ_MODEL_FEATURE) before load, to
 * name a missing one and let `backend = auto` fall back, and load refuses,
 * with -ENOTSUP, any model whose features it does not implement
 * (kvd_model_weights_check_features() below does the refusing). A backend that implements a feature computes it as the
 * formula in kvd_layer_desc states; a backend that ignored a bit would
 * compute a different model silently.
 */
struct kvd_model_weights {
	struct kvd_hparams hp;
	uint32_t features;             /* KVD_FEAT_* bits; 0 for a Llama-base model, whose
	                                  * kvd_layer_desc and scale fields may all be 0 */
	struct kvd_tensor tok_embd;    /* n_vocab rows of n_embd */
	struct kvd_tensor output_norm; /* F32 vector */
	struct kvd_tensor output;      /* n_vocab rows; equals tok_embd when tied */
	struct kvd_tensor rope_freqs;  /* optional: F32 vector of head_dim / 2 divisors */
	struct kvd_layer_weights *layers; /* n_layer entries */
};

/*
 * KV element types (ABI 3). A token's K (or V) row of one layer holds kv_dim
 * = n_head_kv * head_dim elements, stored as:
 *
 *   KVD_KV_F16   kv_dim IEEE half floats (2 bytes each), the default;
 *   KVD_KV_F32   kv_dim floats (4 bytes each), the reference;
 *   KVD_KV_Q8_0  kv_dim / 32 blocks of 34 bytes, block b covering elements
 *                32b .. 32b+31: an f16 scale d, then 32 int8 quants q[i];
 *                element = d * q[i]. Quantized as GGML's q8_0: d = max|x| /
 *                127, q = round(x / d) (half away from zero).
 *   KVD_KV_BF16  kv_dim bfloat16 values (2 bytes each: the upper half of an
 *                IEEE float, rounded to nearest even): the f16 cache's size
 *                with a float's range and 8 significant bits. A backend may
 *                compute attention on it with bfloat16 products (the CPU's
 *                AVX-512 BF16 path rounds the queries and the attention
 *                weights to bfloat16 too, and sums the products in floats);
 *   KVD_KV_Q4_0  kv_dim / 32 blocks of 18 bytes: an f16 scale d, then 16
 *                bytes whose low nibble j holds element j and high nibble
 *                element j + 16 (j < 16), as unsigned n in 0..15;
 *                element = d * (n - 8). Quantized as GGML's q4_0: with m the
 *                element of largest magnitude (its sign kept), d = m / -8,
 *                n = min(15, trunc(x / d + 8.5)).
 *
 * Blocks run along the row from element 0, so with head_dim a multiple of
 * 32 (required for the quantized types) head g's elements are its own
 * blocks, head_dim / 32 of them starting at byte g * kvd_kv_row_bytes(type,
 * head_dim) of the row. Scales are little-endian f16 and may be unaligned.
 * The numeric values of the enum are fixed (configuration, fingerprints).
 */
/*
 * The one list of the KV element types below the wire: X(enumerator, value,
 * name, block_elems, block_bytes), block_elems elements stored in
 * block_bytes bytes. The enum, kvd_kv_row_bytes(), kvd_kv_type_name() and
 * kvd_kv_type_parse() are generated from it, and so are daemon/config.c's
 * [kv] cache_type choices and their error message; the rows are in that
 * key's order, the last one given to XLAST (for "..., q4_0 or f32"). The
 * wire's list (ipc/ipc.h IPC_KV_TYPES, value + 1) is checked against this
 * one by tests/unit/test_kvtypes.c.
 */
#define KVD_KV_TYPES_(X, XLAST) \
	X(KVD_KV_F16, 0, "f16", 1, 2) \
	X(KVD_KV_BF16, 4, "bf16", 1, 2) \
	X(KVD_KV_Q8_0, 2, "q8_0", 32, 34) \
	X(KVD_KV_Q4_0, 3, "q4_0", 32, 18) \
	XLAST(KVD_KV_F32, 1, "f32", 1, 4)
#define KVD_KV_TYPES(X) KVD_KV_TYPES_(X, X)

#define KVD_KV_ENUM_(e, v, name, be, bb) e = v,
enum kvd_kv_type { KVD_KV_TYPES(KVD_KV_ENUM_) };
#undef KVD_KV_ENUM_
#define KVD_KV_QBLOCK 32 /* elements per quantization block */

/* Bytes of `n` elements of type t (one row, or one head of a row), or 0 if
 * t is unknown or n is not a whole number of the type's blocks. */
static inline size_t kvd_kv_row_bytes(enum kvd_kv_type t, uint32_t n)
{
#define KVD_KV_ROW_(e, v, name, be, bb) \
	case e: return n % (be) ? 0 : (size_t)n / (be) * (bb);
	switch (t) { KVD_KV_TYPES(KVD_KV_ROW_) }
#undef KVD_KV_ROW_
	return 0;
}

/* "f16", "f32", "q8_0", "q4_0", "bf16"; NULL for an unknown value. */
static inline const char *kvd_kv_type_name(enum kvd_kv_type t)
{
#define KVD_KV_NAME_(e, v, name, be, bb) \
	case e: return name;
	switch (t) { KVD_KV_TYPES(KVD_KV_NAME_) }
#undef KVD_KV_NAME_
	return NULL;
}

/* The type named `s` (as kvd_kv_type_name spells it): 0 with *ret set, or
 * -22 (-EINVAL) for another name. */
static inline int kvd_kv_type_parse(const char *s, enum kvd_kv_type *ret)
{
#define KVD_KV_ALL_(e, v, name, be, bb) e,
	static const enum kvd_kv_type all[] = { KVD_KV_TYPES(KVD_KV_ALL_) };
#undef KVD_KV_ALL_
	for (unsigned i = 0; s && i < sizeof(all) / sizeof(all[0]); i++) {
		const char *n = kvd_kv_type_name(all[i]), *a = s;
		while (*n && *n == *a)
			n++, a++;
		if (!*n && !*a) {
			*ret = all[i];
			return 0;
		}
	}
	return -22;
}

/*
 * KV page layout. A page holds `block_size` consecutive tokens of one
 * sequence for every layer, K and V, each token row stored as `type` says
 * (above):
 *
 *   page + layer * layer_stride + 0            : K[block_size][row]
 *   page + layer * layer_stride + v_offset     : V[block_size][row]
 *
 * with row = kvd_kv_row_bytes(type, kv_dim) bytes (the token stride),
 * kv_dim = n_head_kv * head_dim, and page_bytes = n_layer * layer_stride.
 * One page is one contiguous swap unit. kvd_kv_layout_init_type() fills
 * the fields from the hyper-parameters and the type; a zeroed `type` is
 * f16 (ABI 2's only layout).
 */
struct kvd_kv_layout {
	uint32_t block_size;
	uint32_t n_layer;
	uint32_t kv_dim;
	size_t token_stride; /* bytes between consecutive tokens' K rows */
	size_t v_offset;     /* bytes from a layer's K block to its V block */
	size_t layer_stride; /* bytes between layers inside a page */
	size_t page_bytes;
	enum kvd_kv_type type; /* element type of the K and V rows */
};

/* Fill l for the model's shape, block_size tokens per page and element
 * type t. 0, or -22 (-EINVAL) when t is unknown or is a quantized type and
 * head_dim is not a multiple of KVD_KV_QBLOCK (l is then untouched). */
static inline int kvd_kv_layout_init_type(struct kvd_kv_layout *l, const struct kvd_hparams *hp,
					  uint32_t block_size, enum kvd_kv_type t)
{
	uint32_t kv_dim = (uint32_t)(hp->n_head_kv * hp->head_dim);
	if (!kvd_kv_row_bytes(t, kv_dim) || !kvd_kv_row_bytes(t, (uint32_t)hp->head_dim))
		return -22;
	l->block_size = block_size;
	l->n_layer = (uint32_t)hp->n_layer;
	l->kv_dim = kv_dim;
	l->type = t;
	l->token_stride = kvd_kv_row_bytes(t, kv_dim);
	l->v_offset = l->token_stride * block_size;
	l->layer_stride = 2 * l->v_offset;
	l->page_bytes = l->layer_stride * l->n_layer;
	return 0;
}

/* The f16 layout (every model with head_dim > 0 has one; else all 0). */
static inline void kvd_kv_layout_init(struct kvd_kv_layout *l, const struct kvd_hparams *hp,
				      uint32_t block_size)
{
	*l = (struct kvd_kv_layout){0};
	(void)kvd_kv_layout_init_type(l, hp, block_size, KVD_KV_F16);
}

/*
 * Released pages (KVD_CAP_PACKED_KV; kvmm_seq_release). When every layer
 * with a window (kvd_layer_desc.window > 0, the "local" layers) is done with
 * a logical page, i.e. all its positions are older than the widest window
 * before every position still to come, the engine may release it: only the
 * layers without a window (the "global" layers, n_global of them) still read
 * it, and their share is kept in a slot of a packed page, a page of the
 * same layout whose layer region s * n_global + g holds global layer g
 * (the g-th layer without a window) of the page in slot s, for
 * kvd_kv_pack_slots() slots. A released logical page appears in
 * kvd_batch_seq.pages as kvd_page_packed(page, slot), or as
 * KVD_PAGE_RELEASED when the model has no global layer (nothing is kept).
 * A backend with the cap reads the global layers' K/V of those positions
 * from the packed page; its windowed layers never reach them.
 */
#define KVD_PAGE_RELEASED (-2)

/* Slots of a packed page: n_layer / n_global (at most 255); 0 when the
 * model has no global layer (released pages keep nothing) or no windowed
 * layer (nothing is ever released). */
static inline uint32_t kvd_kv_pack_slots(const struct kvd_model_weights *w, uint32_t *ret_n_global,
					 uint32_t *ret_max_window)
{
	uint32_t n_global = 0, max_window = 0, n = (uint32_t)w->hp.n_layer;
	for (uint32_t l = 0; l < n; l++) {
		uint32_t win = w->layers[l].d.window > 0 ? (uint32_t)w->layers[l].d.window : 0;
		n_global += win == 0;
		max_window = win > max_window ? win : max_window;
	}
	if (ret_n_global)
		*ret_n_global = n_global;
	if (ret_max_window)
		*ret_max_window = max_window;
	if (!max_window || !n_global)
		return 0;
	return n / n_global < 255 ? n / n_global : 255;
}
/* The page table entry of a released page kept in slot `slot` of packed
 * page `page` (page < KVD_PACKED_MAX_PAGES, slot < 256); decoded by the two
 * below. */
#define KVD_PACKED_MAX_PAGES (1u << 22)
static inline int32_t kvd_page_packed(uint32_t page, uint32_t slot)
{
	return -(int32_t)(3 + (slot | (page << 8)));
}
static inline int kvd_page_is_packed(int32_t e)
{
	return e <= -3;
}
static inline uint32_t kvd_packed_page(int32_t e)
{
	return (uint32_t)(-(int64_t)e - 3) >> 8;
}
static inline uint32_t kvd_packed_slot(int32_t e)
{
	return (uint32_t)(-(int64_t)e - 3) & 255u;
}

/* The pool as the backend sees it: page p starts at base + p * page_bytes. */
struct kvd_paged_view {
	void *base;
	uint32_t n_pages;
	struct kvd_kv_layout layout;
};

/*
 * One sequence's share of a batch step: `n_tokens` new tokens at positions
 * pos0 .. pos0 + n_tokens - 1. Positions < pos0 are already in the KV cache.
 * `pages` covers at least pos0 + n_tokens positions; logical page i holds
 * positions [i * block_size, (i + 1) * block_size). The backend writes the new
 * tokens' K/V into those pages and attends over positions 0 .. its own.
 *
 * logits: NULL for none; else n_vocab floats for the last new token, or, when
 * all_logits is set, n_tokens * n_vocab floats (one row per new token).
 */
struct kvd_batch_seq {
	const int32_t *tokens;
	int32_t n_tokens;
	int32_t pos0;
	const int32_t *pages;
	int32_t n_pages;
	int32_t all_logits;
	float *logits;
};

struct kvd_batch {
	int32_t n_seqs;
	const struct kvd_batch_seq *seqs;
};

/* The widest instruction set the CPU backend may use (struct
 * kvd_backend_config.cpu_isa); it uses the widest the CPU has up to it. */
enum kvd_cpu_isa {
	KVD_CPU_ISA_BEST = 0,    /* AMX tiles, AVX-512 (VNNI, BF16) where the CPU has them, else AVX2, else C */
	KVD_CPU_ISA_AVX2 = 1,    /* at most AVX2 + FMA + F16C: no AVX-512 kernel */
	KVD_CPU_ISA_GENERIC = 2, /* portable C only */
	KVD_CPU_ISA_AVX512 = 3,  /* at most AVX-512: no AMX tile kernel (the same bits) */
};
/* "best", "avx2", "generic", "avx512"; NULL for an unknown value. */
static inline const char *kvd_cpu_isa_name(enum kvd_cpu_isa i)
{
	switch (i) {
	case KVD_CPU_ISA_BEST: return "best";
	case KVD_CPU_ISA_AVX2: return "avx2";
	case KVD_CPU_ISA_GENERIC: return "generic";
	case KVD_CPU_ISA_AVX512: return "avx512";
	}
	return NULL;
}

/*
 * How a backend is started (init). Fields are only ever appended, so a
 * plug-in built against an older header reads the ones it knows.
 */
struct kvd_backend_config {
	int n_threads;       /* worker threads; <= 0 means one per online CPU */
	int device;          /* accelerator index, ignored by the CPU backend */
	enum kvd_cpu_isa cpu_isa; /* CPU backend only (0: the best the CPU has) */
};

/*
 * The capability query (ABI 4; the `supports` slot): one question, one
 * answer, in the manner of ggml-backend's supports_op. The engine asks it
 * before it loads a model and before it creates the pool, and decides every
 * refusal and every fallback (`backend = auto`) from the answers alone,
 * naming the capability that is missing (kvd_cap_describe()). A backend
 * answers 1 (implemented) or 0 (not); a kind it does not know is 0, so a
 * newer engine asking an older backend a newer question reads "no".
 *
 *   KVD_CAPQ_WEIGHT_TYPE    matrices stored as `wtype` (any matrix of the
 *                           model: token embedding, output, each layer's)
 *   KVD_CAPQ_MODEL_FEATURE  the departure `feature` (one KVD_FEAT_* bit)
 *   KVD_CAPQ_ATTENTION      attention with head size `head_dim` and `n_rep`
 *                           query heads per KV head
 *   KVD_CAPQ_KV_TYPE        a KV pool of element type `kv_type` for head size
 *                           `head_dim` (attach_kv and forward over it)
 *   KVD_CAPQ_KV_FAST        `kv_type` is this backend's fastest KV type for
 *                           head size `head_dim` at its size (cache_type =
 *                           auto takes bf16 where this says so, else f16)
 *   KVD_CAPQ_KV_SHIFT       kv_shift re-rotates keys of a `kv_type` pool (the
 *                           window context policies need it)
 *   KVD_CAPQ_RELEASED_PAGES forward takes page tables with released pages
 *                           (KVD_CAP_PACKED_KV below)
 *
 * The answers may depend on the context (the device, the instruction set
 * the config allowed) but not on a model being loaded: the engine asks
 * after init and before load. A backend whose query said yes and whose load
 * or attach_kv then refuses has a bug; the engine reports it as an error.
 */
enum kvd_cap_kind {
	KVD_CAPQ_WEIGHT_TYPE = 1,
	KVD_CAPQ_MODEL_FEATURE = 2,
	KVD_CAPQ_ATTENTION = 3,
	KVD_CAPQ_KV_TYPE = 4,
	KVD_CAPQ_KV_FAST = 5,
	KVD_CAPQ_KV_SHIFT = 6,
	KVD_CAPQ_RELEASED_PAGES = 7,
};
/* One question; the fields a kind does not name are ignored (zero them). */
struct kvd_cap_query {
	enum kvd_cap_kind kind;
	enum kvd_wtype wtype;     /* WEIGHT_TYPE */
	uint32_t feature;         /* MODEL_FEATURE: one KVD_FEAT_* bit */
	enum kvd_kv_type kv_type; /* KV_TYPE, KV_FAST, KV_SHIFT */
	int32_t head_dim;         /* ATTENTION, KV_TYPE, KV_FAST */
	int32_t n_rep;            /* ATTENTION */
};
/*
 * The capability q asks about, for messages: "weight type q4_K", "KV cache
 * type q8_0", "re-rotating cached keys (kv_shift) of a bf16 KV cache",
 * "per-head q/k norms", ... Writes at most cap bytes (NUL-terminated) and
 * returns buf. kernels/caps.c.
 */
const char *kvd_cap_describe(const struct kvd_cap_query *q, char *buf, size_t cap);

/*
 * What a backend's table promises beyond the required slots (the `caps`
 * field), so that nobody infers it from which optional slots are set.
 *
 * KVD_CAP_DEVICE_POOL: the KV pool lives in device memory. attach_kv accepts
 *     a view whose base is NULL (kvmm's device pool mode: pages reached only
 *     through page_copy, page_read and page_write), and when base is a host
 *     mapping it pins it as the host tier for page_read/page_write; the
 *     device copy is the authoritative one either way. page_read,
 *     page_write and suggest_pool_pages are set.
 * KVD_CAP_BATCHED_SWAP: pages_read and pages_write are set, and moving n
 *     pages with one of them costs one device synchronisation (a swap batch
 *     goes through them, not page by page).
 * KVD_CAP_PACKED_KV: forward takes page tables with released pages
 *     (kvd_page_packed, KVD_PAGE_RELEASED: see above) and checks them: a
 *     released entry is refused (-EINVAL) unless all its positions are
 *     older than every windowed layer's window of the step's first token,
 *     and a packed entry unless its page and slot are in range. The
 *     engine packs pages itself: in place in a host pool, through
 *     page_read and page_write in a device pool.
 */
#define KVD_CAP_DEVICE_POOL  (1u << 0)
#define KVD_CAP_BATCHED_SWAP (1u << 1)
#define KVD_CAP_PACKED_KV    (1u << 2)
#define KVD_CAP_ALL          ((1u << 3) - 1)

/*
 * The backend table. Every slot is required unless marked optional.
 *
 * init:        create a context. Returns 0 or -errno (-ENODEV: no device).
 * load:        bind the model's weights. The tensors stay valid until
 *              destroy; a device backend copies them, the CPU one reads in place.
 * attach_kv:   tell the backend where the KV pool is. Called once after load,
 *              with an element type the query said yes to (KVD_CAPQ_KV_TYPE);
 *              -ENOTSUP for another is a defensive check only.
 * forward:     run one step over a batch (prefill chunks and decodes mixed).
 *              The result for each sequence is bit-identical whatever the
 *              other sequences in the batch, the chunking of its prompt and
 *              the physical placement of its pages (CPU backend; device
 *              backends state their tolerance).
 * page_copy:   copy the first n_tokens token rows of every layer, K and V,
 *              from page src to page dst (copy-on-write).
 * page_read:   copy a whole page to host memory (swap-out); required with
 *              KVD_CAP_DEVICE_POOL, else optional (a host pool is read in
 *              place).
 * page_write:  the reverse (swap-in); as page_read.
 * destroy:     free the context; accepts NULL.
 *
 * suggest_pool_pages: with KVD_CAP_DEVICE_POOL (else NULL): after load, how
 *              many pages of page_bytes fit in `fraction` (0 < fraction <= 1)
 *              of the device memory still free (less a reserve for
 *              activations), for sizing the pool. 0 with *ret_pages set, or
 *              -errno.
 * pages_read:  with KVD_CAP_BATCHED_SWAP (else NULL): swap-out of n pages at
 *              once, page pages[i] to host_dst + i * page_bytes. Returns when
 *              the copy is complete; -EINVAL (nothing copied) for a page out
 *              of range.
 * pages_write: swap-in, the reverse: host_src + i * page_bytes to pages[i].
 * features:    the KVD_FEAT_* bits its forward implements, read only from a
 *              table without `supports` (ABI 3's way of saying it).
 * caps:        KVD_CAP_* bits above: which optional slots the table fills
 *              and how the pool lives; 0 for a backend computing on a host
 *              pool.
 *
 * From ABI 4 (a table of version >= 4 has them; the engine reads neither
 * from an older one):
 *
 * kv_shift:    optional (NULL: the query answers no to KVD_CAPQ_KV_SHIFT).
 *              Re-rotate the cached keys of the first n_tokens token slots
 *              of pages[0 .. n_pages) (page i holding tokens [i * block_size,
 *              (i + 1) * block_size); every layer and KV head; values
 *              untouched) as if each had been computed `delta` positions
 *              later: a key stored rotated at position p becomes the key
 *              rotated at p + delta, with each layer's RoPE (pairing style,
 *              base, linear scaling, rope_freqs) exactly as forward applies
 *              it. RoPE rotates each pair by an angle linear in the position,
 *              so this is one rotation by delta's angles, whatever p. Returns
 *              0, -EINVAL for a page out of range or n_tokens beyond the
 *              pages, -ENOTSUP for a KV element type the query says no to.
 * supports:    optional: the capability query above (1 yes, 0 no), asked
 *              after init, before load; cheap, no side effects. NULL: the
 *              table answers only what its other words say (see
 *              kvd_backend_supports()): a backend with any capability
 *              beyond them sets it.
 *
 * ABI 3 added `caps` and the KV element type of struct kvd_kv_layout;
 * ABI 2 had the same slots with the device pool inferred from
 * suggest_pool_pages being set, and f16 pages only. The engine refuses a
 * table of a version outside KVD_BACKEND_ABI_MIN .. KVD_BACKEND_ABI_VERSION
 * and one whose caps lack the slots they promise (kvd_backend_ops_check()),
 * and asks every question through kvd_backend_supports(), which answers
 * for an ABI 3 table from what that version could say.
 */
struct kvd_backend_ops {
	const char *name;
	int version; /* KVD_BACKEND_ABI_VERSION of the header it was built with */
	int (*init)(const struct kvd_backend_config *cfg, void **ret_ctx);
	int (*load)(void *ctx, const struct kvd_model_weights *w);
	int (*attach_kv)(void *ctx, const struct kvd_paged_view *view);
	int (*forward)(void *ctx, const struct kvd_batch *batch);
	int (*page_copy)(void *ctx, uint32_t dst, uint32_t src, uint32_t n_tokens);
	int (*page_read)(void *ctx, uint32_t page, void *host_dst);
	int (*page_write)(void *ctx, uint32_t page, const void *host_src);
	void (*destroy)(void *ctx);
	int (*suggest_pool_pages)(void *ctx, size_t page_bytes, double fraction, uint32_t *ret_pages);
	int (*pages_read)(void *ctx, const uint32_t *pages, uint32_t n, void *host_dst);
	int (*pages_write)(void *ctx, const uint32_t *pages, uint32_t n, const void *host_src);
	uint32_t features;
	uint32_t caps;
	/* ---- ABI 4 ---- */
	int (*kv_shift)(void *ctx, const int32_t *pages, uint32_t n_pages, uint32_t n_tokens, int32_t delta);
	int (*supports)(void *ctx, const struct kvd_cap_query *q);
};

/* 0 when the table's version is one this engine reads (KVD_BACKEND_ABI_MIN
 * .. KVD_BACKEND_ABI_VERSION), it has every slot its version requires and
 * every slot its caps promise, and no unknown cap bit; -22 (-EINVAL)
 * otherwise. Reads no slot beyond what the table's version defines. */
static inline int kvd_backend_ops_check(const struct kvd_backend_ops *o)
{
	if (!o || o->version < KVD_BACKEND_ABI_MIN || o->version > KVD_BACKEND_ABI_VERSION || !o->name || !o->init ||
	    !o->load || !o->attach_kv || !o->forward || !o->page_copy || !o->destroy || (o->caps & ~KVD_CAP_ALL))
		return -22;
	if ((o->caps & KVD_CAP_DEVICE_POOL) && (!o->page_read || !o->page_write || !o->suggest_pool_pages))
		return -22;
	if ((o->caps & KVD_CAP_BATCHED_SWAP) && (!o->pages_read || !o->pages_write))
		return -22;
	return 0;
}

/*
 * The one way the engine asks a started backend (ctx from its init) what
 * it implements: 1 or 0. A table with `supports` (ABI 4) answers itself;
 * for one without (every ABI 3 table), the answer is what its words say:
 * the `features` word, f16 KV only and never fast, kv_shift of f16 when the
 * slot is there (ABI 4; its contract's minimum), released pages per
 * KVD_CAP_PACKED_KV, and yes for weight types and attention shapes (its load
 * then refuses with -ENOTSUP, which the engine reports as "its weight
 * types").
 */
static inline int kvd_backend_supports(const struct kvd_backend_ops *o, void *ctx, const struct kvd_cap_query *q)
{
	if (o->version >= 4 && o->supports)
		return o->supports(ctx, q) > 0;
	switch (q->kind) {
	case KVD_CAPQ_WEIGHT_TYPE:
	case KVD_CAPQ_ATTENTION: return 1;
	case KVD_CAPQ_MODEL_FEATURE: return q->feature && !(q->feature & ~o->features);
	case KVD_CAPQ_KV_TYPE: return q->kv_type == KVD_KV_F16;
	case KVD_CAPQ_KV_FAST: return 0;
	case KVD_CAPQ_KV_SHIFT: return o->version >= 4 && o->kv_shift && q->kv_type == KVD_KV_F16;
	case KVD_CAPQ_RELEASED_PAGES: return (o->caps & KVD_CAP_PACKED_KV) != 0;
	}
	return 0;
}

/* Whether the table has a kv_shift slot (version >= 4) and sets it. */
static inline int kvd_backend_has_kv_shift(const struct kvd_backend_ops *o)
{
	return o->version >= 4 && o->kv_shift != NULL;
}

/* The CPU backend, always built. Its answers to the query: every weight
 * type, model feature and KV type; attention with at most 64 query heads
 * per KV head; kv_shift of f16 and bf16 pools; released pages; bf16 the
 * fast KV type where it computes with bfloat16 products (AVX-512 BF16
 * allowed by cpu_isa and present, head size 64, 128 or 256). */
extern const struct kvd_backend_ops kvd_cpu_backend;

/* Bytes of one row of `cols` elements of type t, or 0 if t is unsupported
 * or cols is not a multiple of the type's block. Inline so that device
 * plug-ins, which link none of kvd's archives, share it. */
static inline size_t kvd_wtype_row_bytes(enum kvd_wtype t, int64_t cols)
{
	if (cols <= 0)
		return 0;
	switch (t) {
	case KVD_WTYPE_F32: return (size_t)cols * 4;
	case KVD_WTYPE_F16:
	case KVD_WTYPE_BF16: return (size_t)cols * 2;
	case KVD_WTYPE_Q4_0: return cols % 32 ? 0 : (size_t)cols / 32 * 18;
	case KVD_WTYPE_Q4_1: return cols % 32 ? 0 : (size_t)cols / 32 * 20;
	case KVD_WTYPE_Q5_0: return cols % 32 ? 0 : (size_t)cols / 32 * 22;
	case KVD_WTYPE_Q5_1: return cols % 32 ? 0 : (size_t)cols / 32 * 24;
	case KVD_WTYPE_Q8_0: return cols % 32 ? 0 : (size_t)cols / 32 * 34;
	case KVD_WTYPE_Q4_K: return cols % 256 ? 0 : (size_t)cols / 256 * 144;
	case KVD_WTYPE_Q5_K: return cols % 256 ? 0 : (size_t)cols / 256 * 176;
	case KVD_WTYPE_Q6_K: return cols % 256 ? 0 : (size_t)cols / 256 * 210;
	}
	return 0;
}

static inline int kvd_tensor_check_(const struct kvd_tensor *t, int64_t cols, int64_t rows)
{
	if (!t->data || t->cols != cols || t->rows != rows)
		return -1;
	if (t->row_bytes == 0 || kvd_wtype_row_bytes(t->type, t->cols) != t->row_bytes)
		return -1;
	return 0;
}

/*
 * What every backend's load checks before touching weights: the model's
 * features within `implemented` (KVD_FEAT_* bits), consistent
 * hyper-parameters (query heads a multiple of KV heads, at most max_group
 * query heads per KV head, even head size), every tensor present with the
 * shape the hyper-parameters give and a row size matching its type, norm
 * vectors in f32, optional vectors (biases, Q/K and post norms, rope_freqs)
 * absent or f32 of their length. 0, -ENOTSUP (95) for a feature outside
 * `implemented`, or -EINVAL (22) (spelled out to keep this header free of
 * <errno.h>).
 */
static inline int kvd_model_weights_check_features(const struct kvd_model_weights *w, int max_group,
						   uint32_t implemented)
{
	const struct kvd_hparams *hp = &w->hp;
	int64_t qd, kvd;
	int r = 0;

	if (w->features & ~implemented)
		return -95; /* -ENOTSUP */

	if (hp->n_layer <= 0 || hp->n_embd <= 0 || hp->n_head <= 0 || hp->n_head_kv <= 0 ||
	    hp->n_head % hp->n_head_kv || hp->head_dim <= 0 || hp->head_dim % 2 || hp->n_ff <= 0 ||
	    hp->n_vocab <= 0 || hp->n_head / hp->n_head_kv > max_group || !w->layers)
		return -22;
	qd = (int64_t)hp->n_head * hp->head_dim;
	kvd = (int64_t)hp->n_head_kv * hp->head_dim;
	r |= kvd_tensor_check_(&w->tok_embd, hp->n_embd, hp->n_vocab);
	r |= kvd_tensor_check_(&w->output, hp->n_embd, hp->n_vocab);
	r |= kvd_tensor_check_(&w->output_norm, hp->n_embd, 1);
	for (int l = 0; l < hp->n_layer && !r; l++) {
		const struct kvd_layer_weights *L = &w->layers[l];
		r |= kvd_tensor_check_(&L->attn_norm, hp->n_embd, 1);
		r |= kvd_tensor_check_(&L->ffn_norm, hp->n_embd, 1);
		r |= kvd_tensor_check_(&L->wq, hp->n_embd, qd);
		r |= kvd_tensor_check_(&L->wk, hp->n_embd, kvd);
		r |= kvd_tensor_check_(&L->wv, hp->n_embd, kvd);
		r |= kvd_tensor_check_(&L->wo, qd, hp->n_embd);
		r |= kvd_tensor_check_(&L->w_gate, hp->n_embd, hp->n_ff);
		r |= kvd_tensor_check_(&L->w_up, hp->n_embd, hp->n_ff);
		r |= kvd_tensor_check_(&L->w_down, hp->n_ff, hp->n_embd);
		if (L->attn_norm.type != KVD_WTYPE_F32 || L->ffn_norm.type != KVD_WTYPE_F32)
			r = -1;
		/* optional vectors: absent, or f32 of the right length */
		const struct kvd_tensor *ov[] = {&L->bq, &L->bk, &L->bv, &L->q_norm, &L->k_norm,
						 &L->post_attn_norm, &L->post_ffn_norm};
		const int64_t olen[] = {qd, kvd, kvd, hp->head_dim, hp->head_dim, hp->n_embd, hp->n_embd};
		for (unsigned i = 0; i < sizeof(ov) / sizeof(ov[0]); i++)
			if (ov[i]->data && (kvd_tensor_check_(ov[i], olen[i], 1) || ov[i]->type != KVD_WTYPE_F32))
				r = -1;
		if (L->d.window < 0 || !(L->d.rope_theta >= 0) || !(L->d.rope_freq_scale >= 0) ||
		    (L->d.act != KVD_ACT_SILU && L->d.act != KVD_ACT_GELU_TANH))
			r = -1;
	}
	if (w->output_norm.type != KVD_WTYPE_F32)
		r = -1;
	if (w->rope_freqs.data && (kvd_tensor_check_(&w->rope_freqs, hp->head_dim / 2, 1) ||
				   w->rope_freqs.type != KVD_WTYPE_F32))
		r = -1;
	return r ? -22 : 0;
}

/* The check for a backend that implements the Llama base only (ABI 1's
 * backends): a model with any KVD_FEAT_* bit is refused (-ENOTSUP). */
static inline int kvd_model_weights_check(const struct kvd_model_weights *w, int max_group)
{
	return kvd_model_weights_check_features(w, max_group, 0);
}
/* Name of a weight type ("q4_1"), or "unknown". */
const char *kvd_wtype_name(enum kvd_wtype t);

/*
 * A pool of host threads for work beside the backend, whatever the backend
 * (the scheduler draws a batch's next tokens on one: daemon/sched_draw.c).
 * It is the CPU backend's worker pool: kvd_pool_for runs fn(arg, i, tid)
 * for every i in [0, n) on the pool's threads, the caller taking part as
 * tid 0, the others 1 .. size - 1, and returns when all have finished; an
 * idle pool sleeps. One thread drives a pool; calls are not reentrant.
 */
struct kvd_pool;
typedef void (*kvd_pool_fn)(void *arg, uint32_t i, int tid);
/* n_threads >= 1. Returns 0 or -errno. */
int kvd_pool_create(int n_threads, struct kvd_pool **ret);
/* Stops and joins the threads; accepts NULL; returns NULL. */
struct kvd_pool *kvd_pool_destroy(struct kvd_pool *p);
int kvd_pool_size(const struct kvd_pool *p);
void kvd_pool_for(struct kvd_pool *p, kvd_pool_fn fn, void *arg, uint32_t n);

#endif /* KVD_BACKEND_H */
