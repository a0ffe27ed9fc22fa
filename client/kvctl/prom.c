/*
 * client/kvctl/prom.c — kvctl stats --prometheus: every counter and gauge of
 * the daemon, and its latency histograms, in Prometheus' text exposition
 * format (version 0.0.4), for node_exporter's textfile collector or any
 * scraper that runs a command.
 *
 * The families, their types and help come from client/kvc_metrics.h, the
 * one list kvd-http's /metrics is rendered from too: the two outputs agree
 * family by family (tests/integration/t_metrics_agree.sh).
 */
#include <stdio.h>

#include "kvctl.h"
#include "kvc_metrics.h"

void prom_print(FILE *f, const struct kvc_stats *s, const struct kvc_histograms *h, const struct kvc_info *i)
{
	kvc_metrics_prometheus(f, s, h, i);
}
