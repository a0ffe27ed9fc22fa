/*
 * daemon/model/grammar_check.c — the checks every compiled grammar passes
 * before the matcher may run it, and the grammar's reference counting.
 *
 * Nullable rules are found with a worklist (an alternative is nullable once
 * all its items are), so the cost is linear in the grammar's size. A rule
 * reachable at another's start without consuming a byte is an edge; a
 * cycle of such edges is left recursion, which the matcher's expansion
 * could not finish, so it is refused. In the topological order of those
 * edges the number of stacks each rule expands into is bounded, so that no
 * rule can branch into more than KVD_GRAMMAR_MAX_STACKS stacks at once.
 */
#include <errno.h>
#include <stdlib.h>

#include "grammar_impl.h"

/* Nullable rules (worklist: an alternative is nullable once all of its
 * items are), the left-recursion check (rules reachable at a rule's start
 * without consuming a byte must form no cycle) and the expansion bound,
 * in topological order of those edges. */
int gram_check(const struct kvd_grammar *g, uint32_t *ret_rule)
{
	uint32_t nr = g->n_rules, na = g->n_alts;
	uint8_t *nullable = calloc(nr, 1);
	uint32_t *alt_rule = malloc((size_t)na * sizeof(uint32_t));
	uint32_t *alt_left = malloc((size_t)na * sizeof(uint32_t));
	uint32_t *occ_first = calloc((size_t)nr + 1, sizeof(uint32_t));
	uint32_t *occ = malloc((size_t)g->n_elems * sizeof(uint32_t) + 4);
	uint32_t *queue = malloc((size_t)nr * sizeof(uint32_t) + 4);
	uint32_t *edge_first = calloc((size_t)nr + 1, sizeof(uint32_t));
	uint32_t *edges = malloc((size_t)g->n_elems * sizeof(uint32_t) + 4);
	uint32_t *indeg = calloc(nr, sizeof(uint32_t));
	uint32_t *expand = calloc(nr, sizeof(uint32_t));
	int rc = 0;
	if (!nullable || !alt_rule || !alt_left || !occ_first || !occ || !queue || !edge_first || !edges || !indeg ||
	    !expand) {
		rc = -ENOMEM;
		goto out;
	}
	uint32_t qh = 0, qt = 0;
	for (uint32_t r = 0; r < nr; r++)
		for (uint32_t a = g->rule_alt[r]; a < g->rule_alt[r + 1]; a++) {
			alt_rule[a] = r;
			uint32_t left = 0;
			for (const uint32_t *e = g->elems + g->alts[a]; *e != GE_END; e++) {
				if (GE_IS_SET(*e))
					left = UINT32_MAX;
				else if (left != UINT32_MAX)
					left++;
			}
			alt_left[a] = left;
			if (left != UINT32_MAX)
				for (const uint32_t *e = g->elems + g->alts[a]; *e != GE_END; e++)
					occ_first[*e + 1]++;
			if (left == 0 && !nullable[r]) {
				nullable[r] = 1;
				queue[qt++] = r;
			}
		}
	for (uint32_t r = 0; r < nr; r++)
		occ_first[r + 1] += occ_first[r];
	for (uint32_t a = 0; a < na; a++) {
		if (alt_left[a] == UINT32_MAX)
			continue;
		for (const uint32_t *e = g->elems + g->alts[a]; *e != GE_END; e++)
			occ[occ_first[*e]++] = a;
	}
	for (uint32_t r = nr; r > 0; r--)
		occ_first[r] = occ_first[r - 1];
	occ_first[0] = 0;
	while (qh < qt) {
		uint32_t r = queue[qh++];
		for (uint32_t i = occ_first[r]; i < occ_first[r + 1]; i++) {
			uint32_t a = occ[i];
			if (--alt_left[a] == 0 && !nullable[alt_rule[a]]) {
				nullable[alt_rule[a]] = 1;
				queue[qt++] = alt_rule[a];
			}
		}
	}
	/* start edges r -> s */
	for (int pass = 0; pass < 2; pass++) {
		for (uint32_t r = 0; r < nr; r++)
			for (uint32_t a = g->rule_alt[r]; a < g->rule_alt[r + 1]; a++)
				for (const uint32_t *e = g->elems + g->alts[a]; *e != GE_END && !GE_IS_SET(*e); e++) {
					if (pass == 0) {
						edge_first[r + 1]++;
					} else {
						edges[edge_first[r]++] = *e;
						indeg[*e]++;
					}
					if (!nullable[*e])
						break;
				}
		if (pass == 0)
			for (uint32_t r = 0; r < nr; r++)
				edge_first[r + 1] += edge_first[r];
	}
	for (uint32_t r = nr; r > 0; r--)
		edge_first[r] = edge_first[r - 1];
	edge_first[0] = 0;
	/* Kahn: queue holds the topological order (sources first) */
	qh = qt = 0;
	for (uint32_t r = 0; r < nr; r++)
		if (indeg[r] == 0)
			queue[qt++] = r;
	while (qh < qt) {
		uint32_t r = queue[qh++];
		for (uint32_t i = edge_first[r]; i < edge_first[r + 1]; i++)
			if (--indeg[edges[i]] == 0)
				queue[qt++] = edges[i];
	}
	if (qt < nr) {
		for (uint32_t r = 0; r < nr; r++)
			if (indeg[r]) {
				*ret_rule = r;
				rc = -EINVAL;
				goto out;
			}
	}
	/* expansion bound, sinks first */
	for (uint32_t k = nr; k > 0; k--) {
		uint32_t r = queue[k - 1];
		uint64_t sum = 0;
		for (uint32_t a = g->rule_alt[r]; a < g->rule_alt[r + 1]; a++) {
			const uint32_t *e = g->elems + g->alts[a];
			for (;; e++) {
				if (*e == GE_END || GE_IS_SET(*e)) {
					sum++;
					break;
				}
				sum += expand[*e];
				if (!nullable[*e])
					break;
			}
			if (sum > KVD_GRAMMAR_MAX_STACKS)
				break;
		}
		if (sum > KVD_GRAMMAR_MAX_STACKS) {
			*ret_rule = r;
			rc = -E2BIG;
			goto out;
		}
		expand[r] = (uint32_t)sum;
	}
out:
	free(nullable);
	free(alt_rule);
	free(alt_left);
	free(occ_first);
	free(occ);
	free(queue);
	free(edge_first);
	free(edges);
	free(indeg);
	free(expand);
	return rc;
}

static void grammar_destroy(struct kvd_grammar *g)
{
	if (!g)
		return;
	free(g->rule_alt);
	free(g->alts);
	free(g->elems);
	free(g->sets);
	free(g);
}

struct kvd_grammar *kvd_grammar_ref(struct kvd_grammar *g)
{
	atomic_fetch_add_explicit(&g->refs, 1, memory_order_relaxed);
	return g;
}

struct kvd_grammar *kvd_grammar_unref(struct kvd_grammar *g)
{
	/* acq_rel: the last dropper sees every other holder's accesses done */
	if (g && atomic_fetch_sub_explicit(&g->refs, 1, memory_order_acq_rel) == 1)
		grammar_destroy(g);
	return NULL;
}

size_t kvd_grammar_bytes(const struct kvd_grammar *g)
{
	return g->bytes;
}

uint32_t kvd_grammar_n_rules(const struct kvd_grammar *g)
{
	return g->n_rules;
}

