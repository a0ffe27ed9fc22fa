# kvd — top-level build.
#
# Every subsystem folder is compiled into its own static archive from the
# .c files it holds, so adding a source file needs no edit here:
#
#   kvmm/*.c            -> build/libkvmm.a
#   ipc/*.c             -> build/libipc.a
#   kernels/*.c, kernels/cpu/*.c -> build/libkernels.a
#   daemon/*.c (except main.c), daemon/model/*.c -> build/libkvdcore.a
#   client/*.c          -> build/libkvclient.{a,so}
#   daemon/main.c       -> build/bin/kvd
#   client/kvctl/*.c    -> build/bin/kvctl (one file per command family)
#   tests/unit/test_*.c -> build/tests/test_*   (cmocka, one per module)
#   tests/tools/*.c     -> build/tests/<name>   (drivers used by scripted tests)
#   bench/*.c           -> build/bench/<name>
#
# The CUDA plug-in (kernels/cuda) is built when nvcc is found.

CC      ?= gcc
PREFIX  ?= /usr/local
DESTDIR ?=
BUILD   ?= build
NVCC    ?= $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
CUDA_HOME ?= /usr/local/cuda

PKGS    := liburing libsystemd inih
PKG_CFLAGS := $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
PKG_LIBS   := $(shell pkg-config --libs $(PKGS) 2>/dev/null)
CMOCKA_LIBS := $(shell pkg-config --libs cmocka 2>/dev/null)

WARN    := -Wall -Wextra -Werror -Wshadow -Wno-unused-parameter -Wstrict-prototypes
OPT     ?= -O2 -g
SAN     ?=
CFLAGS_ALL = -std=c11 -D_GNU_SOURCE $(OPT) $(SAN) $(WARN) -fPIC -pthread \
              $(INC) $(PKG_CFLAGS) $(EXTRA_CFLAGS)
LDFLAGS_ALL := $(SAN) -pthread $(EXTRA_LDFLAGS)
LIBS_ALL := $(PKG_LIBS) -lm -ldl

