/*
 * tests/unit/test_chat_tools.c — tool turns ("tools", "tool_calls", "tool")
 * rendered in each chat family's own tool format.
 *
 * The expected texts are the reference templates' renderings written out
 * by hand from the templates' text: Qwen 2.5's (ChatML: <tools>,
 * <tool_call>, <tool_response>), Llama 3.1's (tools as JSON indented by 4
 * in the first user turn, a call as {"name", "parameters"}, results in
 * ipython turns as JSON strings), Mistral-7B-Instruct-v0.3's
 * ([AVAILABLE_TOOLS], [TOOL_CALLS] with 9-character ids, [TOOL_RESULTS]),
 * and kvd's generic format (Qwen's texts) in Gemma's turns. Each family's
 * tokenizer is a small GGUF written here: its markers as control tokens,
 * the 256 GPT-2 byte tokens, its template (or none, for Gemma). Also
 * checked: the markers come out as their token ids and marker text in a
 * message stays text; a last call_open turn ends the prompt where each
 * family's call JSON begins; malformed tool turns are refused with a
 * reason.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "gguf.h"
#include "gguf_writer.h"
#include "tokenizer.h"

/* ---- a tokenizer GGUF: control tokens + the GPT-2 byte alphabet ------------- */

static void kv_key(struct wbuf *b, const char *key, uint32_t type)
{
	w_str(b, key);
	w_u32(b, type);
}

/* GPT-2's printable stand-in for byte c, as UTF-8 into out; its length. */
static size_t byte_char(int c, char out[4])
{
	int cp = c;
	if (!((c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE && c <= 0xFF))) {
		int n = 0;
		for (int b = 0; b < c; b++)
			if (!((b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF)))
				n++;
		cp = 256 + n;
	}
	if (cp < 0x80) {
		out[0] = (char)cp;
		return 1;
	}
	out[0] = (char)(0xC0 | (cp >> 6));
	out[1] = (char)(0x80 | (cp & 0x3F));
	return 2;
}

/* Writes a tokenizer with the control tokens ctl[0..n) (ctl[0] BOS, ctl[1]
 * EOS) and the byte tokens, and the template tmpl (NULL: none); opens it. */
static struct kvd_tokenizer *make_tokenizer(const char *const *ctl, size_t n, const char *tmpl)
{
	struct wbuf kv = { 0 }, out = { 0 };
	uint64_t n_kv = 0;
	char path[] = "/tmp/kvd-test-chat-tools.XXXXXX";

	kv_key(&kv, "tokenizer.ggml.model", GGUF_VT_STRING), w_str(&kv, "gpt2"), n_kv++;
	kv_key(&kv, "tokenizer.ggml.pre", GGUF_VT_STRING), w_str(&kv, "gpt-2"), n_kv++;
	kv_key(&kv, "tokenizer.ggml.tokens", GGUF_VT_ARRAY), w_u32(&kv, GGUF_VT_STRING), w_u64(&kv, n + 256), n_kv++;
	for (size_t i = 0; i < n; i++)
		w_str(&kv, ctl[i]);
	for (int c = 0; c < 256; c++) {
		char u[4];
		w_strn(&kv, u, byte_char(c, u));
	}
	kv_key(&kv, "tokenizer.ggml.token_type", GGUF_VT_ARRAY), w_u32(&kv, GGUF_VT_INT32), w_u64(&kv, n + 256), n_kv++;
	for (size_t i = 0; i < n + 256; i++)
		w_u32(&kv, i < n ? 3 : 1);
	kv_key(&kv, "tokenizer.ggml.merges", GGUF_VT_ARRAY), w_u32(&kv, GGUF_VT_STRING), w_u64(&kv, 0), n_kv++;
	kv_key(&kv, "tokenizer.ggml.bos_token_id", GGUF_VT_UINT32), w_u32(&kv, 0), n_kv++;
	kv_key(&kv, "tokenizer.ggml.eos_token_id", GGUF_VT_UINT32), w_u32(&kv, 1), n_kv++;
	if (tmpl)
		kv_key(&kv, "tokenizer.chat_template", GGUF_VT_STRING), w_str(&kv, tmpl), n_kv++;
	w_bytes(&out, "GGUF", 4);
	w_u32(&out, 3);
	w_u64(&out, 0);
	w_u64(&out, n_kv);
	w_bytes(&out, kv.p, kv.n);
	while (out.n % 32)
		w_u8(&out, 0);
	int fd = mkstemp(path);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, out.p, out.n), (ssize_t)out.n);
	close(fd);
	w_free(&kv);
	w_free(&out);

	struct gguf_file *f = NULL;
	struct kvd_tokenizer *t = NULL;
	char err[512];
	assert_int_equal(gguf_open(path, &f, err, sizeof(err)), 0);
	int r = kvd_tokenizer_from_gguf(f, &t, err, sizeof(err));
	if (r < 0)
		print_error("%s\n", err);
	assert_int_equal(r, 0);
	gguf_close(f);
	unlink(path);
	return t;
}

