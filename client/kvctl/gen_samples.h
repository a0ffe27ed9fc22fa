/*
 * client/kvctl/gen_samples.h — collecting and printing the samples and
 * log-probabilities of `kvctl generate -n N --logprobs K` (gen_samples.c).
 */
#ifndef KVCTL_GEN_SAMPLES_H
#define KVCTL_GEN_SAMPLES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "kvclient.h"

struct gen_sample {
	char *text;
	size_t len, cap;
	int32_t *ids;
	size_t n_ids, cap_ids;
	FILE *lpf;          /* the "logprobs" array's members as JSON text (open_memstream) */
	char *lp;
	size_t lp_len, n_lp;
};

struct gen_samples {
	uint32_t n;
	bool json, logprobs;
	struct gen_sample s[KVC_MAX_SAMPLES];
};

/* 0 or -ENOMEM (then gen_samples_free). */
int gen_samples_init(struct gen_samples *g, uint32_t n, bool json, bool logprobs);
void gen_samples_free(struct gen_samples *g);
/* File one event under its sample. 0, -ENOMEM, -EPROTO (a sample index
 * beyond the request's). */
int gen_samples_event(struct gen_samples *g, const struct kvc_event *ev);
/* The JSON object of `generate --json` (q may be NULL: the request never
 * started; code < 0 adds "error"). */
void gen_samples_print_json(struct gen_samples *g, const kvc_request *q, int code, const char *model);
/* A result's "finish_reason", token counts and timings as JSON members
 * (no leading comma), as `generate --json` prints them. */
void gen_result_json(FILE *f, const struct kvc_result *res);
/* The end of a `generate --json` object: "model" when known, "error" for
 * code < 0 (other than -ECANCELED), the closing brace and a newline. */
void gen_json_close(FILE *f, const struct kvc_result *res, int code, const char *model);
/* Each sample's text; with several, each under a "--- sample I (finish,
 * N tokens) ---" line. 0 or -EIO. */
int gen_samples_print_text(const struct gen_samples *g, const kvc_request *q, bool newline);

#endif
