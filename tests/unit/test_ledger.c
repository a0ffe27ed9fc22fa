/*
 * tests/unit/test_ledger.c — the per-request ledger file (daemon/ledger.c):
 * whole lines or nothing, cut back after a short write (RLIMIT_FSIZE plays a
 * full disk, in a child process), dropped records counted, no symbolic
 * links or FIFOs followed or opened, reopen after a rename (logrotate),
 * rejection records with the requester's identity and an escaped reason, and
 * the last records kept in memory for kvctl ledger.
 */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <stdbool.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "daemon/ledger.h"
#include "daemon/log.h"
#include "daemon/sched.h"
#include "kvmm/kvmm.h"

struct dir {
	char path[256];
	char file[300];
};

static void dir_new(struct dir *d)
{
	const char *t = getenv("TMPDIR");

	snprintf(d->path, sizeof(d->path), "%s/kvd-test-ledger-XXXXXX", t && *t ? t : "/tmp");
	assert_non_null(mkdtemp(d->path));
	snprintf(d->file, sizeof(d->file), "%s/ledger.jsonl", d->path);
}

static void dir_free(struct dir *d)
{
	char cmd[512];

	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", d->path);
	assert_int_equal(system(cmd), 0);
}

static size_t slurp(const char *path, char *buf, size_t cap)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	ssize_t n;

	if (fd < 0)
		return 0;
	n = read(fd, buf, cap - 1);
	close(fd);
	assert_true(n >= 0);
	buf[n] = 0;
	return (size_t)n;
}

static int setup(void **state)
{
	(void)state;
	kvd_log_level = KVD_LOG_ERR - 1; /* quiet: the warnings are expected */
	return 0;
}

static void test_whole_lines_appended(void **state)
{
	struct dir d;
	struct kvd_ledger *l = NULL;
	char buf[256];

	(void)state;
	dir_new(&d);
	assert_int_equal(kvd_ledger_new(d.file, &l), 0);
	assert_int_equal(kvd_ledger_append(l, "{\"a\":1}\n", 8), 0);
	assert_int_equal(kvd_ledger_append(l, "{\"b\":2}\n", 8), 0);
	/* not one line: refused and counted, nothing written */
	assert_int_equal(kvd_ledger_append(l, "{\"c\":3}", 7), -EINVAL);
	assert_int_equal(kvd_ledger_append(l, "x\ny\n", 4), -EINVAL);
	slurp(d.file, buf, sizeof(buf));
	assert_string_equal(buf, "{\"a\":1}\n{\"b\":2}\n");
	assert_int_equal(kvd_ledger_written(l), 2);
	assert_int_equal(kvd_ledger_dropped(l), 2);
	l = kvd_ledger_free(l);
	/* no path: nothing is written, nothing counted */
	assert_int_equal(kvd_ledger_new("", &l), 0);
	assert_int_equal(kvd_ledger_append(l, "{}\n", 3), -EBADF);
	assert_int_equal(kvd_ledger_dropped(l), 0);
	kvd_ledger_free(l);
	dir_free(&d);
}

/* The child appends under a file size limit that cuts the third record in
 * the middle; exit status = the first failed check (0: all held). */
