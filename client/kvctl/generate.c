/*
 * client/kvctl/generate.c — kvctl generate: send a prompt, stream the
 * generated text to stdout (or print one JSON object at the end); Ctrl-C
 * cancels.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kvctl.h"
#include "gen_samples.h"

/* ---- generate ----------------------------------------------------------------------------- */

static const char help_generate[] =
	"NAME\n"
	"    kvctl generate - generate text with the model loaded in kvd\n"
	"\n"
	"SYNOPSIS\n"
	"    kvctl generate [OPTIONS] [--] [PROMPT...]\n"
	"    echo PROMPT | kvctl generate [OPTIONS] [-]\n"
	"\n"
	"DESCRIPTION\n"
	"    Sends PROMPT (the arguments joined by spaces; standard input when there are\n"
	"    none or the only one is \"-\") to kvd and streams the generated text to\n"
	"    standard output as it is produced. By default the prompt is a user message\n"
	"    rendered with the model's chat template, and the answer is the assistant's\n"
	"    reply; --raw completes the text exactly as given instead.\n"
	"\n"
	"    The prompt and the generated text share the model's context window (see\n"
	"    'kvctl version'): prompt tokens + --max-tokens must fit in it, or the\n"
	"    request is refused (exit status 4) with both figures named.\n"
	"\n"
	"    Ctrl-C cancels the generation (the daemon frees its memory at once) and exits\n"
	"    with status 130. Unless --no-newline is given, a newline is printed after\n"
	"    text that does not end with one. Options may follow the prompt's words; a\n"
	"    prompt that begins with \"-\" goes after \"--\".\n"
	"\n"
	"OPTIONS\n"
	"    --raw                plain completion: no chat template; the text is\n"
	"                         tokenized as plain text (see --special)\n"
	"    --special            with --raw: special-token texts such as <|im_start|> or\n"
	"                         <|endoftext|> in the prompt become the model's special\n"
	"                         tokens (without it they are plain text; 'kvctl tokenize\n"
	"                         --special' shows the ids)\n"
	"    --system TEXT        system message for the chat template (not with --raw)\n"
	"    --max-tokens N       generate at most N tokens (default 256); at most the\n"
	"                         context window less the prompt\n"
	"    --temperature T      sampling temperature; 0 means greedy, deterministic\n"
	"                         decoding (default 0.8)\n"
	"    --top-p P            nucleus sampling: keep the likeliest tokens whose\n"
	"                         probabilities add up to P, 0 < P <= 1; 1 is off\n"
	"                         (default 0.95)\n"
	"    --top-k K            keep only the K likeliest tokens; 0 is off (default 40)\n"
	"    --min-p P            drop tokens less likely than P times the likeliest one,\n"
	"                         0 <= P < 1; 0 is off (default 0.05)\n"
	"    --repeat-penalty R   penalize tokens seen in the last 64; 1 is off (default)\n"
	"    --seed N             sampling seed, for reproducible output (default: random)\n"
	"    --stop STRING        stop when STRING is generated (it is not printed);\n"
	"                         repeatable, up to 8 strings of up to 256 bytes\n"
	"    --session ID         continue session ID (see 'kvctl session'): the daemon\n"
	"                         keeps the conversation's KV cache, so only the new turn\n"
	"                         is processed\n"
	"    --context-policy P   when the context window would overflow: error (default),\n"
	"                         truncate-oldest (sessions: drop the oldest turns, keep\n"
	"                         the system prompt), sliding-window (keep the last\n"
	"                         --window tokens, freeing older KV; may run past the\n"
	"                         context) or sinks (also keep the first --sinks tokens)\n"
	"    --window W           tokens the window policies keep at least (default: as\n"
	"                         many as fit the context)\n"
	"    --sinks S            first tokens the sinks policy keeps, rounded up to KV\n"
	"                         pages (default 4)\n"
	"                         What was dropped is said on stderr and in --json as\n"
	"                         \"context_dropped_tokens\".\n"
	"    --priority P         among your own requests, lower P runs first and is\n"
	"                         preempted last (default 0); other users' requests are\n"
	"                         not affected: users share the machine fairly\n"
	"    --tenant NAME        a cache tenant (1 to 64 bytes): the request shares cached\n"
	"                         prompt pages only with requests of the same user and\n"
	"                         tenant (by default all of a user's requests share)\n"
	"    --json               print nothing while generating; at the end print one JSON\n"
	"                         object: {\"text\", \"token_ids\", \"finish_reason\",\n"
	"                         \"prompt_tokens\", \"cached_tokens\", \"generated_tokens\",\n"
	"                         \"ttft_ms\", \"tokens_per_s\", \"queue_ms\", \"total_ms\",\n"
	"                         \"model\"}. ttft_ms is the time from the daemon receiving\n"
	"                         the request to the first token; tokens_per_s the decode\n"
	"                         speed after the first token. On failure the object has\n"
	"                         an \"error\" member {\"code\", \"message\"} instead.\n"
	"    --no-newline         do not add a final newline\n"
	"    --no-speculate       no speculative decoding for this request, whatever the\n"
	"                         daemon's [speculative] mode (the output is the same\n"
	"                         either way: this only chooses the plain path's speed;\n"
	"                         kvd 0.9.0 or later). --json reports each request's\n"
	"                         \"spec_drafted_tokens\" and \"spec_accepted_tokens\"\n"
	"    -n, --samples N      N independent samples of the prompt, 1 <= N <= 16: the\n"
	"                         daemon computes the prompt once and the samples share its\n"
	"                         KV pages ('kvctl ps' lists each). Printed at the end, each\n"
	"                         under a \"--- sample I (finish, N tokens) ---\" line; with\n"
	"                         --json a \"samples\" array of {\"sample\", \"text\",\n"
	"                         \"token_ids\", \"finish_reason\", \"generated_tokens\"} and the\n"
	"                         request's totals. With --seed S sample 0 is what a\n"
	"                         one-sample run with seed S gives, sample i >= 1 uses a\n"
	"                         seed derived from S and i. Each sample counts as a\n"
	"                         request against server.max_requests_per_client\n"
	"    --logprobs K         with --json: each generated token's log-probability and\n"
	"                         its K likeliest alternatives, 0 <= K <= 20, in a\n"
	"                         \"logprobs\" array of {\"token\", \"id\", \"logprob\",\n"
	"                         \"bytes\", \"top_logprobs\"}: natural logs of the model's own\n"
	"                         distribution (before temperature, penalties and top-k/p)\n"
	"\n"
	"    -n is the number of samples, not of tokens (that is --max-tokens).\n"
	"\n"
	"STRUCTURED OUTPUT\n"
	"    One of these makes the output follow a constraint exactly: the daemon lets\n"
	"    the model draw only tokens that keep the text valid, and ends the answer\n"
	"    when it is complete. Only the text is printed, so it can go straight to a\n"
	"    parser (kvctl generate --json-schema person.json \"...\" | jq .name).\n"
	"    --json-schema FILE   a JSON instance of the JSON Schema in FILE (\"-\": stdin\n"
	"                         is then not the prompt)\n"
	"    --grammar FILE       a sentence of the GBNF grammar in FILE (llama.cpp's\n"
	"                         notation; the start rule is root)\n"
	"    --regex RE           text the regular expression RE matches as a whole\n"
	"    --choice A,B,...     exactly one of the comma-separated strings\n"
	"    --json-object        any JSON object (--json is the output format)\n"
	"    A constraint the daemon cannot compile is refused (exit status 4) with\n"
	"    its message on stderr: \"constraint: LINE:COL: ...\" or the schema part's\n"
	"    JSON pointer; a feature it cannot honour exactly is refused by name.\n"
	"    Output that --max-tokens (or a --stop string) cut before it was complete\n"
	"    is not valid: it is still printed, a message says so on stderr and the\n"
	"    exit status is 8 (with -n: when any sample was cut).\n"
	"\n" COMMON_HELP "\n" EXIT_STATUS_HELP
	"    8    a constrained output was cut by --max-tokens or --stop before it was\n"
	"         complete (it is not valid)\n"
	"\n"
	"EXAMPLES\n"
	"    kvctl generate \"Why is the sky blue?\"\n"
	"    kvctl generate --raw --temperature 0 --max-tokens 20 \"The capital of France is\"\n"
	"    kvctl generate --raw --special --max-tokens 40 \\\n"
	"        $'<|im_start|>user\\nName a colour.<|im_end|>\\n<|im_start|>assistant\\n'\n"
	"    git diff | kvctl generate --system \"Write a commit message.\" --json | jq -r .text\n"
	"    kvctl generate -- \"-1 times -1 is\"\n"
	"    kvctl generate -n 4 --seed 7 \"Name a colour.\"\n"
	"    kvctl generate --raw --temperature 0 --logprobs 5 --json \"The sky is\"\n"
	"    kvctl generate --temperature 0 --json-schema person.json \"Invent a person.\" | jq .name\n"
	"    kvctl generate --choice yes,no \"Is the sky blue?\"\n"
	"\n"
	"SEE ALSO\n"
	"    kvctl tokenize --help, kvctl session --help, kvctl stats --help\n";

