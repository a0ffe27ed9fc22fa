/*
 * tests/fuzz/fuzz_tokenizer.c — libFuzzer target for the tokenizer
 * (daemon/model/tokenizer*.c, unicode.c) with a real vocabulary: the
 * default model's (models/SmolLM2-135M-Instruct.Q4_1.gguf, byte-level BPE
 * with the smollm pre-tokenizer), or $KVD_FUZZ_VOCAB, or the seed model
 * when neither is there. Any client can send any bytes to be tokenized.
 *
 * Input: one flags byte (bit 0: add BOS, bit 1: parse special tokens),
 * then the text.
 *
 * Promises checked: the count is the same whatever the output buffer's
 * size; every id is inside the vocabulary; the streaming decoder's output
 * is valid UTF-8 whatever the ids; and, for a byte-level vocabulary,
 * decoding gives the input back — the token bytes always (invalid UTF-8
 * included), the streaming decoder's text when the input is valid UTF-8 —
 * provided every input byte has a token (the few that do not are learnt
 * at start-up by tokenizing each byte alone).
 */
#include <errno.h>

#include "gguf.h"
#include "tokenizer.h"
#include "fuzz_util.h"

#define MAX_TEXT 4096

static struct gguf_file *vocab_file;
static struct kvd_tokenizer *tok;
static int32_t n_vocab;
static bool byte_level;
static bool representable[256];

/* RFC 3629 UTF-8: no overlongs, surrogates or values past U+10FFFF. */
static bool utf8_valid(const uint8_t *s, size_t n)
{
	size_t i = 0;
	while (i < n) {
		uint8_t c = s[i];
		size_t k;
		uint32_t cp, min;
		if (c < 0x80) {
			i++;
			continue;
		} else if ((c & 0xe0) == 0xc0) {
			k = 1; cp = c & 0x1f; min = 0x80;
		} else if ((c & 0xf0) == 0xe0) {
			k = 2; cp = c & 0x0f; min = 0x800;
		} else if ((c & 0xf8) == 0xf0) {
			k = 3; cp = c & 0x07; min = 0x10000;
		} else {
			return false;
		}
		if (n - i <= k)
			return false;
		for (size_t j = 1; j <= k; j++) {
			if ((s[i + j] & 0xc0) != 0x80)
				return false;
			cp = (cp << 6) | (s[i + j] & 0x3f);
		}
		if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
			return false;
		i += k + 1;
	}
	return true;
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	char buf[4096], err[512];
	const char *env = getenv("KVD_FUZZ_VOCAB");
	const char *cands[3] = {
		env && *env ? env : NULL,
		fuzz_data_path("models/SmolLM2-135M-Instruct.Q4_1.gguf", buf, sizeof(buf)),
		NULL,
	};
	char buf2[4096];
	cands[2] = fuzz_data_path("tests/fuzz/corpus/fuzz_model/seed-model.gguf", buf2, sizeof(buf2));
	for (int i = 0; i < 3 && !vocab_file; i++)
		if (cands[i] && gguf_open(cands[i], &vocab_file, err, sizeof(err)) == 0)
			fprintf(stderr, "fuzz_tokenizer: vocabulary of %s\n", cands[i]);
	if (!vocab_file || kvd_tokenizer_from_gguf(vocab_file, &tok, err, sizeof(err)) < 0) {
		fprintf(stderr, "fuzz_tokenizer: no vocabulary: %s\n", err);
		exit(1);
	}
	n_vocab = kvd_tokenizer_n_vocab(tok);
	const char *model;
	size_t ml;
	byte_level = gguf_get_str(vocab_file, "tokenizer.ggml.model", &model, &ml) == 0 && ml == 4 &&
		     memcmp(model, "gpt2", 4) == 0;
	int n_repr = 0;
	for (int b = 0; b < 256; b++) {
		char c = (char)b, out[64];
		int32_t ids[8];
		int n = kvd_tokenize(tok, &c, 1, 0, 0, ids, 8);
		representable[b] = n == 1 && kvd_token_to_bytes(tok, ids[0], 0, out, sizeof(out)) == 1 && out[0] == c;
		n_repr += representable[b];
	}
	fprintf(stderr, "fuzz_tokenizer: %d tokens, %s, %d of 256 bytes have a token\n", n_vocab,
		byte_level ? "byte-level BPE (round trip checked)" : "not byte-level (round trip not checked)", n_repr);
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1 || size - 1 > MAX_TEXT)
		return 0;
	int add_bos = data[0] & 1, special = (data[0] >> 1) & 1;
	const char *text = (const char *)data + 1;
	size_t len = size - 1;
	static int32_t ids[MAX_TEXT + 8];
	int32_t few[4];

	int n = kvd_tokenize(tok, text, len, add_bos, special, few, 4);
	if (n == -ENOMEM)
		return 0;
	CHECK(n >= 0 && (size_t)n <= len + 1);
	int n2 = kvd_tokenize(tok, text, len, add_bos, special, ids, MAX_TEXT + 8);
	CHECK(n2 == n);
	for (int i = 0; i < n; i++)
		CHECK(ids[i] >= 0 && ids[i] < n_vocab);
	if (n >= 1 && n <= 4)
		CHECK(memcmp(few, ids, (size_t)n * 4) == 0);

	/* the streaming decoder: valid UTF-8 out, whatever came in */
	static char out[(MAX_TEXT + 8) * 3 * 170];
	size_t o = 0;
	struct kvd_detok d;
	kvd_detok_init(&d);
	for (int i = 0; i < n; i++) {
		int k = kvd_detok_push(tok, &d, ids[i], out + o, KVD_DETOK_MIN_CAP);
		CHECK(k >= 0 && k <= KVD_DETOK_MIN_CAP);
		o += (size_t)k;
	}
	int k = kvd_detok_flush(&d, out + o, 3);
	CHECK(k == 0 || k == 3);
	o += (size_t)k;
	CHECK(utf8_valid((const uint8_t *)out, o));

	if (!byte_level || add_bos)
		return 0;
	for (size_t i = 0; i < len; i++)
		if (!representable[(uint8_t)text[i]])
			return 0;
	/* the token bytes give the input back */
	static char raw[(MAX_TEXT + 8) * 4200];
	size_t r = 0;
	for (int i = 0; i < n; i++) {
		int b = kvd_token_to_bytes(tok, ids[i], special, raw + r, sizeof(raw) - r);
		CHECK(b >= 0 && (size_t)b <= sizeof(raw) - r);
		r += (size_t)b;
	}
	CHECK(r == len && memcmp(raw, text, len) == 0);
	if (!special && utf8_valid(data + 1, len))
		CHECK(o == len && memcmp(out, text, len) == 0);
	return 0;
}
