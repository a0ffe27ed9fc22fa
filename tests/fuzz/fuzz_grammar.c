/*
 * tests/fuzz/fuzz_grammar.c — libFuzzer target for the constraint engine:
 * the GBNF parser, the JSON Schema, regex and choice translators
 * (daemon/model/grammar*.c, jsonschema.c), and the matcher on whatever
 * compiles.
 *
 * Input: one byte choosing the kind (GBNF, JSON Schema, json_object, regex,
 * choices), the constraint text up to the first NUL, then one byte per
 * generation step choosing among the allowed tokens of a small synthetic
 * vocabulary (every single byte, some multi-byte pieces, an END token).
 *
 * Promises checked: compilation ends with 0 or one of -EINVAL, -ENOTSUP,
 * -E2BIG, -ENOMEM, and a failure comes with a NUL-terminated, non-empty
 * message; at every step the mask's count equals its bits, every token's
 * bit equals kvd_gram_check, END is set exactly when the state is
 * complete, and accepting an allowed token succeeds (a copied state and a
 * saved-and-loaded one give the same mask).
 */
#include <errno.h>

#include "grammar.h"
#include "fuzz_util.h"

#define MAX_STEPS 48

static struct kvd_gram_vocab *vocab;
static int32_t n_tok;
static int32_t end_tok;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	static const char *pieces[] = {"{\"", "\":", "\",", "\"}", "true", "null", "false", "é", "日本", "\xe6",
				       "\x97\xa5", "ab", "12", "-0.5e3", "  ", "\n  ", "[\"", "\"]", "\\u00", "xyz"};
	const size_t np = sizeof(pieces) / sizeof(pieces[0]);
	static uint8_t single[256];
	const uint8_t *bytes[256 + 32];
	uint32_t lens[256 + 32];
	uint8_t kinds[256 + 32] = {0};
	for (int i = 0; i < 256; i++) {
		single[i] = (uint8_t)i;
		bytes[i] = &single[i];
		lens[i] = 1;
	}
	for (size_t i = 0; i < np; i++) {
		bytes[256 + i] = (const uint8_t *)pieces[i];
		lens[256 + i] = (uint32_t)strlen(pieces[i]);
	}
	n_tok = (int32_t)(256 + np + 2);
	end_tok = n_tok - 2;
	bytes[end_tok] = NULL;
	lens[end_tok] = 0;
	kinds[end_tok] = KVD_GRAM_TOKEN_END;
	bytes[n_tok - 1] = (const uint8_t *)"<ctl>";
	lens[n_tok - 1] = 5;
	kinds[n_tok - 1] = KVD_GRAM_TOKEN_NEVER;
	if (kvd_gram_vocab_new(n_tok, bytes, lens, kinds, &vocab)) {
		fprintf(stderr, "fuzz_grammar: vocabulary\n");
		exit(1);
	}
	return 0;
}

static int bit(const uint32_t *m, int32_t t)
{
	return (m[t >> 5] >> (t & 31)) & 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const enum kvd_grammar_kind kinds[] = {KVD_GRAMMAR_GBNF, KVD_GRAMMAR_JSON_SCHEMA, KVD_GRAMMAR_JSON_OBJECT,
						      KVD_GRAMMAR_REGEX, KVD_GRAMMAR_CHOICE};
	if (size < 1)
		return 0;
	enum kvd_grammar_kind kind = kinds[data[0] % 5];
	const char *text = (const char *)data + 1;
	size_t len = 0;
	while (1 + len < size && data[1 + len])
		len++;
	const uint8_t *steps = data + 1 + len + (1 + len < size);
	size_t n_steps = size - (size_t)(steps - data);
	struct kvd_grammar *g = NULL;
	struct kvd_grammar_error err;
	memset(&err, 0x55, sizeof(err));
	int rc = kvd_grammar_compile(kind, text, len, &g, &err);
	if (rc) {
		CHECK(rc == -EINVAL || rc == -ENOTSUP || rc == -E2BIG || rc == -ENOMEM);
		CHECK(memchr(err.msg, 0, sizeof(err.msg)) != NULL && (err.msg[0] || rc == -ENOMEM));
		CHECK(g == NULL);
		return 0;
	}
	struct kvd_gram_scratch *s = kvd_gram_scratch_new();
	struct kvd_gram_state st = {0}, cp = {0}, ld = {0};
	uint32_t mask[16], mask2[16];
	CHECK(kvd_gram_vocab_mask_words(vocab) <= 16);
	CHECK(kvd_gram_state_init(g, s, &st) == 0);
	for (size_t i = 0; i <= n_steps && i < MAX_STEPS; i++) {
		int n = kvd_gram_allowed_mask(g, vocab, s, &st, mask);
		CHECK(n >= 0);
		int count = 0;
		int32_t allowed[512];
		for (int32_t t = 0; t < n_tok; t++) {
			int b = bit(mask, t);
			count += b;
			CHECK(b == kvd_gram_check(g, vocab, s, &st, t));
			if (b)
				allowed[count - 1] = t;
		}
		CHECK(count == n);
		CHECK(bit(mask, end_tok) == kvd_gram_is_complete(&st));
		CHECK(!bit(mask, n_tok - 1));
		CHECK(kvd_gram_state_copy(&cp, &st) == 0);
		CHECK(kvd_gram_state_load(g, st.words, st.n_words, &ld) == 0);
		CHECK(kvd_gram_allowed_mask(g, vocab, s, &ld, mask2) == n);
		CHECK(memcmp(mask, mask2, kvd_gram_vocab_mask_words(vocab) * sizeof(uint32_t)) == 0);
		if (i == n_steps || n == 0)
			break;
		int32_t t = allowed[steps[i] % (uint32_t)n];
		CHECK(kvd_gram_accept_token(g, vocab, s, &st, t) == 0);
		if (t == end_tok)
			break;
	}
	kvd_gram_state_fini(&st);
	kvd_gram_state_fini(&cp);
	kvd_gram_state_fini(&ld);
	kvd_gram_scratch_free(s);
	kvd_grammar_unref(g);
	return 0;
}