static const char *const chatml_ctl[] = { "<|endoftext|>", "<|im_end|>", "<|im_start|>" };
static const char *const llama3_ctl[] = { "<|begin_of_text|>", "<|eot_id|>", "<|start_header_id|>",
					   "<|end_header_id|>" };
static const char *const mistral_ctl[] = { "<s>",	   "</s>",	       "[INST]",	"[/INST]",
					    "[TOOL_CALLS]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]",
					    "[/TOOL_RESULTS]" };
static const char *const gemma_ctl[] = { "<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>" };

#define N(a) (sizeof(a) / sizeof((a)[0]))

/* ---- the conversation ---------------------------------------------------------- */

#define TOOLS                                                                                          \
	"[{\"name\": \"get_weather\", \"description\": \"Weather in a city\", \"parameters\": {\"type\": " \
	"\"object\", \"properties\": {\"city\": {\"type\": \"string\"}}, \"required\": [\"city\"]}}]"
#define CALLS "[{\"id\": \"call_abcdefghi\", \"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}]"

static const struct kvd_chat_msg conv[] = {
	{ "system", "Be brief." },
	{ "tools", TOOLS },
	{ "user", "Weather in Paris?" },
	{ "assistant", "" },
	{ "tool_calls", CALLS },
	{ "tool", "{\"temp\": 21}" },
};

/* Qwen 2.5's system text for these tools. */
#define QWEN_TOOLS                                                                                              \
	"# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with " \
	"function signatures within <tools></tools> XML tags:\n<tools>\n{\"type\": \"function\", \"function\": "  \
	"{\"name\": \"get_weather\", \"description\": \"Weather in a city\", \"parameters\": {\"type\": "         \
	"\"object\", \"properties\": {\"city\": {\"type\": \"string\"}}, \"required\": [\"city\"]}}}\n</tools>\n" \
	"\nFor each function call, return a json object with function name and arguments within "                \
	"<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "             \
	"<args-json-object>}\n</tool_call>"
#define QWEN_CALL "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"
#define QWEN_RESULT "<tool_response>\n{\"temp\": 21}\n</tool_response>"

static void expect_render(const struct kvd_tokenizer *t, const struct kvd_chat_msg *m, size_t n, const char *want)
{
	static char out[8192];
	int k = kvd_chat_render(t, m, n, 1, out, sizeof(out));
	if (k < 0 || strcmp(out, want) != 0)
		print_error("got  %s\nwant %s\n", k < 0 ? "(error)" : out, want);
	assert_int_equal(k, (int)strlen(want));
	assert_string_equal(out, want);
}

/* How often token id occurs in the conversation's tokens. */
static int count_id(const struct kvd_tokenizer *t, const struct kvd_chat_msg *m, size_t n, int32_t id)
{
	static int32_t ids[16384];
	int k = kvd_chat_tokenize(t, m, n, KVD_CHAT_ADD_ASSISTANT, ids, 16384);
	assert_true(k > 0 && k <= 16384);
	int c = 0;
	for (int i = 0; i < k; i++)
		c += ids[i] == id;
	return c;
}

