/*
 * client/kvctl/map.c — kvctl stats --map: the daemon's KV pool drawn in the
 * terminal, one cell per page, then one per swap-file page.
 *
 * The picture comes from libkvclient's KV map (the daemon's page metadata,
 * mapped read-only), so redrawing it with --watch costs the daemon nothing
 * but the one STATS call per frame that fills the header line (and notices
 * a daemon that went away). Cells are plain characters, which say
 * everything on their own (a shared page shows how many sequences map it);
 * on a terminal they are also coloured, unless NO_COLOR is set or --color
 * says otherwise. Rows are as wide as the terminal.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include "kvctl.h"

enum cell {
	C_FREE,
	C_PRIVATE,
	C_SHARED, /* + a shade by refcount */
	C_CACHED,
	C_SWAPPED,
	C_DEMOTED,
	C_SWAP_FREE,
	C_UNKNOWN,
};

/* Shades of shared pages by refcount: 2, 3, 4, 5-8, 9 and more. */
static unsigned shade(uint32_t ref)
{
	return ref <= 4 ? ref - 2 : ref <= 8 ? 3 : 4;
}

static char cell_char(enum cell k, uint32_t ref)
{
	switch (k) {
	case C_FREE: return '.';
	case C_PRIVATE: return 'o';
	case C_SHARED: return ref <= 9 ? (char)('0' + ref) : '+';
	case C_CACHED: return 'c';
	case C_SWAPPED: return 's';
	case C_DEMOTED: return 'd';
	case C_SWAP_FREE: return '_';
	default: return '?';
	}
}

/* SGR sequence of a cell kind (and shade); "" for none. */
static const char *cell_sgr(enum cell k, unsigned sh)
{
	static const char *const shared[] = {
		"\033[30;48;5;226m", "\033[30;48;5;220m", "\033[30;48;5;214m", "\033[30;48;5;208m", "\033[97;48;5;196m",
	};
	switch (k) {
	case C_FREE: return "\033[2m";
	case C_PRIVATE: return "\033[30;42m";
	case C_SHARED: return shared[sh < 5 ? sh : 4];
	case C_CACHED: return "\033[97;44m";
	case C_SWAPPED: return "\033[97;45m";
	case C_DEMOTED: return "\033[30;46m";
	case C_SWAP_FREE: return "\033[2m";
	default: return "\033[1;31m";
	}
}

struct canvas {
	FILE *f;
	bool color;
	unsigned width;
	unsigned col;
	const char *sgr; /* in effect, NULL: none */
	unsigned lcol;   /* visible columns on the current legend line */
};

static void put_cell(struct canvas *cv, enum cell k, uint32_t ref)
{
	if (cv->color) {
		const char *s = cell_sgr(k, k == C_SHARED ? shade(ref) : 0);
		if (s != cv->sgr) {
			fputs("\033[0m", cv->f);
			fputs(s, cv->f);
			cv->sgr = s;
		}
	}
	fputc(cell_char(k, ref), cv->f);
	if (++cv->col == cv->width)
		cv->col = 0;
	if (cv->col == 0) {
		if (cv->color && cv->sgr) {
			fputs("\033[0m", cv->f);
			cv->sgr = NULL;
		}
		fputc('\n', cv->f);
	}
}

static void end_rows(struct canvas *cv)
{
	if (cv->color && cv->sgr)
		fputs("\033[0m", cv->f);
	cv->sgr = NULL;
	if (cv->col)
		fputc('\n', cv->f);
	cv->col = 0;
}

/* One legend entry: the cell as drawn (the digits 2-9 and + for shared
 * pages), its name and count; entries wrap at the width. */
static void legend(struct canvas *cv, enum cell k, const char *name, uint64_t n)
{
	char text[96];
	unsigned len = (unsigned)snprintf(text, sizeof(text), " %s %" PRIu64, name, n);
	unsigned cells = k == C_SHARED ? 9 : 1;

	if (cv->lcol && cv->lcol + 2 + cells + len > cv->width) {
		fputc('\n', cv->f);
		cv->lcol = 0;
	}
	fputs("  ", cv->f);
	for (uint32_t r = k == C_SHARED ? 2 : 0; r < (k == C_SHARED ? 11 : 1); r++) {
		if (cv->color)
			fputs(cell_sgr(k, k == C_SHARED ? shade(r) : 0), cv->f);
		fputc(cell_char(k, r), cv->f);
	}
	if (cv->color)
		fputs("\033[0m", cv->f);
	fputs(text, cv->f);
	cv->lcol += 2 + cells + len;
}

static void legend_end(struct canvas *cv)
{
	fputc('\n', cv->f);
	cv->lcol = 0;
}

/* Columns of the terminal (stdout), else $COLUMNS, else 80. */
static unsigned map_width(void)
{
	struct winsize ws;
	const char *e = getenv("COLUMNS");
	uint32_t v;

	if (isatty(STDOUT_FILENO) && ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0)
		return ws.ws_col;
	if (e && parse_u32(e, &v) && v > 0)
		return v;
	return 80;
}

/* Whether to colour: mode 1 always, 0 never, -1 on a terminal unless
 * NO_COLOR is set. */
static bool map_color(int mode)
{
	const char *nc = getenv("NO_COLOR");

	if (mode >= 0)
		return mode > 0;
	return isatty(STDOUT_FILENO) && !(nc && nc[0]);
}

