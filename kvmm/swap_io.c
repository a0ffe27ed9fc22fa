/*
 * kvmm/swap_io.c — the swap stores behind struct kvmm_swap_io:
 *
 *  - the io_uring file store kvd uses: a preallocated file, O_DIRECT where
 *    the file system takes it, up to KVMM_SWAP_QUEUE_DEPTH page transfers in
 *    flight, the file and (memlock permitting) kvmm's buffers registered;
 *  - a memory store, for tests and for measuring kvmm without a disk;
 *  - a fault layer that wraps another store and, once armed, fails chosen
 *    transfers with an errno or makes them short, after a countdown (the
 *    idea of SQLite's test_vfs), so tests reach every error path.
 *
 * Stores are not thread safe; kvmm calls them from its owner thread.
 */
#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kvmm.h"

#define DIRECT_ALIGN 4096u

/* ---- io_uring file store ------------------------------------------------------------ */

struct uring_store {
	struct kvmm_swap_io io; /* first: kvmm sees only this */
	struct io_uring ring;
	bool ring_ok;
	int fd;
	bool fixed_file;
	bool fixed_bufs;
};

static int uring_rw(struct kvmm_swap_io *io, struct kvmm_io_req *reqs, uint32_t n)
{
	struct uring_store *u = (struct uring_store *)io;
	uint32_t next = 0, done = 0, inflight = 0;

	while (done < n) {
		struct io_uring_cqe *cqe;
		unsigned head, seen = 0;
		int r;

		while (next < n && inflight < KVMM_SWAP_QUEUE_DEPTH) {
			struct io_uring_sqe *sqe = io_uring_get_sqe(&u->ring);
			struct kvmm_io_req *q = &reqs[next];
			int fd = u->fixed_file ? 0 : u->fd;

			if (!sqe)
				break;
			if (u->fixed_bufs && q->buf_index >= 0) {
				if (q->op == KVMM_IO_WRITE)
					io_uring_prep_write_fixed(sqe, fd, q->buf, (unsigned)q->len, q->offset,
								  q->buf_index);
				else
					io_uring_prep_read_fixed(sqe, fd, q->buf, (unsigned)q->len, q->offset,
								 q->buf_index);
			} else if (q->op == KVMM_IO_WRITE) {
				io_uring_prep_write(sqe, fd, q->buf, (unsigned)q->len, q->offset);
			} else {
				io_uring_prep_read(sqe, fd, q->buf, (unsigned)q->len, q->offset);
			}
			if (u->fixed_file)
				sqe->flags |= IOSQE_FIXED_FILE;
			io_uring_sqe_set_data64(sqe, next);
			next++;
			inflight++;
		}
		r = io_uring_submit_and_wait(&u->ring, 1);
		if (r < 0 && r != -EINTR && r != -EAGAIN && r != -EBUSY) {
			for (uint32_t i = 0; i < n; i++)
				reqs[i].result = r;
			return r;
		}
		io_uring_for_each_cqe(&u->ring, head, cqe) {
			uint64_t idx = io_uring_cqe_get_data64(cqe);

			if (idx < n)
				reqs[idx].result = cqe->res;
			seen++;
		}
		io_uring_cq_advance(&u->ring, seen);
		done += seen;
		inflight -= seen;
	}
	return 0;
}

static int uring_register(struct kvmm_swap_io *io, const struct iovec *iov, uint32_t n)
{
	struct uring_store *u = (struct uring_store *)io;
	int r;

	if (u->fixed_bufs)
		return -EBUSY;
	r = io_uring_register_buffers(&u->ring, iov, n);
	if (r < 0)
		return r;
	u->fixed_bufs = true;
	u->io.flags |= KVMM_SWAP_FIXEDBUFS;
	return 0;
}

static void uring_destroy(struct kvmm_swap_io *io)
{
	struct uring_store *u = (struct uring_store *)io;

	if (u->ring_ok)
		io_uring_queue_exit(&u->ring);
	if (u->fd >= 0)
		close(u->fd);
	free(u);
}