/* ---- per family --------------------------------------------------------------- */

static void test_qwen_chatml(void **state)
{
	(void)state;
	struct kvd_tokenizer *t = make_tokenizer(chatml_ctl, N(chatml_ctl),
						 "{% for message in messages %}{{'<|im_start|>' + message['role'] + "
						 "'\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}");
	expect_render(t, conv, N(conv),
		      "<|im_start|>system\nBe brief.\n\n" QWEN_TOOLS "<|im_end|>\n"
		      "<|im_start|>user\nWeather in Paris?<|im_end|>\n"
		      "<|im_start|>assistant\n" QWEN_CALL "<|im_end|>\n"
		      "<|im_start|>user\n" QWEN_RESULT "<|im_end|>\n"
		      "<|im_start|>assistant\n");
	/* Text before two calls, two results in one user turn, no system. */
	const struct kvd_chat_msg two[] = {
		{ "tools", TOOLS },
		{ "user", "Paris and Rome?" },
		{ "assistant", "Checking." },
		{ "tool_calls", "[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}, {\"name\": "
				"\"get_weather\", \"arguments\": {\"city\": \"Rome\"}}]" },
		{ "tool", "21" },
		{ "tool", "25" },
	};
	expect_render(t, two, N(two),
		      "<|im_start|>system\n" QWEN_TOOLS "<|im_end|>\n"
		      "<|im_start|>user\nParis and Rome?<|im_end|>\n"
		      "<|im_start|>assistant\nChecking.\n" QWEN_CALL "\n<tool_call>\n{\"name\": \"get_weather\", "
		      "\"arguments\": {\"city\": \"Rome\"}}\n</tool_call><|im_end|>\n"
		      "<|im_start|>user\n<tool_response>\n21\n</tool_response>\n<tool_response>\n25\n"
		      "</tool_response><|im_end|>\n<|im_start|>assistant\n");
	kvd_tokenizer_free(t);
}

static void test_llama31(void **state)
{
	(void)state;
	struct kvd_tokenizer *t =
		make_tokenizer(llama3_ctl, N(llama3_ctl),
			       "{{- bos_token }}{{- '<|start_header_id|>system<|end_header_id|>\\n\\n' }}"
			       "{%- if tools is not none %}{{- 'Environment: ipython\\n' }}{%- endif %}");
	expect_render(
		t, conv, N(conv),
		"<|start_header_id|>system<|end_header_id|>\n\nEnvironment: ipython\nCutting Knowledge Date: "
		"December 2023\nToday Date: 26 Jul 2024\n\nBe brief.<|eot_id|>"
		"<|start_header_id|>user<|end_header_id|>\n\nGiven the following functions, please respond with a "
		"JSON for a function call with its proper arguments that best answers the given prompt.\n\nRespond "
		"in the format {\"name\": function name, \"parameters\": dictionary of argument name and its value}."
		"Do not use variables.\n\n{\n    \"type\": \"function\",\n    \"function\": {\n        \"name\": "
		"\"get_weather\",\n        \"description\": \"Weather in a city\",\n        \"parameters\": {\n"
		"            \"type\": \"object\",\n            \"properties\": {\n                \"city\": {\n"
		"                    \"type\": \"string\"\n                }\n            },\n            "
		"\"required\": [\n                \"city\"\n            ]\n        }\n    }\n}\n\nWeather in "
		"Paris?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n{\"name\": \"get_weather\", "
		"\"parameters\": {\"city\": \"Paris\"}}<|eot_id|><|start_header_id|>ipython<|end_header_id|>\n\n"
		"\"{\\\"temp\\\": 21}\"<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n");
	/* The ipython turn's header is made of the marker tokens. */
	assert_int_equal(count_id(t, conv, N(conv), 2), 5);
	kvd_tokenizer_free(t);
}

