/*
 * client/kvctl/tokens.c — kvctl tokenize and kvctl count: the model's own
 * tokenizer, through the daemon.
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

#include "kvctl.h"

/* ---- tokenize and count ----------------------------------------------------------------------- */

static const char help_tokenize[] =
	"NAME\n"
	"    kvctl tokenize - show the token ids the model's tokenizer gives a text\n"
	"\n"
	"SYNOPSIS\n"
	"    kvctl tokenize [--bos] [--special] [--json] [TEXT... | -]\n"
	"\n"
	"DESCRIPTION\n"
	"    Tokenizes TEXT (the arguments joined by spaces; standard input when there are\n"
	"    none or the only one is \"-\") with the tokenizer of the model loaded in kvd\n"
	"    and prints the ids on one line, separated by spaces. No chat template is\n"
	"    applied.\n"
	"\n"
	"OPTIONS\n"
	"    --bos       prepend the model's beginning-of-sequence token, if it has one\n"
	"    --special   recognise special-token texts such as <|im_start|> as single tokens\n"
	"                (without it they are tokenized as plain text)\n"
	"    --json      print {\"tokens\": [ids...], \"count\": N}\n"
	"\n" COMMON_HELP "\n" EXIT_STATUS_HELP
	"\n"
	"EXAMPLES\n"
	"    kvctl tokenize \"Hello, world\"\n"
	"    kvctl tokenize --special '<|im_start|>user'\n";

static const char help_count[] =
	"NAME\n"
	"    kvctl count - count the tokens of a text with the model's tokenizer\n"
	"\n"
	"SYNOPSIS\n"
	"    kvctl count [--bos] [--special] [--json] [TEXT... | -]\n"
	"\n"
	"DESCRIPTION\n"
	"    Prints how many tokens TEXT (the arguments joined by spaces; standard input\n"
	"    when there are none or the only one is \"-\") takes for the model loaded in\n"
	"    kvd. No chat template is applied: a chat prompt costs a few tokens more.\n"
	"\n"
	"OPTIONS\n"
	"    --bos       count the beginning-of-sequence token too, if the model has one\n"
	"    --special   recognise special-token texts as single tokens\n"
	"    --json      print {\"count\": N, \"bytes\": B}\n"
	"\n" COMMON_HELP "\n" EXIT_STATUS_HELP
	"\n"
	"EXAMPLES\n"
	"    kvctl count < README.md\n";

static int cmd_tokenize(struct ctx *x, int argc, char **argv, bool count)
{
	enum { O_BOS = OPT_FIRST_CMD, O_SPECIAL, O_JSON };
	static const struct option longopts[] = {
		{ "bos", no_argument, NULL, O_BOS },
		{ "special", no_argument, NULL, O_SPECIAL },
		{ "json", no_argument, NULL, O_JSON },
		COMMON_LONGOPTS,
		{ 0 },
	};
	const char *cmd = count ? "count" : "tokenize";
	unsigned flags = 0;
	bool json = false;
	int o, r;

	while ((o = getopt_long(argc, argv, ":h", longopts, NULL)) != -1) {
		if ((r = common_opt(x, cmd, o, optarg)) != 0) {
			if (r < 0)
				return EXIT_USAGE;
			continue;
		}
		switch (o) {
		case 'h':
			fputs(count ? help_count : help_tokenize, stdout);
			return EXIT_OK;
		case O_BOS:
			flags |= KVC_TOK_ADD_BOS;
			break;
		case O_SPECIAL:
			flags |= KVC_TOK_PARSE_SPECIAL;
			break;
		case O_JSON:
			json = true;
			break;
		default:
			return option_error(cmd, argv, o);
		}
	}
	char *text;
	size_t len;
	r = input_text(argc - optind, argv + optind, &text, &len);
	if (r < 0) {
		log_err("reading the text: %s", kv_strerror(r));
		return r == -E2BIG ? EXIT_REJECTED : EXIT_IO;
	}
	kvc_client *c;
	if ((r = connect_daemon(x, &c)) != 0) {
		free(text);
		return r;
	}
	int status = EXIT_OK;
	if (count) {
		size_t n;
		r = kvc_count_tokens(c, text, len, flags, &n);
		if (r < 0)
			status = fail(c, cmd, r);
		else if (json)
			printf("{\"count\":%zu,\"bytes\":%zu}\n", n, len);
		else
			printf("%zu\n", n);
	} else {
		int32_t *ids;
		size_t n;
		r = kvc_tokenize(c, text, len, flags, &ids, &n);
		if (r < 0) {
			status = fail(c, cmd, r);
		} else {
			fputs(json ? "{\"tokens\":[" : "", stdout);
			for (size_t i = 0; i < n; i++)
				printf("%s%" PRId32, i ? (json ? "," : " ") : "", ids[i]);
			if (json)
				printf("],\"count\":%zu}\n", n);
			else
				fputc('\n', stdout);
			kvc_free(ids);
		}
	}
	if (fflush(stdout) != 0 && status == EXIT_OK)
		status = EXIT_IO;
	free(text);
	kvc_close(c);
	return status;
}

static int cmd_tokenize_ids(struct ctx *x, int argc, char **argv)
{
	return cmd_tokenize(x, argc, argv, false);
}

static int cmd_count(struct ctx *x, int argc, char **argv)
{
	return cmd_tokenize(x, argc, argv, true);
}

const struct kvctl_command kvctl_cmd_tokenize = {
	"tokenize", "the token ids of a text, with the model's tokenizer", cmd_tokenize_ids, help_tokenize,
};
const struct kvctl_command kvctl_cmd_count = {
	"count", "the number of tokens of a text", cmd_count, help_count,
};
