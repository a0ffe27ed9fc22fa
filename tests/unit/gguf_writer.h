/*
 * tests/unit/gguf_writer.h — a tiny GGUF writer for the unit tests that build
 * files by hand (test_gguf, test_model): little-endian scalars, strings,
 * padding, into a growing buffer. Test code only (cmocka asserts on OOM).
 */
#ifndef KVD_TEST_GGUF_WRITER_H
#define KVD_TEST_GGUF_WRITER_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

struct wbuf {
	uint8_t *p;
	size_t n, cap;
};

static inline void w_bytes(struct wbuf *b, const void *d, size_t n)
{
	if (b->n + n > b->cap) {
		size_t cap = b->cap ? b->cap : 256;
		while (cap < b->n + n)
			cap *= 2;
		b->p = realloc(b->p, cap);
		assert_non_null(b->p);
		b->cap = cap;
	}
	if (n)
		memcpy(b->p + b->n, d, n);
	b->n += n;
}

static inline void w_u8(struct wbuf *b, uint8_t v) { w_bytes(b, &v, 1); }
static inline void w_u16(struct wbuf *b, uint16_t v) { w_bytes(b, &v, 2); } /* host is little-endian */
static inline void w_u32(struct wbuf *b, uint32_t v) { w_bytes(b, &v, 4); }
static inline void w_u64(struct wbuf *b, uint64_t v) { w_bytes(b, &v, 8); }
static inline void w_f32(struct wbuf *b, float v) { w_bytes(b, &v, 4); }
static inline void w_f64(struct wbuf *b, double v) { w_bytes(b, &v, 8); }

static inline void w_strn(struct wbuf *b, const char *s, size_t n)
{
	w_u64(b, n);
	w_bytes(b, s, n);
}

static inline void w_str(struct wbuf *b, const char *s) { w_strn(b, s, strlen(s)); }

static inline void w_pad(struct wbuf *b, size_t align)
{
	while (b->n % align)
		w_u8(b, 0);
}

static inline void w_free(struct wbuf *b)
{
	free(b->p);
	*b = (struct wbuf){ 0 };
}

#endif