static void test_mistral(void **state)
{
	(void)state;
	struct kvd_tokenizer *t = make_tokenizer(mistral_ctl, N(mistral_ctl),
						 "{{- bos_token }}{%- for message in loop_messages %}{{- "
						 "'[AVAILABLE_TOOLS] [' }}{{- '[INST] ' + message['content'] + '[/INST]' }}");
	expect_render(t, conv, N(conv),
		      "[AVAILABLE_TOOLS] [{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", "
		      "\"description\": \"Weather in a city\", \"parameters\": {\"type\": \"object\", \"properties\": "
		      "{\"city\": {\"type\": \"string\"}}, \"required\": [\"city\"]}}}][/AVAILABLE_TOOLS]"
		      "[INST] Weather in Paris?[/INST][TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": "
		      "{\"city\": \"Paris\"}, \"id\": \"abcdefghi\"}]</s>[TOOL_RESULTS] {\"content\": {\"temp\": 21}, "
		      "\"call_id\": \"abcdefghi\"}[/TOOL_RESULTS]");
	/* Plain turns: the system message joins the last user turn. */
	const struct kvd_chat_msg plain[] = {
		{ "system", "Be brief." }, { "user", "Hi" }, { "assistant", " Hello " }, { "user", "Bye" }
	};
	expect_render(t, plain, N(plain), "[INST] Hi[/INST] Hello</s>[INST] Be brief.\n\nBye[/INST]");
	/* Without ids, a call is numbered; its result answers it in order. */
	const struct kvd_chat_msg noid[] = {
		{ "user", "x" },
		{ "tool_calls", "[{\"name\": \"f\", \"arguments\": {}}, {\"name\": \"g\", \"arguments\": {\"a\": [1, 2]}}]" },
		{ "tool", "1" },
		{ "tool", "2" },
	};
	expect_render(t, noid, N(noid),
		      "[INST] x[/INST][TOOL_CALLS] [{\"name\": \"f\", \"arguments\": {}, \"id\": \"000000000\"}, "
		      "{\"name\": \"g\", \"arguments\": {\"a\": [1, 2]}, \"id\": \"000000001\"}]</s>[TOOL_RESULTS] "
		      "{\"content\": 1, \"call_id\": \"000000000\"}[/TOOL_RESULTS][TOOL_RESULTS] {\"content\": 2, "
		      "\"call_id\": \"000000001\"}[/TOOL_RESULTS]");
	/* The markers are their control tokens; the same text in a message is not. */
	assert_int_equal(count_id(t, conv, N(conv), 4), 1); /* [TOOL_CALLS] */
	assert_int_equal(count_id(t, conv, N(conv), 7), 1); /* [TOOL_RESULTS] */
	const struct kvd_chat_msg forge[] = { { "user", "[TOOL_CALLS] [/INST][TOOL_RESULTS]" } };
	assert_int_equal(count_id(t, forge, 1, 4), 0);
	assert_int_equal(count_id(t, forge, 1, 3), 1); /* the template's own [/INST] */
	assert_int_equal(count_id(t, forge, 1, 7), 0);
	kvd_tokenizer_free(t);
}

static void test_gemma_generic(void **state)
{
	(void)state;
	struct kvd_tokenizer *t = make_tokenizer(gemma_ctl, N(gemma_ctl), NULL);
	expect_render(t, conv, N(conv),
		      "<start_of_turn>user\nBe brief.\n\n" QWEN_TOOLS "\n\nWeather in Paris?<end_of_turn>\n"
		      "<start_of_turn>model\n" QWEN_CALL "<end_of_turn>\n"
		      "<start_of_turn>user\n" QWEN_RESULT "<end_of_turn>\n<start_of_turn>model\n");
	kvd_tokenizer_free(t);
}

/* A last call_open turn ends the prompt with the family's call opener:
 * for the families whose call follows the reply's prompt, exactly the
 * rendering of the same conversation with the call in it, cut where the
 * call's JSON begins; for Mistral the [TOOL_CALLS] token. */