KVMM_SRC    := $(wildcard kvmm/*.c)
IPC_SRC     := $(wildcard ipc/*.c)
KERNELS_SRC := $(wildcard kernels/*.c kernels/cpu/*.c)
CORE_SRC    := $(filter-out daemon/main.c,$(wildcard daemon/*.c daemon/model/*.c))
CLIENT_SRC  := $(wildcard client/*.c)
KVCTL_SRC   := $(wildcard client/kvctl/*.c)
TEST_SRC    := $(wildcard tests/unit/test_*.c)
TOOL_SRC    := $(wildcard tests/tools/*.c)
BENCH_SRC   := $(wildcard bench/*.c)
FUZZ_SRC    := $(wildcard tests/fuzz/fuzz_*.c)
CUDA_SRC    := $(wildcard kernels/cuda/*.cu)
EXAMPLE_SRC := $(wildcard client/examples/*.c)

# Layering: each folder is compiled seeing only the folders it may use
# (DESIGN.md's table; a quoted include finds its own folder first), through
# -iquote so no folder's header can shadow a system one (daemon/sched.h and
# <sched.h>). tests/checks/t_layering.sh checks the include lines
# themselves, so a relative path cannot get round it. Tests, tools, benches
# and fuzz targets see everything.
INC_ALL := -iquote . -iquote kernels -iquote kvmm -iquote ipc -iquote daemon/model -iquote client
INC := $(INC_ALL)
$(BUILD)/obj/kvmm/%.o: INC :=
$(BUILD)/obj/ipc/%.o: INC :=
$(BUILD)/obj/kernels/%.o: INC := -iquote kernels
$(BUILD)/obj/daemon/%.o: INC := -iquote daemon/model -iquote kernels -iquote kvmm -iquote ipc
$(BUILD)/obj/daemon/model/%.o: INC := -iquote kernels
$(BUILD)/obj/client/%.o: INC := -iquote ipc
$(BUILD)/obj/client/kvctl/%.o: INC := -iquote client
# kvctl chat reads its JSON conversation with jansson (the library kvd-http
# uses) when pkg-config finds it; without it kvctl still builds and the
# command says what is missing.
KVCTL_JSON := $(shell pkg-config --exists jansson 2>/dev/null && echo y)
KVCTL_JSON_CFLAGS := $(if $(KVCTL_JSON),-DKVCTL_HAVE_JANSSON $(shell pkg-config --cflags jansson))
KVCTL_JSON_LIBS := $(if $(KVCTL_JSON),$(shell pkg-config --libs jansson))
$(BUILD)/obj/client/kvctl/chat.o: INC := -iquote client $(KVCTL_JSON_CFLAGS)

obj = $(patsubst %.c,$(BUILD)/obj/%.o,$(1))

LIBKVMM    := $(BUILD)/libkvmm.a
LIBIPC     := $(BUILD)/libipc.a
# KERNELS_FROM: a libkernels.a built elsewhere, used as it is (the fuzz
# build links the main build's)
ifdef KERNELS_FROM
LIBKERNELS := $(KERNELS_FROM)
else
LIBKERNELS := $(BUILD)/libkernels.a
endif
LIBCORE    := $(BUILD)/libkvdcore.a
LIBCLIENT_A  := $(BUILD)/libkvclient.a
LIBCLIENT_SO := $(BUILD)/libkvclient.so
KVCLIENT_SOVERSION := 0
CORE_LIBS  := $(LIBCORE) $(LIBKERNELS) $(LIBKVMM) $(LIBIPC)

TESTS  := $(patsubst tests/unit/%.c,$(BUILD)/tests/%,$(TEST_SRC))
TOOLS  := $(patsubst tests/tools/%.c,$(BUILD)/tests/%,$(TOOL_SRC))
BENCHES := $(patsubst bench/%.c,$(BUILD)/bench/%,$(BENCH_SRC))
EXAMPLES := $(if $(CLIENT_SRC),$(patsubst client/examples/%.c,$(BUILD)/examples/%,$(EXAMPLE_SRC)))
BINS   := $(if $(wildcard daemon/main.c),$(BUILD)/bin/kvd) $(if $(KVCTL_SRC),$(BUILD)/bin/kvctl)
# kvd built again with -DKVD_FAULT_INJECTION: honours KVD_TEST_SWAP_FAULT and
# KVD_TEST_FAULTS (tests only; bin/kvd reads neither)
FAULTY := $(if $(wildcard daemon/main.c),$(BUILD)/tests/kvd-faulty)
CLIENT_LIBS := $(if $(CLIENT_SRC),$(LIBCLIENT_A) $(LIBCLIENT_SO) $(if $(wildcard client/kvclient.pc.in),$(BUILD)/kvclient-uninstalled.pc))
CUDA_PLUGIN := $(if $(and $(NVCC),$(CUDA_SRC)),$(BUILD)/lib/libkvd-cuda.so)

.PHONY: all test run stop install clean bench bench-shapes setup asan fuzz
# keep object files of test, tool and bench programs between builds
.SECONDARY:
all: $(BINS) $(FAULTY) $(CLIENT_LIBS) $(TESTS) $(TOOLS) $(BENCHES) $(EXAMPLES) $(CUDA_PLUGIN)

$(BUILD)/obj/%.o: %.c Makefile
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -MMD -MP -c $< -o $@

-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null)

$(LIBCORE): $(call obj,$(CORE_SRC))
$(BUILD)/lib%.a:
	@mkdir -p $(dir $@)
	rm -f $@ && $(if $^,ar rcs $@ $^,printf '!<arch>\n' > $@)

# These archives export only their public prefix: their objects are linked
# into one relocatable object whose other global symbols are made local, so
# an internal name (page_alloc, lru_push, tp_run, …) cannot clash with a program
# that links the library. tests/checks/t_layering.sh checks the result.
# $(call export-only,object files,symbol patterns)
define export-only
	@mkdir -p $(dir $@)
	ld -r -o $@.o $(filter %.o,$(1))
	objcopy --wildcard $(foreach p,$(2),--keep-global-symbol='$(p)') $@.o
	rm -f $@ && ar rcs $@ $@.o && rm -f $@.o
endef
$(LIBKVMM): $(call obj,$(KVMM_SRC)) Makefile
	$(call export-only,$^,kvmm_*)
# the backend table and kvd_wtype_name (kvd_), and the CPU kernels' entry
# points the kernel tests and benchmarks call (cpu_)
ifndef KERNELS_FROM
$(LIBKERNELS): $(call obj,$(KERNELS_SRC)) Makefile
	$(call export-only,$^,kvd_* cpu_*)
endif
$(LIBIPC): $(call obj,$(IPC_SRC)) Makefile
	$(call export-only,$^,ipc_*)
$(LIBCLIENT_A): $(call obj,$(CLIENT_SRC)) $(call obj,$(IPC_SRC)) Makefile
	$(call export-only,$^,kvc_* kv_strerror)

# The shared client library exports only KVC_EXPORT symbols.
$(LIBCLIENT_SO): $(call obj,$(CLIENT_SRC)) $(call obj,$(IPC_SRC))
	$(CC) -shared -Wl,-soname,libkvclient.so.$(KVCLIENT_SOVERSION) $(LDFLAGS_ALL) -o $@ $^ -lm
	ln -sf libkvclient.so $(BUILD)/libkvclient.so.$(KVCLIENT_SOVERSION)

# Examples are built as a user would build them: the public header and the
# shared library only.
$(BUILD)/examples/%: client/examples/%.c client/kvclient.h $(LIBCLIENT_SO)
	@mkdir -p $(dir $@)
	$(CC) -std=c11 $(OPT) $(SAN) $(WARN) -Iclient -o $@ $< -L$(BUILD) -l:libkvclient.so -Wl,-rpath,'$$ORIGIN/..'

# kvclient.pc: written by `make install`, for the PREFIX given then (a plain
# `make` followed by `make install PREFIX=/opt/kvd` must say /opt/kvd).
# kvclient-uninstalled.pc: for programs built against this build tree
# before installing (PKG_CONFIG_PATH=$PWD/build pkg-config kvclient; pkg-config
# prefers NAME-uninstalled.pc), with an rpath to build/.
PC_SED = sed -e 's|@PREFIX@|$(1)|g' -e 's|@LIBDIR@|$(2)|g' -e 's|@INCLUDEDIR@|$(3)|g' -e 's|@EXTRA_LIBS@|$(4)|g'
$(BUILD)/kvclient-uninstalled.pc: client/kvclient.pc.in Makefile
	$(call PC_SED,$(abspath .),$(abspath $(BUILD)),$(abspath client), -Wl$(,)-rpath$(,)$${libdir}) $< > $@
, := ,

$(BUILD)/bin/kvd: $(call obj,daemon/main.c) $(CORE_LIBS)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS_ALL) -o $@ $^ $(LIBS_ALL)

$(BUILD)/obj/daemon/main-faulty.o: daemon/main.c Makefile
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -DKVD_FAULT_INJECTION -MMD -MP -c $< -o $@

$(BUILD)/tests/kvd-faulty: $(BUILD)/obj/daemon/main-faulty.o $(CORE_LIBS)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS_ALL) -o $@ $^ $(LIBS_ALL)

$(BUILD)/bin/kvctl: $(call obj,$(KVCTL_SRC)) $(LIBCLIENT_A)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS_ALL) -o $@ $^ $(KVCTL_JSON_LIBS) -lm

# kvd-http, the OpenAI-compatible HTTP gateway: built on libkvclient only
# (its sources see client/kvclient.h and system headers), with libmicrohttpd,
# jansson, inih and libsystemd from Debian. Built when its libraries are there.
HTTP_SRC  := $(wildcard client/http/*.c)
HTTP_PKGS := libmicrohttpd jansson inih libsystemd
HTTP_OK   := $(if $(HTTP_SRC),$(shell pkg-config --exists $(HTTP_PKGS) 2>/dev/null && echo y))
HTTP_BIN  := $(if $(HTTP_OK),$(BUILD)/bin/kvd-http)
all: $(HTTP_BIN)
$(BUILD)/obj/client/http/%.o: client/http/%.c
	@mkdir -p $(dir $@)
	$(CC) -std=c11 -D_GNU_SOURCE $(OPT) $(SAN) $(WARN) -pthread -iquote client $(shell pkg-config --cflags $(HTTP_PKGS) 2>/dev/null) $(EXTRA_CFLAGS) -MMD -MP -c $< -o $@
$(BUILD)/bin/kvd-http: $(call obj,$(HTTP_SRC)) $(LIBCLIENT_A)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS_ALL) -o $@ $^ $(shell pkg-config --libs $(HTTP_PKGS) 2>/dev/null) -lm
install: install-http
.PHONY: install-http
install-http: $(HTTP_BIN)
	$(if $(HTTP_BIN),install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)/etc/kvd && \
	    install -m 0755 $(HTTP_BIN) $(DESTDIR)$(PREFIX)/bin/ && \
	    install -m 0644 etc/kvd-http.conf $(DESTDIR)/etc/kvd/kvd-http.conf)

$(BUILD)/tests/%: $(BUILD)/obj/tests/unit/%.o $(CORE_LIBS) $(if $(CLIENT_SRC),$(LIBCLIENT_A))
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS_ALL) -o $@ $^ $(CMOCKA_LIBS) $(LIBS_ALL)

$(BUILD)/tests/%: $(BUILD)/obj/tests/tools/%.o $(CORE_LIBS) $(if $(CLIENT_SRC),$(LIBCLIENT_A))
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS_ALL) -o $@ $^ $(LIBS_ALL)

$(BUILD)/bench/%: $(BUILD)/obj/bench/%.o $(CORE_LIBS) $(if $(CLIENT_SRC),$(LIBCLIENT_A))
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS_ALL) -o $@ $^ $(LIBS_ALL)

# CUDA plug-in: sm_80 and sm_90 cubins plus sm_90 PTX; kvd dlopen()s it.
NVCC_FLAGS := -O2 -std=c++17 -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 \
              -gencode arch=compute_90,code=compute_90 -Xcompiler -fPIC,-Wall,-Werror -Ikernels
$(BUILD)/obj/%.cu.o: %.cu kernels/backend.h kernels/program.h $(wildcard kernels/cuda/*.h) Makefile
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCC_FLAGS) -c $< -o $@
# the forward program's builder (kernels/program.c) is linked in, hidden
$(BUILD)/lib/libkvd-cuda.so: $(patsubst %.cu,$(BUILD)/obj/%.cu.o,$(CUDA_SRC)) $(BUILD)/obj/kernels/program.o
	@mkdir -p $(dir $@)
	$(NVCC) -shared -o $@ $^ -L$(CUDA_HOME)/lib64 -Xlinker -rpath,$(CUDA_HOME)/lib64 -lcublas -lcudart

# kvd-docgen prints documentation from the tables the programs run on
# (kvd.conf(5) from daemon/config.c's keys, the metric table from
# client/kvc_metrics.h); `make man` regenerates man/ with it and the help
# texts (scripts/gen-man), tests/checks/t_docs.sh checks man/ is current.
DOCGEN := $(if $(wildcard scripts/kvd_docgen.c),$(BUILD)/scripts/kvd-docgen)
all: $(DOCGEN)
$(BUILD)/scripts/kvd-docgen: $(BUILD)/obj/scripts/kvd_docgen.o $(CORE_LIBS)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS_ALL) -o $@ $^ $(LIBS_ALL)
.PHONY: man
man: $(DOCGEN) $(BINS) $(HTTP_BIN)
	scripts/gen-man $(BUILD) man

setup:
	scripts/setup

test: setup
	$(MAKE) -j$$(nproc) all
	tests/run.sh

# Unit tests under AddressSanitizer and UBSan, in a separate build tree, with
# the kvctl that test_kvclient drives built the same way (never a stale one).
asan:
	$(MAKE) BUILD=build-asan OPT="-O1 -g" SAN="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all" \
	    CUDA_SRC= $(patsubst $(BUILD)/%,build-asan/%,$(TESTS)) $(if $(KVCTL_SRC),build-asan/bin/kvctl)
	BUILD=build-asan tests/run.sh --unit-only

# ---- fuzzing: libFuzzer targets (tests/fuzz/fuzz_*.c) ------------------------
# Built with clang into their own tree (build-fuzz), every library instrumented
# for coverage and checked by ASan and UBSan. `make fuzz` runs each target for
# FUZZ_SECONDS (tests/fuzz/run.sh: seeds from tests/fuzz/corpus/<target>/, new
# inputs kept in build-fuzz/corpus/<target>/, crashes in build-fuzz/crashes/);
# FUZZ_TARGETS="fuzz_frame fuzz_ring" picks some. `make fuzz-build` only builds.
# fuzz_http_request (kvd-http's request parser, client/http/request.c and
# structured.c) needs
# jansson alone and is built when pkg-config finds it.
FUZZ_CC      ?= clang
FUZZ_BUILD   ?= build-fuzz
FUZZ_SECONDS ?= 60
FUZZ_SAN     := -fsanitize=fuzzer-no-link,address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
FUZZ_JANSSON := $(shell pkg-config --exists jansson 2>/dev/null && echo y)
FUZZ_TARGET_SRC := $(if $(FUZZ_JANSSON),$(FUZZ_SRC),$(filter-out tests/fuzz/fuzz_http_request.c,$(FUZZ_SRC)))
FUZZ_BINS     = $(patsubst tests/fuzz/%.c,$(FUZZ_BUILD)/fuzz/%,$(FUZZ_TARGET_SRC))
.PHONY: fuzz-build
fuzz-build: $(LIBKERNELS)
	$(MAKE) BUILD=$(FUZZ_BUILD) CC=$(FUZZ_CC) OPT="-O1 -g" SAN="$(FUZZ_SAN)" CUDA_SRC= \
	    WARN="-Wall -Wno-unused-parameter -Wno-unused-command-line-argument" \
	    KERNELS_FROM=$(abspath $(LIBKERNELS)) $(FUZZ_BINS)
fuzz: fuzz-build
	FUZZ_BUILD=$(FUZZ_BUILD) tests/fuzz/run.sh $(FUZZ_SECONDS) $(FUZZ_TARGETS)
# The compute kernels are the main build's library, uninstrumented gcc
# objects: clang 14 lacks some of their __builtin_cpu_supports() features,
# no input reaches their math, and compiling them again was a third of the
# fuzz build.
$(BUILD)/fuzz/%: $(BUILD)/obj/tests/fuzz/%.o $(CORE_LIBS)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS_ALL) -fsanitize=fuzzer -o $@ $^ $(LIBS_ALL)
# kvd-http's parser: its own object (it sees client/http and jansson, as in
# kvd-http), none of the core libraries.
FUZZ_JANSSON_CFLAGS = $(shell pkg-config --cflags jansson 2>/dev/null)
$(BUILD)/obj/tests/fuzz/fuzz_http_request.o: INC := $(INC_ALL) -iquote client/http
$(BUILD)/obj/tests/fuzz/fuzz_http_request.o: EXTRA_CFLAGS += $(FUZZ_JANSSON_CFLAGS)
$(BUILD)/obj/fuzz-http/%.o: client/http/%.c Makefile
	@mkdir -p $(dir $@)
	$(CC) -std=c11 -D_GNU_SOURCE $(OPT) $(SAN) $(WARN) -pthread -iquote client $(FUZZ_JANSSON_CFLAGS) \
	    -MMD -MP -c $< -o $@
$(BUILD)/fuzz/fuzz_http_request: $(BUILD)/obj/tests/fuzz/fuzz_http_request.o $(BUILD)/obj/fuzz-http/request.o \
    $(BUILD)/obj/fuzz-http/structured.o
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS_ALL) -fsanitize=fuzzer -o $@ $^ $(shell pkg-config --libs jansson 2>/dev/null) -lm
.PHONY: clean-fuzz
clean: clean-fuzz
clean-fuzz:
	rm -rf $(FUZZ_BUILD)

bench: setup
	$(MAKE) all
	scripts/bench

# only the deployment shapes (1B and 3B random-weight models) against both peers
bench-shapes: setup
	$(MAKE) all
	scripts/bench --shapes-only

run: setup
	$(MAKE) all
	scripts/run

stop:
	scripts/stop

# Paths that depend on PREFIX (kvclient.pc, the units' ExecStart) are
# written here, not at build time.
install: all
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/lib $(DESTDIR)$(PREFIX)/include \
	    $(DESTDIR)$(PREFIX)/lib/pkgconfig $(DESTDIR)/etc/kvd
	$(if $(BINS),install -m 0755 $(BINS) $(DESTDIR)$(PREFIX)/bin/)
	$(if $(CUDA_PLUGIN),install -d $(DESTDIR)$(PREFIX)/lib/kvd && install -m 0755 $(CUDA_PLUGIN) $(DESTDIR)$(PREFIX)/lib/kvd/)
	$(if $(CLIENT_LIBS),install -m 0644 $(LIBCLIENT_A) $(DESTDIR)$(PREFIX)/lib/ && \
	    install -m 0755 $(LIBCLIENT_SO) $(DESTDIR)$(PREFIX)/lib/libkvclient.so.$(KVCLIENT_SOVERSION) && \
	    ln -sf libkvclient.so.$(KVCLIENT_SOVERSION) $(DESTDIR)$(PREFIX)/lib/libkvclient.so && \
	    install -m 0644 client/kvclient.h $(DESTDIR)$(PREFIX)/include/ && \
	    $(call PC_SED,$(PREFIX),$${exec_prefix}/lib,$${prefix}/include,) client/kvclient.pc.in \
	        > $(DESTDIR)$(PREFIX)/lib/pkgconfig/kvclient.pc && \
	    chmod 0644 $(DESTDIR)$(PREFIX)/lib/pkgconfig/kvclient.pc)
	$(if $(wildcard etc/kvd.conf),install -m 0644 etc/kvd.conf $(DESTDIR)/etc/kvd/kvd.conf)
	$(if $(wildcard systemd/*.service),install -d $(DESTDIR)$(PREFIX)/lib/systemd/system && \
	    install -m 0644 systemd/*.socket $(DESTDIR)$(PREFIX)/lib/systemd/system/ && \
	    for u in systemd/*.service; do \
	        sed -e 's%^ExecStart=[^ ]*/bin/\(kvd[a-z-]*\)\( \|$$\)%ExecStart=$(PREFIX)/bin/\1\2%' $$u \
	            > $(DESTDIR)$(PREFIX)/lib/systemd/system/$$(basename $$u) && \
	        chmod 0644 $(DESTDIR)$(PREFIX)/lib/systemd/system/$$(basename $$u) || exit 1; \
	    done)
	$(if $(wildcard systemd/kvd.sysusers),install -d $(DESTDIR)$(PREFIX)/lib/sysusers.d && \
	    install -m 0644 systemd/kvd.sysusers $(DESTDIR)$(PREFIX)/lib/sysusers.d/kvd.conf)
	$(if $(wildcard man/*.[0-9]),for p in man/*.[0-9]; do \
	    s=$${p##*.}; install -d $(DESTDIR)$(PREFIX)/share/man/man$$s && \
	    install -m 0644 $$p $(DESTDIR)$(PREFIX)/share/man/man$$s/ || exit 1; \
	done)
	$(if $(wildcard systemd/kvd.tmpfiles),install -d $(DESTDIR)$(PREFIX)/lib/tmpfiles.d && \
	    install -m 0644 systemd/kvd.tmpfiles $(DESTDIR)$(PREFIX)/lib/tmpfiles.d/kvd.conf)

clean:
	rm -rf build build-asan
