/*
 * tests/fuzz/fuzz_http_request.c — libFuzzer target for kvd-http's request
 * parser and response builders (client/http/request.c).
 *
 * Each input is parsed as the body of both POST /v1/chat/completions and
 * POST /v1/completions. The parser's promises are checked: a refusal comes
 * with a 4xx/5xx status, a message, and an error object that is valid
 * JSON; an accepted request has a prompt of the stated length without NUL
 * bytes, at most HTTP_MAX_STOP stop strings of 1..HTTP_MAX_STOP_BYTES
 * bytes, sampling values in their documented ranges, at most one
 * constraint of a known kind whose text has its stated length, and a
 * forced tool call constrained by a JSON Schema. The raw input is
 * also fed to the response and stream-chunk builders as if a model had
 * produced it (any bytes, valid UTF-8 or not), and their output must be
 * valid JSON. A broken promise traps.
 *
 * `make fuzz-build` builds it with the other targets when pkg-config finds
 * jansson (seeds: tests/fuzz/corpus/fuzz_http_request/). By hand (from the
 * repository root; clang with libFuzzer, and libjansson-dev):
 *
 *   clang -std=c11 -D_GNU_SOURCE -g -O1 -fsanitize=fuzzer,address,undefined \
 *       -Iclient/http -Iclient tests/fuzz/fuzz_http_request.c client/http/request.c client/http/structured.c -ljansson \
 *       -o build/fuzz_http_request
 *   mkdir -p build/fuzz-http-corpus
 *   build/fuzz_http_request -max_len=4096 -max_total_time=300 build/fuzz-http-corpus
 *
 * Without clang, -DKVD_FUZZ_STANDALONE gives a main() that replays files
 * named on the command line under gcc + ASan:
 *
 *   gcc -std=c11 -D_GNU_SOURCE -g -fsanitize=address,undefined -DKVD_FUZZ_STANDALONE \
 *       -Iclient/http -Iclient tests/fuzz/fuzz_http_request.c client/http/request.c client/http/structured.c -ljansson \
 *       -o build/fuzz_http_request_replay
 *   build/fuzz_http_request_replay crash-*
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "http.h"

#define CHECK(x) do { if (!(x)) { fprintf(stderr, "broken promise: %s (line %d)\n", #x, __LINE__); __builtin_trap(); } } while (0)

static void check_json(char *s, bool sse)
{
	CHECK(s != NULL);
	const char *j = s;
	size_t n = strlen(s);
	if (sse) {
		CHECK(n >= 8 && !strncmp(s, "data: ", 6) && !strcmp(s + n - 2, "\n\n"));
		j = s + 6;
		n -= 8;
	}
	json_error_t e;
	json_t *v = json_loadb(j, n, JSON_ALLOW_NUL, &e); /* model text may hold NUL: \u0000 */
	CHECK(v != NULL);
	json_decref(v);
	free(s);
}

static void one(int ep, const uint8_t *data, size_t size)
{
	struct http_gen_req r;
	struct http_error e;

	memset(&e, 0, sizeof(e));
	int x = http_parse_gen_request(ep, (const char *)data, size, &r, &e);
	if (x < 0) {
		CHECK(e.status >= 400 && e.status < 600);
		CHECK(e.message[0] != '\0');
		check_json(http_error_json(&e), false);
		return;
	}
	CHECK(x == 0);
	CHECK(r.endpoint == ep);
	if (r.n_messages) { /* a conversation: every turn for kvd, the last the user's */
		CHECK(ep == HTTP_EP_CHAT && r.prompt == NULL && r.system == NULL && r.n_messages <= HTTP_MAX_MESSAGES);
		for (size_t i = 0; i < r.n_messages; i++)
			CHECK(r.messages[i].role && r.messages[i].content &&
			      (!strcmp(r.messages[i].role, "system") || !strcmp(r.messages[i].role, "user") ||
			       !strcmp(r.messages[i].role, "assistant")));
		CHECK(!strcmp(r.messages[r.n_messages - 1].role, "user"));
	} else {
		CHECK(r.prompt != NULL && strlen(r.prompt) == r.prompt_len);
	}
	CHECK(ep == HTTP_EP_CHAT || r.system == NULL);
	CHECK(r.n_stop <= HTTP_MAX_STOP);
	for (size_t i = 0; i < r.n_stop; i++)
		CHECK(r.stop[i] && strlen(r.stop[i]) >= 1 && strlen(r.stop[i]) <= HTTP_MAX_STOP_BYTES);
	CHECK(!r.has_temperature || (r.temperature >= 0 && r.temperature <= 2));
	CHECK(!r.has_top_p || (r.top_p > 0 && r.top_p <= 1));
	CHECK(!r.has_min_p || (r.min_p >= 0 && r.min_p < 1));
	CHECK(!r.has_max_tokens || r.max_tokens >= 1);
	CHECK(!r.include_usage || r.stream);
	/* at most one constraint, of a known kind, its text whole and from a named field */
	if (r.constraint.kind) {
		CHECK(r.constraint.kind >= KVC_CONSTRAINT_GBNF && r.constraint.kind <= KVC_CONSTRAINT_CHOICE);
		CHECK(r.constraint_param != NULL);
		CHECK(r.constraint.text ? strlen(r.constraint.text) == r.constraint.len
					: r.constraint.kind == KVC_CONSTRAINT_JSON_OBJECT);
	}
	/* a forced tool call is a JSON Schema constraint over known tools */
	CHECK(r.tool_mode == HTTP_TOOLS_NONE || (ep == HTTP_EP_CHAT && r.tools && json_array_size(r.tools) > 0));
	CHECK(r.tool_mode < HTTP_TOOLS_REQUIRED || r.constraint.kind == KVC_CONSTRAINT_JSON_SCHEMA);
	CHECK(r.tool_mode != HTTP_TOOLS_NAMED || r.tool_name);
	http_gen_req_clear(&r);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	one(HTTP_EP_CHAT, data, size);
	one(HTTP_EP_COMPLETIONS, data, size);

	/* the input as model output: every builder must still emit valid JSON */
	struct http_usage u = { 3, 1, 2 };
	size_t n;
	check_json(http_response_json(HTTP_EP_CHAT, "chatcmpl-x", 1, "m", (const char *)data, size, "stop", &u), false);
	check_json(http_response_json(HTTP_EP_COMPLETIONS, "cmpl-x", 1, "m", (const char *)data, size, "length", &u), false);
	check_json(http_chunk_sse(HTTP_EP_CHAT, "chatcmpl-x", 1, "m", false, (const char *)data, size, NULL, NULL, true, &n), true);
	check_json(http_chunk_sse(HTTP_EP_COMPLETIONS, "cmpl-x", 1, "m", false, (const char *)data, size, NULL, NULL, false, &n),
		   true);
	return 0;
}

#ifdef KVD_FUZZ_STANDALONE
int main(int argc, char **argv)
{
	for (int i = 1; i < argc; i++) {
		FILE *f = fopen(argv[i], "rb");
		if (!f) {
			perror(argv[i]);
			return 1;
		}
		static uint8_t buf[1 << 20];
		size_t n = fread(buf, 1, sizeof(buf), f);
		fclose(f);
		LLVMFuzzerTestOneInput(buf, n);
		printf("%s: ok\n", argv[i]);
	}
	return 0;
}
#endif
