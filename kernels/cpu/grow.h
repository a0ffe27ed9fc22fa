/* kernels/cpu/grow.h — grow a scratch array in place, returning -ENOMEM
 * from the calling function when realloc fails (the old block is kept). */
#ifndef KVD_CPU_GROW_H
#define KVD_CPU_GROW_H

#include <errno.h>
#include <stdlib.h>

#define GROW(ptr, n)                                                  \
	do {                                                          \
		void *np_ = realloc((ptr), (size_t)(n) * sizeof(*(ptr))); \
		if (!np_)                                             \
			return -ENOMEM;                               \
		(ptr) = np_;                                          \
	} while (0)

#endif