static const struct kvmm_swap_io_ops uring_ops = {
	.version = KVMM_SWAP_IO_VERSION,
	.name = "io_uring",
	.rw = uring_rw,
	.register_buffers = uring_register,
	.destroy = uring_destroy,
};

/* Some file systems accept O_DIRECT at open and refuse it at the first
 * transfer; one aligned write and read of the first block tells. */
static bool direct_works(int fd)
{
	void *b = aligned_alloc(DIRECT_ALIGN, DIRECT_ALIGN);
	bool ok;

	if (!b)
		return false;
	memset(b, 0, DIRECT_ALIGN);
	ok = pwrite(fd, b, DIRECT_ALIGN, 0) == DIRECT_ALIGN && pread(fd, b, DIRECT_ALIGN, 0) == DIRECT_ALIGN;
	free(b);
	return ok;
}

/* Create the swap file at path, which must not exist: O_EXCL makes the
 * kernel refuse any existing entry, a symbolic link (even a dangling one)
 * included, so no file is ever opened, truncated or unlinked that kvd did not
 * create in this call. O_DIRECT is switched on later (fcntl), so that a file
 * system refusing it cannot leave a created file behind a failed open. */
static int create_exclusive(const char *path, struct stat *ret_st)
{
	int fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);

	if (fd < 0)
		return -errno;
	if (fstat(fd, ret_st) < 0) {
		int r = -errno;

		close(fd);
		(void)unlink(path);
		return r;
	}
	return fd;
}

/* Unlink path only while it still names the file we created (same device
 * and inode): never someone else's file put there meanwhile. */
static void unlink_if_ours(const char *path, const struct stat *ours)
{
	struct stat st;

	if (lstat(path, &st) == 0 && st.st_dev == ours->st_dev && st.st_ino == ours->st_ino)
		(void)unlink(path);
}

int kvmm_swap_io_file_open(const char *path, uint64_t bytes, uint32_t flags, struct kvmm_swap_io **ret,
			   int *ret_failed_step)
{
	struct uring_store *u;
	bool direct = !(flags & KVMM_SWAP_OPEN_NO_DIRECT), linked = false;
	struct stat st;
	int r, step = KVMM_SWAP_STEP_ARGS;

	if (!path || !*path || bytes == 0) {
		r = -EINVAL;
		goto out;
	}
	if (direct) {
		bytes = bytes / DIRECT_ALIGN * DIRECT_ALIGN;
		if (bytes == 0) {
			r = -EINVAL;
			goto out;
		}
	}
	u = calloc(1, sizeof(*u));
	if (!u) {
		r = -ENOMEM;
		goto out;
	}
	u->io.ops = &uring_ops;
	step = KVMM_SWAP_STEP_CREATE;
	u->fd = create_exclusive(path, &st);
	if (u->fd < 0) {
		r = u->fd;
		u->fd = -1;
		goto fail;
	}
	linked = true;
	if (flags & KVMM_SWAP_OPEN_UNLINK) {
		/* Anonymous from here on: a crash cannot leave it behind. */
		unlink_if_ours(path, &st);
		linked = false;
	}
	step = KVMM_SWAP_STEP_PREALLOCATE;
	if (fallocate(u->fd, 0, 0, (off_t)bytes) < 0) {
		if (errno != EOPNOTSUPP && errno != ENOSYS) {
			r = -errno;
			goto fail;
		}
		if (ftruncate(u->fd, (off_t)bytes) < 0) {
			r = -errno;
			goto fail;
		}
	}
	step = KVMM_SWAP_STEP_RING;
	if (direct) {
		int fl = fcntl(u->fd, F_GETFL);

		if (fl < 0 || fcntl(u->fd, F_SETFL, fl | O_DIRECT) < 0 || !direct_works(u->fd)) {
			direct = false;
			if (fl >= 0 && fcntl(u->fd, F_SETFL, fl & ~O_DIRECT) < 0) {
				r = -errno;
				goto fail;
			}
		}
	}
	r = io_uring_queue_init(KVMM_SWAP_QUEUE_DEPTH, &u->ring, 0);
	if (r < 0)
		goto fail;
	u->ring_ok = true;
	u->fixed_file = io_uring_register_files(&u->ring, &u->fd, 1) == 0;
	u->io.size_bytes = bytes;
	u->io.align = direct ? DIRECT_ALIGN : 1;
	u->io.flags = direct ? KVMM_SWAP_DIRECT : 0;
	*ret = &u->io;
	return 0;
fail:
	if (linked)
		unlink_if_ours(path, &st);
	uring_destroy(&u->io);
out:
	if (ret_failed_step)
		*ret_failed_step = step;
	return r;
}