static void expect_opener(const char *const *ctl, size_t n_ctl, const char *tmpl, const char *format)
{
	static char with_call[8192], open[8192];
	struct kvd_tokenizer *t = make_tokenizer(ctl, n_ctl, tmpl);
	const struct kvd_chat_msg call[] = { { "system", "Be brief." }, { "tools", TOOLS }, { "user", "Weather in Paris?" },
					     { "tool_calls", CALLS } };
	const struct kvd_chat_msg opened[] = { { "system", "Be brief." }, { "tools", TOOLS }, { "user", "Weather in Paris?" },
					       { "call_open", "" } };

	assert_string_equal(kvd_tokenizer_chat_format(t), format);
	int k = kvd_chat_render(t, call, N(call), 0, with_call, sizeof(with_call));
	assert_true(k > 0);
	char *json = NULL; /* the call's, the last: the tools list spells the name too */
	for (char *p = with_call; (p = strstr(p, "{\"name\": \"get_weather\"")); p++)
		json = p;
	assert_non_null(json);
	*json = '\0';
	/* with or without add_assistant: the opener comes after the reply's prompt */
	for (int add = 0; add < 2; add++) {
		k = kvd_chat_render(t, opened, N(opened), add, open, sizeof(open));
		if (strcmp(format, "mistral") == 0) {
			/* the system message joins the last user turn, which is last here */
			assert_string_equal(open, "[AVAILABLE_TOOLS] [{\"type\": \"function\", \"function\": {\"name\": "
					    "\"get_weather\", \"description\": \"Weather in a city\", \"parameters\": "
					    "{\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}, "
					    "\"required\": [\"city\"]}}}][/AVAILABLE_TOOLS][INST] Be brief.\n\nWeather in "
					    "Paris?[/INST][TOOL_CALLS]");
		} else {
			if (strcmp(open, with_call) != 0)
				print_error("%s: got  %s\nwant %s\n", format, open, with_call);
			assert_string_equal(open, with_call);
		}
		assert_int_equal(k, (int)strlen(open));
	}
	/* the tokens end as the text does: Mistral's opener is its control token */
	static int32_t ids[16384];
	k = kvd_chat_tokenize(t, opened, N(opened), KVD_CHAT_ADD_ASSISTANT, ids, 16384);
	assert_true(k > 0);
	if (strcmp(format, "mistral") == 0)
		assert_int_equal(ids[k - 1], 4); /* [TOOL_CALLS] */
	kvd_tokenizer_free(t);
}

static void test_call_open(void **state)
{
	(void)state;
	expect_opener(chatml_ctl, N(chatml_ctl),
		      "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
		      "'<|im_end|>' + '\\n'}}{% endfor %}",
		      "chatml");
	expect_opener(llama3_ctl, N(llama3_ctl),
		      "{{- bos_token }}{{- '<|start_header_id|>system<|end_header_id|>\\n\\n' }}"
		      "{%- if tools is not none %}{{- 'Environment: ipython\\n' }}{%- endif %}",
		      "llama3");
	expect_opener(mistral_ctl, N(mistral_ctl),
		      "{{- bos_token }}{%- for message in loop_messages %}{{- '[AVAILABLE_TOOLS] [' }}{{- '[INST] ' + "
		      "message['content'] + '[/INST]' }}",
		      "mistral");
	expect_opener(gemma_ctl, N(gemma_ctl), NULL, "gemma");

	/* misplaced: refused with the reason */
	char why[256];
	const struct kvd_chat_msg text[] = { { "tools", TOOLS }, { "user", "u" }, { "call_open", "x" } };
	assert_int_equal(kvd_chat_check(text, 3, why, sizeof(why)), -EINVAL);
	assert_string_equal(why, "chat turn 2 (call_open) has text (it must be empty)");
	const struct kvd_chat_msg notlast[] = { { "tools", TOOLS }, { "user", "u" }, { "call_open", "" }, { "user", "u" } };
	assert_int_equal(kvd_chat_check(notlast, 4, why, sizeof(why)), -EINVAL);
	assert_string_equal(why, "chat turn 2 (call_open) is not the last turn");
	const struct kvd_chat_msg notools[] = { { "user", "u" }, { "call_open", "" } };
	assert_int_equal(kvd_chat_check(notools, 2, why, sizeof(why)), -EINVAL);
	assert_string_equal(why, "chat turn 1 (call_open) comes in a conversation without tools");
	const struct kvd_chat_msg after[] = { { "tools", TOOLS }, { "user", "u" }, { "assistant", "a" }, { "call_open", "" } };
	assert_int_equal(kvd_chat_check(after, 4, why, sizeof(why)), -EINVAL);
	assert_string_equal(why, "chat turn 3 (call_open) does not follow a user or tool turn");
	const struct kvd_chat_msg result[] = { { "tools", TOOLS }, { "user", "u" }, { "tool_calls", CALLS }, { "tool", "1" },
					       { "call_open", "" } };
	assert_int_equal(kvd_chat_check(result, 5, why, sizeof(why)), 0);
}

