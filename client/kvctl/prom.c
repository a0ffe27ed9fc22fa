/*
 * client/kvctl/prom.c — kvctl stats --prometheus: every counter and gauge of
 * the daemon, and its latency histograms, in Prometheus' text exposition
 * format (version 0.0.4), for node_exporter's textfile collector or any
 * scraper that runs a command.
 *
 * Counters are cumulative since the daemon started and end in _total;
 * ratios such as the prefix cache's hit rate are left to the query
 * (rate(kvd_prefix_hit_tokens_total[5m]) / rate(kvd_prefix_query_tokens_total[5m])),
 * so they stay right across scrapes and restarts. Times are in seconds.
 */
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "kvctl.h"

static void metric(FILE *f, const char *name, const char *type, const char *help, uint64_t v)
{
	fprintf(f, "# HELP %s %s\n# TYPE %s %s\n%s %" PRIu64 "\n", name, help, name, type, name, v);
}

#define GAUGE(name, help, v)   metric(f, "kvd_" name, "gauge", help, v)
#define COUNTER(name, help, v) metric(f, "kvd_" name "_total", "counter", help, v)

/* A label value: backslash, double quote and newline escaped. */
static void label_value(FILE *f, const char *s)
{
	for (; *s; s++) {
		if (*s == '\\' || *s == '"')
			fputc('\\', f);
		if (*s == '\n')
			fputs("\\n", f);
		else
			fputc(*s, f);
	}
}

static void histogram(FILE *f, const char *name, const char *help, const struct kvc_histogram *h)
{
	uint64_t cum = 0;

	fprintf(f, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
	for (uint32_t i = 0; i < h->n_bounds; i++) {
		cum += h->bucket[i];
		fprintf(f, "%s_bucket{le=\"%.9g\"} %" PRIu64 "\n", name, (double)h->bound_ns[i] / 1e9, cum);
	}
	cum += h->bucket[h->n_bounds];
	fprintf(f, "%s_bucket{le=\"+Inf\"} %" PRIu64 "\n", name, cum);
	fprintf(f, "%s_sum %.9f\n", name, (double)h->sum_ns / 1e9);
	fprintf(f, "%s_count %" PRIu64 "\n", name, h->count);
}

void prom_print(FILE *f, const struct kvc_stats *s, const struct kvc_histograms *h, const struct kvc_info *i)
{
	char v[32];

	fmt_version(v, sizeof(v), i->server_version);
	fputs("# HELP kvd_info The daemon's version and model (always 1).\n# TYPE kvd_info gauge\n", f);
	fprintf(f, "kvd_info{version=\"%s\",model=\"", v);
	label_value(f, i->model_name);
	fputs("\"} 1\n", f);
	GAUGE("uptime_seconds", "Seconds since the daemon started.", s->uptime_ns / 1000000000u);
	/* the pool */
	GAUGE("pages_total", "KV pages in the pool.", s->pages_total);
	GAUGE("pages_free", "KV pages on the free list.", s->pages_free);
	GAUGE("pages_used", "KV pages mapped by at least one sequence.", s->pages_used);
	GAUGE("pages_shared", "KV pages mapped by two or more sequences (of pages_used).", s->pages_shared);
	GAUGE("pages_cached", "KV pages no sequence uses, kept for prefix reuse.", s->pages_cached);
	GAUGE("pages_swapped", "Pages' worth of KV in the swap file.", s->pages_swapped);
	GAUGE("pages_demoted", "Cached prefix pages kept in the swap file (of pages_swapped).", s->pages_demoted);
	GAUGE("pages_packed", "Packed pages holding released pages' global layers (of pages_used).", s->pages_packed);
	GAUGE("page_bytes", "Bytes of one KV page.", s->page_bytes);
	GAUGE("block_size_tokens", "Tokens one KV page holds.", s->block_size);
	GAUGE("kv_bytes_per_token", "KV bytes one token costs.", s->kv_bytes_per_token);
	GAUGE("pool_bytes", "Size of the KV pool.", s->pool_bytes);
	GAUGE("swap_bytes", "Capacity of the swap file.", s->swap_bytes);
	GAUGE("tokens_resident", "Tokens whose K/V are in the pool.", s->tokens_resident);
	GAUGE("slack_tokens", "Unused token slots in partly filled pages.", s->slack_tokens);
	/* the prefix cache: hits and queries, not a rate */
	COUNTER("prefix_lookups", "Prompts looked up in the prefix cache (session turns included).",
		s->prefix_lookups);
	COUNTER("prefix_query_tokens", "Prompt tokens looked up in the prefix cache (session turns included).",
		s->prefix_query_tokens);
	COUNTER("prefix_hit_tokens", "Prompt tokens found in the prefix cache or a session's kept KV.",
		s->prefix_hit_tokens);
	COUNTER("pages_evicted", "Cached pages dropped from the pool.", s->pages_evicted);
	COUNTER("cow_copies", "Shared pages copied before a write (copy-on-write).", s->cow_copies);
	COUNTER("samples_forked", "Sequences forked from a computed prompt for parallel samples.", s->samples_forked);
	COUNTER("pages_adopted", "Cached prefix pages adopted from the previous run at start.", s->pages_adopted);
	COUNTER("pages_released", "Pages windowed layers were done with, released.", s->pages_released);
	COUNTER("swap_out_pages", "Pages written to the swap file.", s->swap_out_pages);
	COUNTER("swap_in_pages", "Pages read back from the swap file.", s->swap_in_pages);
	COUNTER("swap_errors", "Swap page transfers that failed.", s->swap_errors);
	COUNTER("swap_fallback_recomputes", "Requests whose KV was recomputed after a failed swap.",
		s->swap_fallback_recomputes);
	/* requests */
	GAUGE("requests_running", "Requests in the batch.", s->requests_running);
	GAUGE("requests_waiting", "Requests waiting for admission.", s->requests_waiting);
	GAUGE("requests_swapped", "Requests preempted, waiting to resume.", s->requests_swapped);
	COUNTER("requests_completed", "Requests finished (any way).", s->requests_completed);
	COUNTER("requests_rejected", "Requests refused before they ran.", s->requests_rejected);
	GAUGE("clients", "Connected clients.", s->clients);
	GAUGE("sessions", "Open sessions.", s->sessions);
	COUNTER("prompt_tokens", "Prompt tokens of requests.", s->prompt_tokens_total);
	COUNTER("generated_tokens", "Tokens generated.", s->generated_tokens_total);
	COUNTER("steps", "Scheduler steps run.", s->steps);
	COUNTER("ledger_records_dropped", "Ledger records that could not be written.", s->ledger_records_dropped);
	histogram(f, "kvd_time_to_first_token_seconds", "Request arrival to its first token.", &h->ttft);
	histogram(f, "kvd_inter_token_latency_seconds", "Gap before each token after a request's first.", &h->itl);
}
