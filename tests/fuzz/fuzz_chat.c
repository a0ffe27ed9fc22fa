/*
 * tests/fuzz/fuzz_chat.c — libFuzzer target for chat-template handling
 * (daemon/model/tokenizer_load.c, tokenizer_chat.c): recognising the
 * template a GGUF file carries (tokenizer.chat_template, including the
 * default system message read out of a ChatML template's string literal)
 * and rendering a conversation with it, as a GENERATE without IPC_GEN_RAW
 * does with the client's text.
 *
 * Input: the template, a NUL, then messages: a role byte (low three bits:
 * 0 system, 1 user, 2 assistant, 3 tools, 4 tool_calls, 5 tool, 6 and 7 an
 * invalid role; bit 7 of the last one: add the assistant prompt) and the
 * content up to the next NUL. The
 * template is spliced into a tokenizer-only GGUF made at start-up from the
 * seed model (tests/fuzz/corpus/fuzz_model/seed-model.gguf, whose last key
 * is the template; its tensors are dropped), so the real gguf_open() and
 * kvd_tokenizer_from_gguf() run on it.
 *
 * Promises checked: the tokenizer builds for any template; rendering gives
 * -EINVAL exactly when a role is invalid or kvd_chat_check() refuses the
 * messages (a malformed tool turn), else a length or -ENOTSUP; the
 * size query (cap 0) and the real render agree; the output is
 * NUL-terminated at that length, and a smaller buffer gets the same prefix
 * (snprintf semantics); the rendered prompt tokenizes (special tokens
 * parsed) into ids inside the vocabulary.
 */
#include <errno.h>

#include "gguf.h"
#include "tokenizer.h"
#include "fuzz_util.h"

#define MAX_MSGS 16

static uint8_t *prefix;
static size_t prefix_len;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	char path[4096], err[512];
	struct gguf_file *f = NULL;
	size_t n;
	const char *tp;
	size_t tn;

	fuzz_data_path("tests/fuzz/corpus/fuzz_model/seed-model.gguf", path, sizeof(path));
	uint8_t *file = fuzz_read_file(path, &n);
	if (!file || gguf_open(path, &f, err, sizeof(err)) < 0 ||
	    gguf_get_str(f, "tokenizer.chat_template", &tp, &tn) < 0 ||
	    gguf_key_name(f, gguf_n_kv(f) - 1) == NULL ||
	    strcmp(gguf_key_name(f, gguf_n_kv(f) - 1), "tokenizer.chat_template") != 0) {
		fprintf(stderr, "fuzz_chat: %s: cannot use as the vocabulary (run from the repository root)\n", path);
		exit(1);
	}
	/* everything before the template's u64 length, with no tensors */
	prefix_len = (size_t)((const uint8_t *)tp - (const uint8_t *)gguf_map_base(f)) - 8;
	prefix = malloc(prefix_len);
	memcpy(prefix, file, prefix_len);
	memset(prefix + 8, 0, 8); /* tensor count (GGUF v2/v3 header) */
	gguf_close(f);
	free(file);
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const uint8_t *nul = memchr(data, 0, size);
	size_t tlen = nul ? (size_t)(nul - data) : size;
	char path[64], err[512];
	static const char *const roles[8] = { "system", "user", "assistant", "tools", "tool_calls", "tool", "ipython",
					      "" };

	/* the file */
	size_t flen = prefix_len + 8 + tlen;
	uint8_t *file = malloc(flen);
	if (!file)
		return 0;
	memcpy(file, prefix, prefix_len);
	uint64_t l64 = tlen;
	memcpy(file + prefix_len, &l64, 8);
	memcpy(file + prefix_len + 8, data, tlen);
	int fd = fuzz_memfd(file, flen, path, sizeof(path));
	free(file);
	if (fd < 0)
		return 0;
	struct gguf_file *f = NULL;
	struct kvd_tokenizer *t = NULL;
	int r = gguf_open(path, &f, err, sizeof(err));
	CHECK(r == 0 || r == -ENOMEM);
	if (r < 0)
		goto out;
	r = kvd_tokenizer_from_gguf(f, &t, err, sizeof(err));
	CHECK(r == 0 || r == -ENOMEM);
	if (r < 0)
		goto out;

	/* the messages: contents are copied so each is NUL-terminated */
	struct kvd_chat_msg msgs[MAX_MSGS];
	char *contents[MAX_MSGS];
	size_t n_msgs = 0;
	bool bad_role = false;
	int add_assistant = 0;
	const uint8_t *p = nul ? nul + 1 : data + size, *end = data + size;
	while (p < end && n_msgs < MAX_MSGS) {
		unsigned role = *p++;
		const uint8_t *q = memchr(p, 0, (size_t)(end - p));
		size_t len = q ? (size_t)(q - p) : (size_t)(end - p);
		contents[n_msgs] = malloc(len + 1);
		memcpy(contents[n_msgs], p, len);
		contents[n_msgs][len] = 0;
		msgs[n_msgs] = (struct kvd_chat_msg){ roles[role & 7], contents[n_msgs] };
		bad_role |= (role & 7) >= 6;
		add_assistant = role >> 7;
		n_msgs++;
		p += len + (q != NULL);
	}

	int need = kvd_chat_render(t, msgs, n_msgs, add_assistant, NULL, 0);
	int checked = kvd_chat_check(msgs, n_msgs, err, sizeof(err));
	CHECK(!bad_role || checked == -EINVAL);
	if (checked < 0) {
		CHECK(need == -EINVAL);
	} else {
		CHECK(need >= 0 || need == -ENOTSUP || need == -ENOMEM);
	}
	if (need >= 0) {
		char *out = malloc((size_t)need + 1);
		int got = kvd_chat_render(t, msgs, n_msgs, add_assistant, out, (size_t)need + 1);
		CHECK(got == need && out[need] == 0);
		if (need > 0) { /* a buffer one short gets the same text, cut */
			char *cut = malloc((size_t)need);
			int got2 = kvd_chat_render(t, msgs, n_msgs, add_assistant, cut, (size_t)need);
			CHECK(got2 == need && cut[need - 1] == 0 && memcmp(cut, out, (size_t)need - 1) == 0);
			free(cut);
		}
		int32_t ids[64];
		int n = kvd_tokenize(t, out, (size_t)need, kvd_tokenizer_add_bos(t), 1, ids, 64);
		CHECK(n >= 0 || n == -ENOMEM);
		for (int i = 0; i < n && i < 64; i++)
			CHECK(ids[i] >= 0 && ids[i] < kvd_tokenizer_n_vocab(t));
		free(out);
	}
	for (size_t i = 0; i < n_msgs; i++)
		free(contents[i]);
out:
	kvd_tokenizer_free(t);
	gguf_close(f);
	close(fd);
	return 0;
}