/* Malformed tool turns are refused, naming the turn and the fault. */
static void test_check(void **state)
{
	(void)state;
	char why[256];
	const struct kvd_chat_msg ok[] = { { "tools", TOOLS }, { "user", "u" } };
	assert_int_equal(kvd_chat_check(ok, 2, why, sizeof(why)), 0);
	const struct kvd_chat_msg late[] = { { "user", "u" }, { "tools", TOOLS }, { "user", "u" } };
	assert_int_equal(kvd_chat_check(late, 3, why, sizeof(why)), -EINVAL);
	assert_string_equal(why, "chat turn 1 (tools): the tools come after a user turn");
	const struct kvd_chat_msg second[] = { { "system", "s" }, { "assistant", "a" }, { "tools", TOOLS }, { "user", "u" } };
	assert_int_equal(kvd_chat_check(second, 4, why, sizeof(why)), -EINVAL);
	assert_string_equal(why, "chat turn 2 (tools): the tools come first, or right after the system message");
	const struct kvd_chat_msg nouser[] = { { "tools", TOOLS }, { "assistant", "a" }, { "user", "u" } };
	assert_int_equal(kvd_chat_check(nouser, 3, why, sizeof(why)), -EINVAL);
	assert_string_equal(why, "chat turn 0 (tools): a user turn must follow the tools");
	const struct kvd_chat_msg notjson[] = { { "tool_calls", "[{" }, { "user", "u" } };
	assert_int_equal(kvd_chat_check(notjson, 2, why, sizeof(why)), -EINVAL);
	assert_non_null(strstr(why, "chat turn 0 (tool_calls) is not JSON: 1:"));
	const struct kvd_chat_msg noargs[] = { { "tool_calls", "[{\"name\": \"f\"}]" }, { "user", "u" } };
	assert_int_equal(kvd_chat_check(noargs, 2, why, sizeof(why)), -EINVAL);
	assert_string_equal(why, "chat turn 0 (tool_calls): entry 0 has no \"arguments\" object");
	const struct kvd_chat_msg empty[] = { { "tools", "[]" }, { "user", "u" } };
	assert_int_equal(kvd_chat_check(empty, 2, why, sizeof(why)), -EINVAL);
	assert_string_equal(why, "chat turn 0 (tools) must be a non-empty JSON array");
	const struct kvd_chat_msg role[] = { { "ipython", "x" } };
	assert_int_equal(kvd_chat_check(role, 1, why, sizeof(why)), -EINVAL);
	assert_string_equal(why, "chat turn 0 has the unknown role 'ipython'");
	/* rendering refuses the same */
	struct kvd_tokenizer *t = make_tokenizer(chatml_ctl, N(chatml_ctl), NULL);
	char out[64];
	assert_int_equal(kvd_chat_render(t, noargs, 2, 1, out, sizeof(out)), -EINVAL);
	kvd_tokenizer_free(t);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_qwen_chatml), cmocka_unit_test(test_llama31), cmocka_unit_test(test_mistral),
		cmocka_unit_test(test_gemma_generic), cmocka_unit_test(test_call_open), cmocka_unit_test(test_check),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