/* Draw one frame from a snapshot. */
static void draw(FILE *f, bool color, unsigned width, const struct kvc_kvmap_info *in, const uint32_t *pages,
		 const struct kvc_kvmap_counts *k, const struct kvc_stats *s)
{
	struct canvas cv = { .f = f, .color = color, .width = width < 8 ? 8 : width };
	char b1[32], b2[32];
	uint64_t unknown = in->n_pages - (uint64_t)k->pages_free - k->pages_private - k->pages_shared - k->pages_cached;

	fmt_bytes(b1, sizeof(b1), (double)in->page_bytes);
	fmt_bytes(b2, sizeof(b2), (double)in->n_pages * (double)in->page_bytes);
	fprintf(f, "KV pool: %" PRIu32 " pages x %s = %s, %" PRIu32 " tokens/page\n", in->n_pages, b1, b2,
		in->block_size);
	fprintf(f, "requests: %" PRIu64 " running, %" PRIu64 " waiting, %" PRIu64 " swapped; %" PRIu64 " sessions\n",
		s->requests_running, s->requests_waiting, s->requests_swapped, s->sessions);
	for (uint32_t i = 0; i < in->n_pages; i++) {
		uint32_t p = pages[i];
		enum cell c = p == KVC_PAGE_FREE ? C_FREE : p == KVC_PAGE_CACHED ? C_CACHED : p == 1 ? C_PRIVATE
			: p >= 2 ? C_SHARED : C_UNKNOWN;
		put_cell(&cv, c, p);
	}
	end_rows(&cv);
	legend(&cv, C_FREE, "free", k->pages_free);
	legend(&cv, C_PRIVATE, "private", k->pages_private);
	legend(&cv, C_SHARED, "shared", k->pages_shared);
	legend(&cv, C_CACHED, "cached", k->pages_cached);
	if (unknown)
		legend(&cv, C_UNKNOWN, "unknown", unknown);
	legend_end(&cv);
	if (k->pages_shared)
		fprintf(f, "  (a shared page's digit: the sequences mapping it, + for 10 or more; most now %" PRIu32 ")\n",
			k->refcount_max);
	if (in->swap_slots == 0) {
		fputs("swap: none\n", f);
		return;
	}
	fmt_bytes(b2, sizeof(b2), (double)in->swap_slots * (double)in->page_bytes);
	fprintf(f, "swap file: %" PRIu32 " pages, %s\n", in->swap_slots, b2);
	/* Slots are not kept in any order worth showing: preempted sequences'
	 * pages first, then demoted prefix pages, then free slots. */
	for (uint32_t i = 0; i < k->pages_swapped - k->pages_demoted; i++)
		put_cell(&cv, C_SWAPPED, 0);
	for (uint32_t i = 0; i < k->pages_demoted; i++)
		put_cell(&cv, C_DEMOTED, 0);
	for (uint32_t i = k->pages_swapped; i < in->swap_slots; i++)
		put_cell(&cv, C_SWAP_FREE, 0);
	end_rows(&cv);
	legend(&cv, C_SWAPPED, "swapped", (uint64_t)k->pages_swapped - k->pages_demoted);
	legend(&cv, C_DEMOTED, "demoted (cached prefix in swap)", k->pages_demoted);
	legend(&cv, C_SWAP_FREE, "free", (uint64_t)in->swap_slots - k->pages_swapped);
	legend_end(&cv);
}

int map_main(kvc_client *c, double watch, int color_mode)
{
	kvc_kvmap *m = NULL;
	uint32_t *pages = NULL;
	bool color = map_color(color_mode), tty = isatty(STDOUT_FILENO);
	int r, status = EXIT_OK;

	r = kvc_kvmap_open(c, &m);
	if (r < 0)
		return fail(c, "stats --map", r);
	pages = malloc((size_t)kvc_kvmap_info(m)->n_pages * sizeof(*pages));
	if (!pages) {
		log_err("stats --map: out of memory");
		kvc_kvmap_close(m);
		return EXIT_FAIL;
	}
	if (watch > 0)
		install_sigint_flag();
	do {
		struct kvc_kvmap_counts k;
		struct kvc_stats s;

		r = kvc_stats(c, &s);
		if (r < 0) {
			if (!g_interrupted)
				status = fail(c, "stats", r);
			break;
		}
		/* -EAGAIN: the pool changed during every try; a busy daemon
		 * settles between steps */
		for (int t = 0; (r = kvc_kvmap_read(m, pages, &k)) == -EAGAIN && t < 100 && !g_interrupted; t++)
			sleep_s(0.01);
		if (r < 0) {
			if (!g_interrupted)
				status = fail(c, "stats --map", r);
			break;
		}
		if (watch > 0 && tty)
			fputs("\033[H\033[2J", stdout);
		else if (watch > 0)
			fputc('\n', stdout);
		draw(stdout, color, map_width(), kvc_kvmap_info(m), pages, &k, &s);
		if (fflush(stdout) != 0) {
			status = EXIT_IO;
			break;
		}
		if (watch > 0)
			sleep_s(watch);
	} while (watch > 0 && !g_interrupted);
	free(pages);
	kvc_kvmap_close(m);
	return status;
}