struct gen_out {
	bool json;
	char *text;
	size_t len, cap;
	int32_t *ids;
	size_t n_ids, cap_ids;
	bool last_nl;
	int io_error;
};

static int gen_event(struct gen_out *o, const struct kvc_event *ev)
{
	if (o->json) {
		if (grow_array((void **)&o->text, &o->cap, o->len + ev->text_len + 1, 1) < 0)
			return -ENOMEM;
		memcpy(o->text + o->len, ev->text, ev->text_len);
		o->len += ev->text_len;
		if (ev->ids) {
			if (grow_array((void **)&o->ids, &o->cap_ids, o->n_ids + ev->n_tokens, sizeof(int32_t)) < 0)
				return -ENOMEM;
			memcpy(o->ids + o->n_ids, ev->ids, ev->n_tokens * sizeof(int32_t));
			o->n_ids += ev->n_tokens;
		}
		return 0;
	}
	if (ev->text_len == 0)
		return 0;
	if (fwrite(ev->text, 1, ev->text_len, stdout) != ev->text_len || fflush(stdout) != 0)
		return -errno ? -errno : -EIO;
	o->last_nl = ev->text[ev->text_len - 1] == '\n';
	return 0;
}

static void print_gen_json(const struct gen_out *o, const struct kvc_result *res, int code, const char *model)
{
	FILE *f = stdout;
	fputs("{\"text\":", f);
	json_str(f, o->text ? o->text : "", o->len);
	fputs(",\"token_ids\":[", f);
	for (size_t i = 0; i < o->n_ids; i++)
		fprintf(f, "%s%" PRId32, i ? "," : "", o->ids[i]);
	fputs("]", f);
	if (res) {
		fputs(",", f);
		gen_result_json(f, res);
		fprintf(f, ",\"context_dropped_tokens\":%" PRIu32, res->context_dropped_tokens);
	}
	gen_json_close(f, res, code, model);
}