static int short_write_child(const char *file)
{
	static const char rec1[] = "{\"record\":1,\"pad\":\"aaaaaaaaaaaaaaaaaaaaaaaa\"}\n";
	static const char rec2[] = "{\"record\":2,\"pad\":\"bbbbbbbbbbbbbbbbbbbbbbbb\"}\n";
	static const char rec3[] = "{\"record\":3,\"pad\":\"cccccccccccccccccccccccc\"}\n";
	static const char rec4[] = "{\"record\":4}\n";
	struct kvd_ledger *l = NULL;
	struct rlimit rl;
	struct stat st;
	char buf[1024];
	size_t two = 2 * (sizeof(rec1) - 1);
	int r;

	signal(SIGXFSZ, SIG_IGN);
	if (kvd_ledger_new(file, &l) < 0)
		return 10;
	if (kvd_ledger_append(l, rec1, sizeof(rec1) - 1) || kvd_ledger_append(l, rec2, sizeof(rec2) - 1))
		return 11;
	getrlimit(RLIMIT_FSIZE, &rl);
	rl.rlim_cur = two + 10; /* 10 bytes of the third record fit */
	if (setrlimit(RLIMIT_FSIZE, &rl) < 0)
		return 12;
	r = kvd_ledger_append(l, rec3, sizeof(rec3) - 1);
	if (r != -ENOSPC)
		return 13; /* a short write, reported as ENOSPC */
	if (stat(file, &st) < 0 || (size_t)st.st_size != two)
		return 14; /* the partial record was cut back */
	/* at the limit now: nothing fits, the record is dropped (EFBIG) */
	rl.rlim_cur = two;
	setrlimit(RLIMIT_FSIZE, &rl);
	if (kvd_ledger_append(l, rec4, sizeof(rec4) - 1) != -EFBIG)
		return 15;
	if (kvd_ledger_dropped(l) != 2)
		return 16;
	/* room again: the next record starts on a line of its own */
	rl.rlim_cur = rl.rlim_max;
	setrlimit(RLIMIT_FSIZE, &rl);
	if (kvd_ledger_append(l, rec4, sizeof(rec4) - 1) != 0)
		return 17;
	slurp(file, buf, sizeof(buf));
	if (strncmp(buf, rec1, sizeof(rec1) - 1) || strncmp(buf + sizeof(rec1) - 1, rec2, sizeof(rec2) - 1) ||
	    strcmp(buf + two, rec4))
		return 18;
	kvd_ledger_free(l);
	return 0;
}

static void test_short_write_leaves_no_half_line(void **state)
{
	struct dir d;
	pid_t pid;
	int st;

	(void)state;
	dir_new(&d);
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0)
		_exit(short_write_child(d.file));
	assert_int_equal(waitpid(pid, &st, 0), pid);
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 0);
	dir_free(&d);
}

static void test_symlink_and_fifo_refused(void **state)
{
	struct dir d;
	struct kvd_ledger *l = NULL;
	char target[320], buf[64];

	(void)state;
	dir_new(&d);
	snprintf(target, sizeof(target), "%s/target", d.path);
	close(open(target, O_WRONLY | O_CREAT | O_CLOEXEC, 0644));
	assert_int_equal(symlink(target, d.file), 0);
	assert_int_equal(kvd_ledger_new(d.file, &l), 0); /* logged, not fatal */
	assert_int_equal(kvd_ledger_append(l, "{}\n", 3), -EBADF);
	assert_int_equal(slurp(target, buf, sizeof(buf)), 0);
	/* a reopen at a good path works, one at the link keeps the good file */
	assert_int_equal(unlink(d.file), 0);
	assert_int_equal(kvd_ledger_reopen(l, d.file), 0);
	{
		char link2[320];

		snprintf(link2, sizeof(link2), "%s/link2", d.path);
		assert_int_equal(symlink(target, link2), 0);
		assert_int_equal(kvd_ledger_reopen(l, link2), -ELOOP);
	}
	assert_int_equal(kvd_ledger_append(l, "{}\n", 3), 0);
	slurp(d.file, buf, sizeof(buf));
	assert_string_equal(buf, "{}\n");
	assert_int_equal(slurp(target, buf, sizeof(buf)), 0);
	kvd_ledger_free(l);
	/* a FIFO neither blocks the open nor is used */
	{
		char fifo[320];

		snprintf(fifo, sizeof(fifo), "%s/fifo", d.path);
		assert_int_equal(mkfifo(fifo, 0600), 0);
		assert_int_equal(kvd_ledger_new(fifo, &l), 0);
		assert_int_equal(kvd_ledger_append(l, "{}\n", 3), -EBADF);
		kvd_ledger_free(l);
	}
	dir_free(&d);
}

static void test_reopen_after_rename(void **state)
{
	struct dir d;
	struct kvd_ledger *l = NULL;
	char rotated[320], buf[256];

	(void)state;
	dir_new(&d);
	snprintf(rotated, sizeof(rotated), "%s.1", d.file);
	assert_int_equal(kvd_ledger_new(d.file, &l), 0);
	assert_int_equal(kvd_ledger_append(l, "{\"n\":1}\n", 8), 0);
	assert_int_equal(rename(d.file, rotated), 0);
	assert_int_equal(kvd_ledger_append(l, "{\"n\":2}\n", 8), 0); /* still the old file */
	assert_int_equal(kvd_ledger_reopen(l, d.file), 0);
	assert_int_equal(kvd_ledger_append(l, "{\"n\":3}\n", 8), 0);
	slurp(rotated, buf, sizeof(buf));
	assert_string_equal(buf, "{\"n\":1}\n{\"n\":2}\n");
	slurp(d.file, buf, sizeof(buf));
	assert_string_equal(buf, "{\"n\":3}\n");
	/* "" closes it */
	assert_int_equal(kvd_ledger_reopen(l, ""), 0);
	assert_int_equal(kvd_ledger_append(l, "{\"n\":4}\n", 8), -EBADF);
	kvd_ledger_free(l);
	dir_free(&d);
}