int kvmm_swap_io_uring_open(const char *path, uint64_t bytes, uint32_t flags, struct kvmm_swap_io **ret)
{
	return kvmm_swap_io_file_open(path, bytes, flags, ret, NULL);
}

/* ---- memory store ------------------------------------------------------------------------ */

struct mem_store {
	struct kvmm_swap_io io;
	char *data;
};

static int mem_rw(struct kvmm_swap_io *io, struct kvmm_io_req *reqs, uint32_t n)
{
	struct mem_store *s = (struct mem_store *)io;

	for (uint32_t i = 0; i < n; i++) {
		struct kvmm_io_req *q = &reqs[i];

		if (q->offset > io->size_bytes || q->len > io->size_bytes - q->offset) {
			q->result = -EINVAL;
			continue;
		}
		if (q->op == KVMM_IO_WRITE)
			memcpy(s->data + q->offset, q->buf, q->len);
		else
			memcpy(q->buf, s->data + q->offset, q->len);
		q->result = (int64_t)q->len;
	}
	return 0;
}

static void mem_destroy(struct kvmm_swap_io *io)
{
	struct mem_store *s = (struct mem_store *)io;

	if (s->data)
		munmap(s->data, io->size_bytes);
	free(s);
}

static const struct kvmm_swap_io_ops mem_ops = {
	.version = KVMM_SWAP_IO_VERSION,
	.name = "memory",
	.rw = mem_rw,
	.destroy = mem_destroy,
};

int kvmm_swap_io_mem_new(uint64_t bytes, struct kvmm_swap_io **ret)
{
	struct mem_store *s;

	if (bytes == 0)
		return -EINVAL;
	s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->data = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (s->data == MAP_FAILED) {
		free(s);
		return -ENOMEM;
	}
	s->io = (struct kvmm_swap_io){.ops = &mem_ops, .size_bytes = bytes, .align = 1};
	*ret = &s->io;
	return 0;
}

/* ---- fault layer -------------------------------------------------------------------------- */

struct fault_store {
	struct kvmm_swap_io io;
	struct kvmm_swap_io *inner;
	bool armed;
	struct kvmm_io_fault f;
	uint64_t seen;     /* matching requests since armed */
	uint32_t failed;   /* faults injected since armed */
	uint64_t injected; /* faults injected in total */
	struct kvmm_io_req *tmp;
	uint32_t *map;
	uint32_t cap;
};

enum { F_PASS, F_ERR, F_SHORT };

static int fault_decide(struct fault_store *s, const struct kvmm_io_req *q)
{
	uint32_t mask = s->f.ops_mask ? s->f.ops_mask : (1u << KVMM_IO_READ) | (1u << KVMM_IO_WRITE);

	if (!s->armed || !(mask & (1u << q->op)))
		return F_PASS;
	if (s->seen++ < s->f.after)
		return F_PASS;
	if (s->f.count && s->failed >= s->f.count)
		return F_PASS;
	s->failed++;
	s->injected++;
	return s->f.error == KVMM_IO_FAULT_SHORT ? F_SHORT : F_ERR;
}

