/*
 * daemon/log.c — stderr logging with sd-daemon priority prefixes.
 */
#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

int kvd_log_level = KVD_LOG_INFO;

void kvd_log(int prio, const char *fmt, ...)
{
	char line[2048];
	int saved = errno, n, m;
	va_list ap;

	static int tty = -1;

	if (prio > kvd_log_level)
		return;
	if (tty < 0)
		tty = isatty(STDERR_FILENO);
	/* the priority prefix is for journald and log files; a person at a
	 * terminal reads the message alone */
	n = tty ? 0 : snprintf(line, sizeof(line), "<%d>", prio);
	va_start(ap, fmt);
	errno = saved; /* for %m */
	m = vsnprintf(line + n, sizeof(line) - (size_t)n - 1, fmt, ap);
	va_end(ap);
	if (m < 0)
		m = 0;
	n += m;
	if ((size_t)n > sizeof(line) - 2)
		n = (int)sizeof(line) - 2;
	line[n++] = '\n';
	/* one write(): lines from one process never interleave */
	if (write(STDERR_FILENO, line, (size_t)n) < 0) {
		/* nowhere left to report it */
	}
	errno = saved;
}