/* The constraint's text for --json-schema / --grammar FILE, --regex RE,
 * --choice A,B,... (made into a JSON array of strings) and --json-object.
 * EXIT_OK, or the status after a message. */
static int constraint_text(const char *cmd, struct kvc_constraint *k, const char *arg, char **ret_buf)
{
	char *buf = NULL;
	size_t len = 0;
	int r;

	*ret_buf = NULL;
	switch (k->kind) {
	case KVC_CONSTRAINT_JSON_SCHEMA:
	case KVC_CONSTRAINT_GBNF:
		r = strcmp(arg, "-") ? read_file(arg, KVC_MAX_CONSTRAINT_BYTES, &buf, &len)
				     : input_text(0, NULL, &buf, &len);
		if (r < 0) {
			log_err("%s: %s: %s", cmd, arg, r == -E2BIG ? "larger than a constraint may be (1 MiB)" : kv_strerror(r));
			return r == -E2BIG ? EXIT_REJECTED : EXIT_IO;
		}
		if (len == 0) {
			free(buf);
			return usage_error(cmd, "%s: the %s is empty", arg,
					   k->kind == KVC_CONSTRAINT_GBNF ? "grammar" : "schema");
		}
		break;
	case KVC_CONSTRAINT_REGEX:
		if (!*arg)
			return usage_error(cmd, "--regex: the expression is empty");
		k->text = arg;
		k->len = KVC_NTS;
		return EXIT_OK;
	case KVC_CONSTRAINT_CHOICE: {
		/* ["A","B",...], the strings JSON-escaped */
		size_t n = strlen(arg), cap = 6 * n + 8, at = 0;
		if (!n)
			return usage_error(cmd, "--choice: no strings");
		buf = malloc(cap);
		if (!buf) {
			log_err("%s: out of memory", cmd);
			return EXIT_FAIL;
		}
		buf[at++] = '[';
		buf[at++] = '"';
		for (const char *c = arg; *c; c++) {
			unsigned char ch = (unsigned char)*c;
			if (ch == ',') {
				at += (size_t)sprintf(buf + at, "\",\"");
			} else if (ch == '"' || ch == '\\') {
				buf[at++] = '\\';
				buf[at++] = (char)ch;
			} else if (ch < 0x20) {
				at += (size_t)sprintf(buf + at, "\\u%04x", ch);
			} else {
				buf[at++] = (char)ch;
			}
		}
		buf[at++] = '"';
		buf[at++] = ']';
		buf[at] = 0;
		len = at;
		break;
	}
	default: /* KVC_CONSTRAINT_JSON_OBJECT */
		k->text = NULL;
		k->len = 0;
		return EXIT_OK;
	}
	k->text = buf;
	k->len = len;
	*ret_buf = buf;
	return EXIT_OK;
}

