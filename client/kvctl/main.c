/*
 * client/kvctl/main.c — kvctl, the command-line client of kvd: global options,
 * the command table and dispatch. Each command family lives in its own file
 * (generate.c, stats.c with map.c and prom.c, ledger.c, cache.c, tokens.c, plan.c,
 * session.c) and documents itself with --help; exit statuses are distinct so scripts can tell "daemon down" from
 * "request refused" from "usage error".
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

static const char help_main[] =
	"NAME\n"
	"    kvctl - control and use kvd, the local LLM generation daemon\n"
	"\n"
	"SYNOPSIS\n"
	"    kvctl [--socket PATH] [--timeout SECS] COMMAND [OPTIONS] [ARGS]\n"
	"    kvctl --version | --help | help COMMAND\n"
	"\n"
	"DESCRIPTION\n"
	"    kvd keeps one language model loaded and serves text generation to local\n"
	"    programs; its KV cache is managed in pages, like virtual memory. kvctl is its\n"
	"    command-line client, built on libkvclient.\n"
	"\n"
	"COMMANDS\n";

static const char help_main_tail[] =
	"\n"
	"    Run 'kvctl COMMAND --help' for a command's options.\n"
	"\n" COMMON_HELP "\n" EXIT_STATUS_HELP
	"\n"
	"EXAMPLES\n"
	"    kvctl generate \"Why is the sky blue?\"\n"
	"    kvctl stats --json\n"
	"    KVD_SOCKET=$PWD/kvd.sock kvctl ps\n";

static const char help_help[] =
	"NAME\n"
	"    kvctl help - show kvctl's help, or a command's\n"
	"\n"
	"SYNOPSIS\n"
	"    kvctl help [COMMAND]\n"
	"\n"
	"DESCRIPTION\n"
	"    Without COMMAND, prints the list of commands ('kvctl --help' does the same);\n"
	"    with one, prints that command's manual, as 'kvctl COMMAND --help' does.\n"
	"    Neither connects to kvd.\n"
	"\n"
	"OPTIONS\n"
	"    -h, --help   show this help\n"
	"\n" EXIT_STATUS_HELP
	"\n"
	"EXAMPLES\n"
	"    kvctl help generate\n";

static int cmd_help(struct ctx *x, int argc, char **argv);

static const struct kvctl_command kvctl_cmd_help = {
	"help", "this text, or 'help COMMAND' for a command's", cmd_help, help_help,
};

/* The command table: one row per command, from the family files. */
static const struct kvctl_command *const commands[] = {
	&kvctl_cmd_generate, &kvctl_cmd_chat, &kvctl_cmd_stats, &kvctl_cmd_tokenize, &kvctl_cmd_count, &kvctl_cmd_plan,
	&kvctl_cmd_ps,       &kvctl_cmd_ledger, &kvctl_cmd_cache,   &kvctl_cmd_session, &kvctl_cmd_version,
	&kvctl_cmd_help,
};

static void print_main_help(FILE *f)
{
	fputs(help_main, f);
	for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
		fprintf(f, "    %-10s %s\n", commands[i]->name, commands[i]->summary);
	fputs(help_main_tail, f);
}

static const struct kvctl_command *find_command(const char *name)
{
	for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
		if (strcmp(commands[i]->name, name) == 0)
			return commands[i];
	return NULL;
}

static int cmd_help(struct ctx *x, int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "help", no_argument, NULL, 'h' },
		{ 0 },
	};
	const char *cmd = "help";
	int o;

	(void)x;
	while ((o = getopt_long(argc, argv, ":h", longopts, NULL)) != -1) {
		if (o == 'h') {
			fputs(help_help, stdout);
			return EXIT_OK;
		}
		return option_error(cmd, argv, o);
	}
	if (optind >= argc) {
		print_main_help(stdout);
		return EXIT_OK;
	}
	if (optind + 1 < argc)
		return usage_error(cmd, "unexpected argument '%s'", argv[optind + 1]);
	const struct kvctl_command *c = find_command(argv[optind]);
	if (!c)
		return usage_error(cmd, "no command '%s'", argv[optind]);
	fputs(c->help, stdout);
	return EXIT_OK;
}

int main(int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "version", no_argument, NULL, 'V' },
		COMMON_LONGOPTS,
		{ 0 },
	};
	struct ctx x = { .socket = NULL, .timeout_s = -1 };
	int o, r;

	g_journal = stderr_is_journal();
	opterr = 0; /* option_error() says what was wrong */
	while ((o = getopt_long(argc, argv, "+:hV", longopts, NULL)) != -1) {
		if ((r = common_opt(&x, NULL, o, optarg)) != 0) {
			if (r < 0)
				return EXIT_USAGE;
			continue;
		}
		switch (o) {
		case 'h':
			print_main_help(stdout);
			return EXIT_OK;
		case 'V':
			printf("kvctl %s\n", KVC_VERSION_STRING);
			return EXIT_OK;
		default:
			return option_error(NULL, argv, o);
		}
	}
	if (optind >= argc) {
		print_main_help(stderr);
		return EXIT_USAGE;
	}
	const char *name = argv[optind];
	const struct kvctl_command *c = find_command(name);
	if (!c) {
		log_err("no command '%s'", name);
		fprintf(stderr, "       try 'kvctl --help'\n");
		return EXIT_USAGE;
	}
	/* The command parses its own options from its name on (options may
	 * follow operands; "--" ends them). optind = 0 resets getopt fully. */
	int sub_argc = argc - optind;
	char **sub_argv = argv + optind;
	optind = 0;
	return c->fn(&x, sub_argc, sub_argv);
}