static void test_records_keep_identity_and_reason(void **state)
{
	struct dir d;
	struct kvd_ledger *l = NULL;
	struct kvd_ledger_who who = {.client_id = 42, .pid = 4242, .uid = 1000};
	struct kvd_request_result res = {.finish = KVD_FINISH_CANCELLED, .prompt_tokens = 5};
	char buf[4096], *nl;

	(void)state;
	dir_new(&d);
	assert_int_equal(kvd_ledger_new(d.file, &l), 0);
	kvd_ledger_request(l, &who, 7, 0, "cancelled", &res);
	kvd_ledger_rejected(l, &who, 8, 3, -7, "prompt \"too\" long\nreally");
	slurp(d.file, buf, sizeof(buf));
	nl = strchr(buf, '\n');
	assert_non_null(nl);
	*nl = 0;
	assert_non_null(strstr(buf, "\"client_id\":42,\"pid\":4242,\"uid\":1000,\"request_id\":7,"));
	assert_non_null(strstr(buf, "\"finish\":\"cancelled\""));
	assert_non_null(strstr(buf, "\"kv\":null}"));
	assert_non_null(strstr(nl + 1, "\"client_id\":42,\"pid\":4242,\"uid\":1000,\"request_id\":8,\"session_id\":3,"
				       "\"finish\":\"rejected\",\"error\":-7,"
				       "\"reason\":\"prompt \\\"too\\\" long\\u000areally\"}\n"));
	assert_string_equal(strchr(nl + 1, '\n'), "\n"); /* two lines, no more */
	kvd_ledger_free(l);
	dir_free(&d);
}

/* A served request's record carries the accounting fields in their units:
 * slack in bytes (allocated - useful), KV read per step (mean over its
 * steps, and the most one step read), time waiting for compute, the mean
 * batch width, the policy's window and sinks, tokens evicted by cause; and
 * "model":null when no model was described. */
static void test_record_accounting_fields(void **state)
{
	struct dir d;
	struct kvd_ledger *l = NULL;
	struct kvd_ledger_who who = {.client_id = 1, .pid = 2, .uid = 3};
	struct kvmm_seq_record k = {.kv_bytes_allocated = 3 * 4096, .kv_bytes_useful = 2 * 4096 + 1000,
				    .steps = 4, .kv_read_bytes = 4000, .kv_read_bytes_max_step = 1300,
				    .swap_out_pages = 2, .evicted_prefix_tokens = 9, .evicted_prefix_by = 1000};
	struct kvd_request_result res = {.finish = KVD_FINISH_LENGTH, .prompt_tokens = 5, .generated_tokens = 3,
					 .ledger = &k, .context_policy = 3, .context_window = 64, .context_sinks = 4,
					 .context_dropped_tokens = 17, .compute_wait_ns = 123456, .batch_width_sum = 10,
					 .batch_steps = 4, .recompute_tokens = 21};
	char buf[8192];

	(void)state;
	dir_new(&d);
	assert_int_equal(kvd_ledger_new(d.file, &l), 0);
	kvd_ledger_request(l, &who, 1, 0, "length", &res);
	slurp(d.file, buf, sizeof(buf));
	assert_non_null(strstr(buf, "\"context_policy\":\"sinks\",\"context_window\":64,\"context_sinks\":4,"
				    "\"context_dropped_tokens\":17,"));
	assert_non_null(strstr(buf, "\"compute_wait_ns\":123456,\"batch_width_mean\":2.50,\"slack_bytes\":3096,"
				    "\"decode_read_bytes_mean\":1000,\"decode_read_bytes_max\":1300,"));
	/* no model described: no block size, so swapped pages count 0 tokens */
	assert_non_null(strstr(buf, "\"evicted_tokens\":{\"context_drop\":17,\"swap\":0,\"preemption_recompute\":21,"
				    "\"prefix_eviction\":9,\"prefix_evicted_by\":1000},\"model\":null,\"kv\":{"));
	assert_non_null(strstr(buf, "\"evicted_prefix_tokens\":9}"));
	assert_non_null(strstr(buf, "\"kv_read_bytes\":4000,\"kv_read_bytes_max_step\":1300,"));
	kvd_ledger_free(l);
	dir_free(&d);
}