/* After a constrained request: say on stderr which outputs were cut
 * before the constraint was complete. True when any was. */
static bool constrained_cut(const char *cmd, const kvc_request *q, uint32_t n, uint32_t max_tokens)
{
	bool cut = false;
	for (uint32_t i = 0; i < n; i++) {
		const struct kvc_result *res = kvc_request_sample_result(q, i);
		if (!res || (res->finish_reason != KVC_FINISH_LENGTH && res->finish_reason != KVC_FINISH_STOP))
			continue;
		cut = true;
		char who[32] = "the output";
		if (n > 1)
			snprintf(who, sizeof(who), "sample %" PRIu32, i);
		if (res->finish_reason == KVC_FINISH_LENGTH)
			log_err("%s: %s was cut at --max-tokens %" PRIu32 " before the constraint was complete: "
				"it is not valid", cmd, who, max_tokens);
		else
			log_err("%s: %s was cut by a stop string before the constraint was complete: it is not valid",
				cmd, who);
	}
	return cut;
}

int generate_main(struct ctx *x, int argc, char **argv, bool chat)
{
	enum { O_RAW = OPT_FIRST_CMD, O_SYSTEM, O_MAX, O_TEMP, O_TOPP, O_TOPK, O_MINP, O_REP, O_SEED, O_STOP,
	       O_SESSION, O_JSON, O_SPECIAL, O_NO_NEWLINE, O_SAMPLES, O_LOGPROBS,
	       O_CTX_POLICY, O_CTX_WINDOW, O_CTX_SINKS, O_TENANT, O_PRIORITY, O_SCHEMA, O_GRAMMAR, O_REGEX,
	       O_CHOICE, O_JSON_OBJECT, O_NO_SPEC };
	static const struct option longopts[] = {
		{ "raw", no_argument, NULL, O_RAW },
		{ "system", required_argument, NULL, O_SYSTEM },
		{ "max-tokens", required_argument, NULL, O_MAX },
		{ "temperature", required_argument, NULL, O_TEMP },
		{ "top-p", required_argument, NULL, O_TOPP },
		{ "top-k", required_argument, NULL, O_TOPK },
		{ "min-p", required_argument, NULL, O_MINP },
		{ "repeat-penalty", required_argument, NULL, O_REP },
		{ "seed", required_argument, NULL, O_SEED },
		{ "stop", required_argument, NULL, O_STOP },
		{ "session", required_argument, NULL, O_SESSION },
		{ "json", no_argument, NULL, O_JSON },
		{ "special", no_argument, NULL, O_SPECIAL },
		{ "no-newline", no_argument, NULL, O_NO_NEWLINE },
		{ "samples", required_argument, NULL, O_SAMPLES },
		{ "logprobs", required_argument, NULL, O_LOGPROBS },
		{ "context-policy", required_argument, NULL, O_CTX_POLICY },
		{ "window", required_argument, NULL, O_CTX_WINDOW },
		{ "sinks", required_argument, NULL, O_CTX_SINKS },
		{ "tenant", required_argument, NULL, O_TENANT },
		{ "priority", required_argument, NULL, O_PRIORITY },
		{ "json-schema", required_argument, NULL, O_SCHEMA },
		{ "grammar", required_argument, NULL, O_GRAMMAR },
		{ "regex", required_argument, NULL, O_REGEX },
		{ "choice", required_argument, NULL, O_CHOICE },
		{ "json-object", no_argument, NULL, O_JSON_OBJECT },
		{ "no-speculate", no_argument, NULL, O_NO_SPEC },
		COMMON_LONGOPTS,
		{ 0 },
	};
	const char *cmd = chat ? "chat" : "generate";
	const char *help = chat ? kvctl_help_chat : help_generate;
	struct chat_conv conv = { 0 };
	struct kvc_gen_params p;
	const char *stops[8];
	size_t n_stop = 0;
	bool json = false, newline = true;
	struct kvc_constraint cons = { 0 };
	const char *cons_arg = NULL; /* FILE, RE or the choice list */
	char *cons_buf = NULL;       /* what cons.text points into, when allocated */
	double d;
	uint32_t u;
	int o, r;

	kvc_gen_params_init(&p);
	while ((o = getopt_long(argc, argv, ":hn:", longopts, NULL)) != -1) {
		if ((r = common_opt(x, cmd, o, optarg)) != 0) {
			if (r < 0)
				return EXIT_USAGE;
			continue;
		}
		switch (o) {
		case 'h':
			fputs(help, stdout);
			return EXIT_OK;
		case O_NO_NEWLINE:
			newline = false;
			break;
		case O_SPECIAL:
			p.flags |= KVC_GEN_PARSE_SPECIAL;
			break;
		case O_RAW:
			p.flags |= KVC_GEN_RAW;
			break;
		case O_SYSTEM:
			p.system = optarg;
			break;
		case O_MAX:
			if (!parse_u32(optarg, &p.max_tokens) || p.max_tokens == 0)
				return usage_error(cmd, "--max-tokens: '%s' is not a positive integer", optarg);
			break;
		case O_TEMP:
			if (!parse_double(optarg, &d) || d < 0)
				return usage_error(cmd, "--temperature: '%s' is not a number >= 0", optarg);
			p.temperature = (float)d;
			break;
		case O_TOPP:
			if (!parse_double(optarg, &d) || d <= 0 || d > 1)
				return usage_error(cmd, "--top-p: '%s' is not in (0, 1]", optarg);
			p.top_p = (float)d;
			break;
		case O_TOPK:
			if (!parse_u32(optarg, &u) || u > INT32_MAX)
				return usage_error(cmd, "--top-k: '%s' is not an integer >= 0", optarg);
			p.top_k = (int32_t)u;
			break;
		case O_MINP:
			if (!parse_double(optarg, &d) || d < 0 || d >= 1)
				return usage_error(cmd, "--min-p: '%s' is not in [0, 1)", optarg);
			p.min_p = (float)d;
			break;
		case O_REP:
			if (!parse_double(optarg, &d) || d <= 0)
				return usage_error(cmd, "--repeat-penalty: '%s' is not a number > 0", optarg);
			p.repeat_penalty = (float)d;
			break;
		case O_SEED:
			if (!parse_u64(optarg, &p.seed) || p.seed == KVC_SEED_RANDOM)
				return usage_error(cmd, "--seed: '%s' is not an integer below 2^64-1", optarg);
			break;
		case O_STOP:
			if (n_stop == 8)
				return usage_error(cmd, "--stop: at most 8 stop strings");
			if (!*optarg || strlen(optarg) > 256)
				return usage_error(cmd, "--stop: strings must be 1 to 256 bytes long");
			stops[n_stop++] = optarg;
			break;
		case O_SESSION:
			if (!parse_u64(optarg, &p.session_id) || p.session_id == 0)
				return usage_error(cmd, "--session: '%s' is not a session id", optarg);
			break;
		case O_JSON:
			json = true;
			break;
		case O_NO_SPEC:
			p.flags |= KVC_GEN_NO_SPECULATE;
			break;
		case 'n':
		case O_SAMPLES:
			if (!parse_u32(optarg, &u) || u == 0 || u > KVC_MAX_SAMPLES)
				return usage_error(cmd, "-n/--samples: '%s' is not a number of samples from 1 to %d "
							"(the number of tokens is --max-tokens)",
						   optarg, KVC_MAX_SAMPLES);
			p.n_samples = u;
			break;
		case O_LOGPROBS:
			if (!parse_u32(optarg, &u) || u > KVC_MAX_TOP_LOGPROBS)
				return usage_error(cmd, "--logprobs: '%s' is not a number of alternatives from 0 to %d",
						   optarg, KVC_MAX_TOP_LOGPROBS);
			p.flags |= KVC_GEN_LOGPROBS;
			p.top_logprobs = u;
			break;
		case O_CTX_POLICY:
			if ((r = kvc_context_policy_parse(optarg)) < 0)
				return usage_error(cmd, "--context-policy: '%s' is not error, truncate-oldest, "
						   "sliding-window or sinks", optarg);
			p.context_policy = (uint32_t)r;
			break;
		case O_CTX_WINDOW:
			if (!parse_u32(optarg, &p.context_window) || !p.context_window)
				return usage_error(cmd, "--window: '%s' is not a positive integer", optarg);
			break;
		case O_CTX_SINKS:
			if (!parse_u32(optarg, &p.context_sinks) || !p.context_sinks)
				return usage_error(cmd, "--sinks: '%s' is not a positive integer", optarg);
			break;
		case O_PRIORITY: {
			char *end;
			long v = strtol(optarg, &end, 10);

			if (!*optarg || *end || v < KVC_MIN_PRIORITY || v > KVC_MAX_PRIORITY)
				return usage_error(cmd, "--priority: '%s' is not an integer from %d to %d", optarg,
						   KVC_MIN_PRIORITY, KVC_MAX_PRIORITY);
			p.priority = (int32_t)v;
			break;
		}
		case O_TENANT:
			if (!optarg[0] || strlen(optarg) > KVC_MAX_TENANT_BYTES)
				return usage_error(cmd, "--tenant: a tenant is 1 to %d bytes", KVC_MAX_TENANT_BYTES);
			p.tenant = optarg;
			break;
		case O_SCHEMA:
		case O_GRAMMAR:
		case O_REGEX:
		case O_CHOICE:
		case O_JSON_OBJECT:
			if (cons.kind)
				return usage_error(cmd, "one constraint at most (--json-schema, --grammar, --regex, "
							"--choice or --json-object)");
			cons.kind = o == O_SCHEMA ? KVC_CONSTRAINT_JSON_SCHEMA : o == O_GRAMMAR ? KVC_CONSTRAINT_GBNF
				    : o == O_REGEX ? KVC_CONSTRAINT_REGEX : o == O_CHOICE ? KVC_CONSTRAINT_CHOICE
				    : KVC_CONSTRAINT_JSON_OBJECT;
			cons_arg = optarg;
			break;
		case '?':
			return option_error(cmd, argv, o);
		default:
			return option_error(cmd, argv, o);
		}
	}
	if (cons.kind && (cons.kind == KVC_CONSTRAINT_JSON_SCHEMA || cons.kind == KVC_CONSTRAINT_GBNF) &&
	    !strcmp(cons_arg, "-") && (optind >= argc || !strcmp(argv[optind], "-")))
		return usage_error(cmd, "the constraint and the prompt cannot both come from standard input");
	if (chat && (p.flags & (KVC_GEN_RAW | KVC_GEN_PARSE_SPECIAL) || p.system || p.session_id))
		return usage_error(cmd, "--raw, --special, --system and --session are not for conversations: "
					"a system prompt is a \"system\" message, and the messages are the history");
	if (chat && argc - optind > 1)
		return usage_error(cmd, "one conversation FILE at most (or standard input)");
	if (p.context_window && p.context_policy != KVC_CONTEXT_SLIDING_WINDOW && p.context_policy != KVC_CONTEXT_SINKS)
		return usage_error(cmd, "--window goes with --context-policy sliding-window or sinks");
	if (p.context_sinks && p.context_policy != KVC_CONTEXT_SINKS)
		return usage_error(cmd, "--sinks goes with --context-policy sinks");
	if (p.system && (p.flags & KVC_GEN_RAW))
		return usage_error(cmd, "--system needs the chat template: drop --raw");
	if ((p.flags & KVC_GEN_PARSE_SPECIAL) && !(p.flags & KVC_GEN_RAW))
		return usage_error(cmd, "--special goes with --raw: without it the daemon renders the chat "
					"template itself");
	if (p.n_samples > 1 && p.session_id)
		return usage_error(cmd, "-n: a session continues one conversation; several samples go without --session");
	if ((p.flags & KVC_GEN_LOGPROBS) && !json)
		return usage_error(cmd, "--logprobs: log-probabilities are printed with --json");
	p.stop = stops;
	p.n_stop = n_stop;
	if (json)
		p.flags |= KVC_GEN_WANT_IDS;
	/* several samples or log-probabilities: collected per sample, printed at the end */
	bool multi = p.n_samples > 1 || (p.flags & KVC_GEN_LOGPROBS);

	char *prompt;
	size_t len;
	if (chat && optind < argc && strcmp(argv[optind], "-") != 0)
		r = read_file(argv[optind], MAX_INPUT_BYTES, &prompt, &len);
	else
		r = input_text(argc - optind, argv + optind, &prompt, &len);
	if (r < 0) {
		if (chat && optind < argc && strcmp(argv[optind], "-") != 0)
			log_err("%s: %s: %s", cmd, argv[optind], kv_strerror(r));
		else
			log_err("reading the %s: %s", chat ? "conversation" : "prompt", kv_strerror(r));
		return r == -E2BIG ? EXIT_REJECTED : EXIT_IO;
	}
	if (len == 0) {
		free(prompt);
		return usage_error(cmd, chat ? "the conversation is empty" : "the prompt is empty");
	}
	if (chat) {
		char why[256];
		r = chat_conv_parse(prompt, len, &conv, why, sizeof(why));
		free(prompt);
		if (r < 0) {
			log_err("%s: %s", cmd, r == -EINVAL ? "the conversation is not valid" : kv_strerror(r));
			log_err("%s: %s", cmd, why);
			return r == -EOPNOTSUPP ? EXIT_FAIL : r == -EINVAL ? EXIT_USAGE : EXIT_IO;
		}
		prompt = NULL;
		len = 0;
		p.messages = conv.msgs;
		p.n_messages = conv.n;
	}

	kvc_client *c;
	if ((r = connect_daemon(x, &c)) != 0) {
		free(prompt);
		chat_conv_free(&conv);
		return r;
	}
	/* Limits the daemon announced: say which one, with its figure, rather
	 * than the bare -E2BIG the library would return. */
	const struct kvc_info *info = kvc_server_info(c);
	bool windowed = p.context_policy == KVC_CONTEXT_SLIDING_WINDOW || p.context_policy == KVC_CONTEXT_SINKS;
	if (info->max_tokens && p.max_tokens > info->max_tokens && !windowed) {
		log_err("%s: --max-tokens %" PRIu32 " is more than kvd accepts: at most %" PRIu32
			" (the model's context window is %" PRIu32 " tokens, shared by the prompt and the answer)",
			cmd, p.max_tokens, info->max_tokens, info->n_ctx);
		free(prompt);
		chat_conv_free(&conv);
		kvc_close(c);
		return EXIT_REJECTED;
	}
	if (info->max_prompt_bytes && len > info->max_prompt_bytes) {
		log_err("generate: the prompt is %zu bytes; kvd accepts at most %" PRIu32
			" (server.max_prompt_bytes)", len, info->max_prompt_bytes);
		free(prompt);
		kvc_close(c);
		return EXIT_REJECTED;
	}
	install_sigint();
	struct gen_out out = { .json = json, .last_nl = true };
	struct gen_samples *gs = NULL;
	if (multi && (!(gs = malloc(sizeof(*gs))) || gen_samples_init(gs, p.n_samples, json, p.flags & KVC_GEN_LOGPROBS))) {
		log_err("%s: out of memory", cmd);
		if (gs)
			gen_samples_free(gs);
		free(gs);
		free(prompt);
		chat_conv_free(&conv);
		kvc_close(c);
		return EXIT_FAIL;
	}
	if (cons.kind) {
		r = constraint_text(cmd, &cons, cons_arg, &cons_buf);
		if (r != EXIT_OK) {
			if (gs) {
				gen_samples_free(gs);
				free(gs);
			}
			free(prompt);
			chat_conv_free(&conv);
			kvc_close(c);
			return r;
		}
		p.constraint = &cons;
	}
	kvc_request *q;
	r = kvc_request_start(c, prompt, len, &p, &q);
	free(prompt);
	free(cons_buf); /* sent (or refused) by now */
	cons_buf = NULL;
	chat_conv_free(&conv); /* the library copied the messages */
	if (r < 0) {
		if (json && gs)
			gen_samples_print_json(gs, NULL, r, kvc_server_info(c)->model_name);
		else if (json)
			print_gen_json(&out, NULL, r, kvc_server_info(c)->model_name);
		if (gs) {
			gen_samples_free(gs);
			free(gs);
		}
		if (r == -EOPNOTSUPP && multi)
			log_err("%s: kvd %u.%u.%u is older than samples and log-probabilities (kvd 0.3.0)", cmd,
				info->server_version >> 16, (info->server_version >> 8) & 0xff,
				info->server_version & 0xff);
		if (chat && r == -EOPNOTSUPP)
			log_err("chat: kvd %u.%u.%u is older than conversations (kvd 0.2.0)",
				info->server_version >> 16, (info->server_version >> 8) & 0xff,
				info->server_version & 0xff);
		if (r == -EOPNOTSUPP && cons.kind)
			log_err("%s: kvd %u.%u.%u is older than constraints (kvd 0.7.0)", cmd, info->server_version >> 16,
				(info->server_version >> 8) & 0xff, info->server_version & 0xff);
		int st = fail(c, cmd, r);
		kvc_close(c);
		return st;
	}
	/* Publish the request to the SIGINT handler; signals arriving before
	 * this point just set g_interrupted, which is checked below. */
	g_sig_request = kvc_request_id(q);
	g_sig_client = c;
	if (g_interrupted)
		kvc_cancel(c, kvc_request_id(q));

	const struct kvc_event *ev;
	while ((r = kvc_request_next(q, &ev)) == 1) {
		if (out.io_error)
			continue;
		int e = gs ? gen_samples_event(gs, ev) : gen_event(&out, ev);
		if (e < 0) {
			out.io_error = e;
			kvc_cancel(c, kvc_request_id(q));
		}
	}
	g_sig_client = NULL;
	g_sig_request = 0;

	const struct kvc_result *res = kvc_request_result(q);
	int status;
	if (out.io_error) {
		if (out.io_error != -EPIPE) /* a closed pipe (| head) is not worth a message */
			log_err("writing the output: %s", kv_strerror(out.io_error));
		status = EXIT_IO;
	} else if (json && gs) {
		gen_samples_print_json(gs, q, r, kvc_server_info(c)->model_name);
		status = r < 0 ? exit_for(r) : EXIT_OK;
		if (fflush(stdout) != 0)
			status = EXIT_IO;
	} else if (json) {
		print_gen_json(&out, res, r, kvc_server_info(c)->model_name);
		status = r < 0 ? exit_for(r) : EXIT_OK;
		if (fflush(stdout) != 0)
			status = EXIT_IO;
	} else {
		if (gs)
			status = gen_samples_print_text(gs, q, newline) < 0 ? EXIT_IO : EXIT_OK;
		else if (newline && !out.last_nl)
			fputc('\n', stdout);
		if (!gs)
			status = fflush(stdout) != 0 ? EXIT_IO : EXIT_OK;
		if (res && res->context_dropped_tokens)
			fprintf(stderr, "kvctl: %s%s dropped %" PRIu32 " tokens of context\n",
				p.context_policy ? "context policy " : "the session's context policy",
				p.context_policy ? kvc_context_policy_name(p.context_policy) : "", res->context_dropped_tokens);
		if (r == -ECANCELED) {
			status = EXIT_CANCELLED;
		} else if (r < 0) {
			if (res && res->error_message[0])
				log_err("%s: %s (%s)", cmd, kv_strerror(r), res->error_message);
			else
				log_err("%s: %s", cmd, kv_strerror(r));
			status = exit_for(r);
		}
	}
	if (json && r == -ECANCELED)
		status = EXIT_CANCELLED;
	if (cons.kind && r >= 0 && status == EXIT_OK && constrained_cut(cmd, q, gs ? p.n_samples : 1, p.max_tokens))
		status = EXIT_CUT;
	kvc_request_finish(q);
	kvc_close(c);
	free(out.text);
	free(out.ids);
	if (gs) {
		gen_samples_free(gs);
		free(gs);
	}
	return status;
}

static int cmd_generate(struct ctx *x, int argc, char **argv)
{
	return generate_main(x, argc, argv, false);
}

const struct kvctl_command kvctl_cmd_generate = {
	"generate", "generate text from a prompt, streamed to stdout (or as JSON)", cmd_generate, help_generate,
};