static int fault_rw(struct kvmm_swap_io *io, struct kvmm_io_req *reqs, uint32_t n)
{
	struct fault_store *s = (struct fault_store *)io;
	uint8_t what[256];

	/* In slices of 256 so the decisions fit on the stack. */
	for (uint32_t base = 0; base < n; base += 256) {
		uint32_t cnt = n - base < 256 ? n - base : 256, nq = 0;
		int r;

		if (s->cap < cnt) {
			struct kvmm_io_req *t = realloc(s->tmp, cnt * sizeof(*t));
			uint32_t *mp;

			if (!t)
				return -ENOMEM;
			s->tmp = t;
			mp = realloc(s->map, cnt * sizeof(*mp));
			if (!mp)
				return -ENOMEM;
			s->map = mp;
			s->cap = cnt;
		}
		for (uint32_t i = 0; i < cnt; i++) {
			struct kvmm_io_req *q = &reqs[base + i];

			what[i] = (uint8_t)fault_decide(s, q);
			/* A failing write never reaches the store; a failing
			 * read does, and its buffer is scribbled over after. */
			if (what[i] == F_ERR && q->op == KVMM_IO_WRITE) {
				q->result = s->f.error;
				continue;
			}
			s->tmp[nq] = *q;
			if (what[i] == F_SHORT) {
				size_t half = q->len / 2 / s->inner->align * s->inner->align;

				s->tmp[nq].len = half;
			}
			s->map[nq++] = i;
		}
		r = nq ? s->inner->ops->rw(s->inner, s->tmp, nq) : 0;
		for (uint32_t k = 0; k < nq; k++) {
			struct kvmm_io_req *q = &reqs[base + s->map[k]];

			q->result = r < 0 ? r : s->tmp[k].result;
			if (what[s->map[k]] == F_ERR) {
				q->result = s->f.error;
				if (q->op == KVMM_IO_READ)
					memset(q->buf, 0xa5, q->len);
			} else if (what[s->map[k]] == F_SHORT && q->op == KVMM_IO_READ && q->result >= 0) {
				memset((char *)q->buf + q->result, 0xa5, q->len - (size_t)q->result);
			}
		}
	}
	return 0;
}

static int fault_register(struct kvmm_swap_io *io, const struct iovec *iov, uint32_t n)
{
	struct fault_store *s = (struct fault_store *)io;
	int r;

	if (!s->inner->ops->register_buffers)
		return -EOPNOTSUPP;
	r = s->inner->ops->register_buffers(s->inner, iov, n);
	s->io.flags = s->inner->flags;
	return r;
}

static void fault_destroy(struct kvmm_swap_io *io)
{
	struct fault_store *s = (struct fault_store *)io;

	kvmm_swap_io_free(s->inner);
	free(s->tmp);
	free(s->map);
	free(s);
}

static const struct kvmm_swap_io_ops fault_ops = {
	.version = KVMM_SWAP_IO_VERSION,
	.name = "fault",
	.rw = fault_rw,
	.register_buffers = fault_register,
	.destroy = fault_destroy,
};

int kvmm_swap_io_fault_new(struct kvmm_swap_io *inner, struct kvmm_swap_io **ret)
{
	struct fault_store *s;

	if (!inner)
		return -EINVAL;
	s = calloc(1, sizeof(*s));
	if (!s) {
		kvmm_swap_io_free(inner);
		return -ENOMEM;
	}
	s->inner = inner;
	s->io = (struct kvmm_swap_io){
		.ops = &fault_ops, .size_bytes = inner->size_bytes, .align = inner->align, .flags = inner->flags,
	};
	*ret = &s->io;
	return 0;
}

int kvmm_swap_io_fault_arm(struct kvmm_swap_io *io, const struct kvmm_io_fault *f)
{
	struct fault_store *s = (struct fault_store *)io;

	if (!io || io->ops != &fault_ops)
		return -EINVAL;
	if (f && f->error >= 0 && f->error != KVMM_IO_FAULT_SHORT)
		return -EINVAL;
	s->armed = f != NULL;
	if (f)
		s->f = *f;
	s->seen = 0;
	s->failed = 0;
	return 0;
}

uint64_t kvmm_swap_io_fault_count(const struct kvmm_swap_io *io)
{
	if (!io || io->ops != &fault_ops)
		return 0;
	return ((const struct fault_store *)io)->injected;
}

struct kvmm_swap_io *kvmm_swap_io_free(struct kvmm_swap_io *io)
{
	if (io)
		io->ops->destroy(io);
	return NULL;
}