/* The records kept in memory (kvctl ledger): the same lines as the file,
 * the last KVD_LEDGER_RECENT of them, filtered by uid, oldest first; kept
 * without a file too. */
static void test_recent_records(void **state)
{
	struct dir d;
	struct kvd_ledger *l = NULL, *nofile = NULL;
	struct kvd_request_result res = {.finish = KVD_FINISH_LENGTH, .prompt_tokens = 3, .generated_tokens = 2};
	struct kvd_ledger_rec *out = calloc(KVD_LEDGER_RECENT, sizeof(*out));
	char *file = malloc(1 << 20), *line;
	size_t n, total = KVD_LEDGER_RECENT + 10;

	(void)state;
	assert_non_null(out);
	assert_non_null(file);
	dir_new(&d);
	assert_int_equal(kvd_ledger_new(d.file, &l), 0);
	assert_int_equal(kvd_ledger_recent(l, -1, 0, out), 0);
	/* uid 1000 for every third request, 2000 for the others */
	for (size_t i = 0; i < total; i++) {
		struct kvd_ledger_who who = {.client_id = i, .pid = 1, .uid = i % 3 == 0 ? 1000 : 2000};
		kvd_ledger_request(l, &who, i + 1, 0, "length", &res);
	}
	slurp(d.file, file, 1 << 20);
	/* everyone's: the file's lines in order, less the ten oldest of uid
	 * 2000, which holds the most (each overflow evicts from it) */
	n = kvd_ledger_recent(l, -1, 0, out);
	assert_int_equal(n, KVD_LEDGER_RECENT);
	line = file;
	{
		size_t k = 0, skipped = 0;

		for (size_t i = 0; i < total; i++) {
			char *nl = strchr(line, '\n');
			bool uid2000 = i % 3 != 0;

			if (uid2000 && skipped < total - KVD_LEDGER_RECENT) {
				skipped++;
			} else {
				assert_true(k < n);
				assert_int_equal(out[k].len, nl - line);
				assert_memory_equal(out[k].line, line, out[k].len);
				assert_int_equal(out[k].uid, uid2000 ? 2000 : 1000);
				k++;
			}
			line = nl + 1;
		}
		assert_int_equal(k, n);
	}
	/* one user's last 5, oldest first */
	n = kvd_ledger_recent(l, 1000, 5, out);
	assert_int_equal(n, 5);
	for (size_t i = 0; i < n; i++) {
		char want[64];
		size_t req = (total - 1) / 3 * 3 - (4 - i) * 3 + 1; /* request ids of uid 1000: 1, 4, 7, ... */
		snprintf(want, sizeof(want), "\"uid\":1000,\"request_id\":%zu,", req);
		assert_int_equal(out[i].uid, 1000);
		if (!strstr(out[i].line, want))
			fail_msg("record %zu: %s lacks %s", i, out[i].line, want);
	}
	/* a uid with none, and more asked for than kept */
	assert_int_equal(kvd_ledger_recent(l, 3000, 0, out), 0);
	assert_int_equal(kvd_ledger_recent(l, 1000, 100000, out), (total + 2) / 3);
	assert_int_equal(kvd_ledger_recent(l, 2000, 100000, out), KVD_LEDGER_RECENT - (total + 2) / 3);
	/* without a file the records are still kept */
	assert_int_equal(kvd_ledger_new("", &nofile), 0);
	kvd_ledger_rejected(nofile, &(struct kvd_ledger_who){.client_id = 1, .pid = 2, .uid = 3}, 4, 0, -7, "no");
	assert_int_equal(kvd_ledger_recent(nofile, 3, 0, out), 1);
	assert_non_null(strstr(out[0].line, "\"finish\":\"rejected\""));
	assert_int_equal(kvd_ledger_dropped(nofile), 0);
	kvd_ledger_free(nofile);
	kvd_ledger_free(l);
	free(out);
	free(file);
	dir_free(&d);
}

