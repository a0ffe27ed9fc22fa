/*
 * client/kvctl/main.c — kvctl, the command-line client of kvd: global options, the
 * command table and dispatch. Each command family lives in its own file
 * (generate.c, stats.c, tokens.c, plan.c, session.c) and documents itself
 * with --help; exit statuses are distinct so scripts can tell "daemon down"
 * from "request refused" from "usage error".
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
"    help       this text, or 'help COMMAND' for a command's\n"
	"\n"
	"    Run 'kvctl COMMAND --help' for a command's options.\n"
	"\n" COMMON_HELP "\n" EXIT_STATUS_HELP
	"\n"
	"EXAMPLES\n"
	"    kvctl generate \"Why is the sky blue?\"\n"
	"    kvctl stats --json\n"
	"    KVD_SOCKET=$PWD/kvd.sock kvctl ps\n";

/* The command table: one row per command, from the family files. */
static const struct kvctl_command *const commands[] = {
	&kvctl_cmd_generate, &kvctl_cmd_stats, &kvctl_cmd_tokenize, &kvctl_cmd_count,
	&kvctl_cmd_plan,     &kvctl_cmd_ps,    &kvctl_cmd_session,  &kvctl_cmd_version,
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
	opterr = 1;
	while ((o = getopt_long(argc, argv, "+hV", longopts, NULL)) != -1) {
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
			fprintf(stderr, "       try 'kvctl --help'\n");
			return EXIT_USAGE;
		}
	}
	if (optind >= argc) {
		print_main_help(stderr);
		return EXIT_USAGE;
	}
	const char *name = argv[optind];
	if (strcmp(name, "help") == 0) {
		if (optind + 1 >= argc) {
			print_main_help(stdout);
			return EXIT_OK;
		}
		const struct kvctl_command *c = find_command(argv[optind + 1]);
		if (!c) {
			log_err("help: no command '%s'", argv[optind + 1]);
			return EXIT_USAGE;
		}
		fputs(c->help, stdout);
		return EXIT_OK;
	}
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