/* One user's flood pushes out only its own records: another user's last
 * records survive any number of the flooder's. */
static void test_recent_records_per_user(void **state)
{
	struct kvd_ledger *l = NULL;
	struct kvd_request_result res = {.finish = KVD_FINISH_LENGTH, .prompt_tokens = 3, .generated_tokens = 2};
	struct kvd_ledger_rec *out = calloc(KVD_LEDGER_RECENT, sizeof(*out));

	(void)state;
	assert_non_null(out);
	assert_int_equal(kvd_ledger_new("", &l), 0);
	for (size_t i = 0; i < 5; i++)
		kvd_ledger_request(l, &(struct kvd_ledger_who){.client_id = 1, .pid = 1, .uid = 1000}, 100 + i, 0,
				   "length", &res);
	for (size_t i = 0; i < 5 * KVD_LEDGER_RECENT; i++)
		kvd_ledger_request(l, &(struct kvd_ledger_who){.client_id = 2, .pid = 2, .uid = 2000}, 1000 + i, 0,
				   "length", &res);
	assert_int_equal(kvd_ledger_recent(l, 1000, 0, out), 5);
	for (size_t i = 0; i < 5; i++) {
		char want[64];

		snprintf(want, sizeof(want), "\"request_id\":%zu,", 100 + i);
		assert_non_null(strstr(out[i].line, want));
	}
	/* the flooder keeps its newest, in order */
	assert_int_equal(kvd_ledger_recent(l, 2000, 0, out), KVD_LEDGER_RECENT - 5);
	{
		char want[64];

		snprintf(want, sizeof(want), "\"request_id\":%zu,", (size_t)(1000 + 5 * KVD_LEDGER_RECENT - 1));
		assert_non_null(strstr(out[KVD_LEDGER_RECENT - 6].line, want));
	}
	/* everyone's, oldest first: the 5 of uid 1000 come first */
	assert_int_equal(kvd_ledger_recent(l, -1, 0, out), KVD_LEDGER_RECENT);
	assert_int_equal(out[4].uid, 1000);
	assert_int_equal(out[5].uid, 2000);
	kvd_ledger_free(l);
	free(out);
}

/* A ledger file another user owns, or that its group or others may write,
 * is refused (logged; records are kept in memory only). */
static void test_foreign_or_shared_file_refused(void **state)
{
	struct dir d;
	struct kvd_ledger *l = NULL;
	char buf[64];

	(void)state;
	dir_new(&d);
	close(open(d.file, O_WRONLY | O_CREAT | O_CLOEXEC, 0600));
	if (geteuid() == 0) {
		assert_int_equal(chown(d.file, 65534, 65534), 0);
		assert_int_equal(kvd_ledger_new(d.file, &l), 0);
		assert_int_equal(kvd_ledger_append(l, "{}\n", 3), -EBADF);
		kvd_ledger_free(l);
		assert_int_equal(chown(d.file, 0, 0), 0);
	}
	assert_int_equal(chmod(d.file, 0620), 0);
	assert_int_equal(kvd_ledger_new(d.file, &l), 0);
	assert_int_equal(kvd_ledger_append(l, "{}\n", 3), -EBADF);
	assert_int_equal(kvd_ledger_reopen(l, d.file), -EPERM);
	assert_int_equal(chmod(d.file, 0602), 0);
	assert_int_equal(kvd_ledger_reopen(l, d.file), -EPERM);
	assert_int_equal(chmod(d.file, 0640), 0);
	assert_int_equal(kvd_ledger_reopen(l, d.file), 0);
	assert_int_equal(kvd_ledger_append(l, "{}\n", 3), 0);
	slurp(d.file, buf, sizeof(buf));
	assert_string_equal(buf, "{}\n");
	kvd_ledger_free(l);
	dir_free(&d);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_whole_lines_appended),
		cmocka_unit_test(test_short_write_leaves_no_half_line),
		cmocka_unit_test(test_symlink_and_fifo_refused),
		cmocka_unit_test(test_reopen_after_rename),
		cmocka_unit_test(test_records_keep_identity_and_reason),
		cmocka_unit_test(test_record_accounting_fields),
		cmocka_unit_test(test_recent_records),
		cmocka_unit_test(test_recent_records_per_user),
		cmocka_unit_test(test_foreign_or_shared_file_refused),
	};

	return cmocka_run_group_tests(tests, setup, NULL);
}
