# Deltafin — build, run and test.  `make` builds ./deltafin; `make run` and `make test` are the quick start.
CC      ?= cc
PKGS    := libpcre2-8 liburing libcurl libmicrohttpd jansson
PKG_CFLAGS := $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
PKG_LIBS   := $(shell pkg-config --libs $(PKGS) 2>/dev/null)
WARN    := -Wall -Wextra -Werror -Wno-unused-parameter
# messages written into fixed error buffers truncate by design (gcc only knows this warning)
WARN    += $(shell $(CC) -Werror -Wno-format-truncation -E -x c /dev/null >/dev/null 2>&1 && echo -Wno-format-truncation)
CFLAGS  ?= -O2 -g
CFLAGS  += -std=c11 -D_GNU_SOURCE $(WARN) -Iinclude -Isrc -pthread -fno-strict-aliasing $(PKG_CFLAGS)
LDLIBS  += $(PKG_LIBS) -lm -pthread -ldl
SAN     := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined

# MPI (expert parallelism over several machines, src/dist): linked when the build finds an implementation
# (Open MPI's or MPICH's pkg-config file, else mpicc's own flags); otherwise, or with `make MPI=0`, a one-rank
# stub. Linked rather than loaded at run time because MPI's handles differ by implementation (Open MPI's are
# pointers to library objects, MPICH's integers): only the implementation's own header gets them right.
MPI ?= 1
ifneq ($(MPI),0)
MPI_PC     := $(firstword $(foreach p,ompi-c mpich,$(shell pkg-config --exists $(p) 2>/dev/null && echo $(p))))
MPI_CFLAGS := $(if $(MPI_PC),$(shell pkg-config --cflags $(MPI_PC)),$(shell mpicc --showme:compile 2>/dev/null))
MPI_LIBS   := $(if $(MPI_PC),$(shell pkg-config --libs $(MPI_PC)),$(shell mpicc --showme:link 2>/dev/null))
endif
LIB_SRC := $(sort $(wildcard src/*/*.c))
LIB_SRC := $(filter-out src/cli/%,$(LIB_SRC))
ifneq ($(MPI_LIBS),)
LIB_SRC := $(filter-out src/dist/comm_stub.c,$(LIB_SRC))
LDLIBS  += $(MPI_LIBS)
else
LIB_SRC := $(filter-out src/dist/comm_mpi.c,$(LIB_SRC))
endif
CLI_SRC := $(sort $(wildcard src/cli/*.c))
TEST_SRC := $(sort $(wildcard tests/unit/test_*.c))

B := build
BIN ?= deltafin
LIB_OBJ := $(LIB_SRC:%.c=$(B)/rel/%.o)
CLI_OBJ := $(CLI_SRC:%.c=$(B)/rel/%.o)
ASAN_LIB_OBJ := $(LIB_SRC:%.c=$(B)/asan/%.o)
ASAN_CLI_OBJ := $(CLI_SRC:%.c=$(B)/asan/%.o)
TEST_BIN := $(TEST_SRC:tests/unit/%.c=$(B)/asan/tests/%)
CHECK_LIB_OBJ := $(LIB_SRC:%.c=$(B)/check/%.o)
CHECK_BIN := $(TEST_SRC:tests/unit/%.c=$(B)/check/tests/%)

.PHONY: all run test check deps clean tests-build clang-check install test-gpu
all: $(BIN)

deps:
	@bash scripts/install-deps.sh

$(B)/check/%.o: %.c
	@mkdir -p $(dir $@)
	@echo "CC  $< (check)"
	@$(CC) $(CFLAGS) -O1 -MMD -MP -c $< -o $@

$(B)/rel/%.o: %.c
	@mkdir -p $(dir $@)
	@echo "CC  $<"
	@$(CC) $(CFLAGS) -MMD -MP -c $< -o $@

$(B)/asan/%.o: %.c
	@mkdir -p $(dir $@)
	@echo "CC  $< (asan)"
	@$(CC) $(CFLAGS) -O1 $(SAN) -MMD -MP -c $< -o $@

$(B)/libdeltafin.a: $(LIB_OBJ)
	@rm -f $@
	@echo "AR  $@"
	@ar rcs $@ $^

# The library's objects keep their internals hidden (DF_API in include/deltafin.h marks what is exported). The
# CLI, server and tests link build/libdeltafin.a, internals included; the installed archive is
# $(B)/dist/libdeltafin.a: all library objects linked into one relocatable object whose hidden symbols are
# made local, so that consumers see the df_* API and nothing else (tests/shell/test_public_lib.sh checks it).
$(LIB_OBJ) $(ASAN_LIB_OBJ) $(CHECK_LIB_OBJ): CFLAGS += -fvisibility=hidden

$(B)/rel/src/dist/comm_mpi.o $(B)/asan/src/dist/comm_mpi.o $(B)/check/src/dist/comm_mpi.o: CFLAGS += $(MPI_CFLAGS)

$(B)/dist/libdeltafin.a: $(LIB_OBJ)
	@mkdir -p $(dir $@)
	@rm -f $@ $(B)/dist/libdeltafin.o
	@echo "AR  $@ (public symbols only)"
	@$(LD) -r -o $(B)/dist/libdeltafin.o $^
	@objcopy --localize-hidden $(B)/dist/libdeltafin.o
	@ar rcs $@ $(B)/dist/libdeltafin.o

$(B)/check/libdeltafin.a: $(CHECK_LIB_OBJ)
	@rm -f $@
	@echo "AR  $@"
	@ar rcs $@ $^

$(B)/asan/libdeltafin.a: $(ASAN_LIB_OBJ)
	@rm -f $@
	@echo "AR  $@"
	@ar rcs $@ $^

$(BIN): $(CLI_OBJ) $(B)/libdeltafin.a
	@echo "LD  $@"
	@$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS)

$(B)/asan/deltafin: $(ASAN_CLI_OBJ) $(B)/asan/libdeltafin.a
	@echo "LD  $@"
	@$(CC) $(CFLAGS) $(SAN) -o $@ $^ $(LDLIBS)

$(B)/asan/tests/%: tests/unit/%.c $(B)/asan/libdeltafin.a
	@mkdir -p $(dir $@)
	@echo "LD  $@"
	@$(CC) $(CFLAGS) -O1 $(SAN) -Itests/unit -o $@ $< $(B)/asan/libdeltafin.a $(LDLIBS)

$(B)/check/tests/%: tests/unit/%.c $(B)/check/libdeltafin.a
	@mkdir -p $(dir $@)
	@echo "LD  $@"
	@$(CC) $(CFLAGS) -O1 -Itests/unit -o $@ $< $(B)/check/libdeltafin.a $(LDLIBS)

tests-build: $(BIN) $(B)/asan/deltafin $(TEST_BIN)

run: 
	@bash scripts/install-deps.sh --build-only --if-missing
	@$(MAKE) --no-print-directory deltafin
	./deltafin run -p "The old man looked at the river and said" -n 60

test:
	@bash scripts/install-deps.sh --if-missing
	@$(MAKE) --no-print-directory tests-build
	@bash tests/run.sh

# The fast tier (under 90 s on two idle cores; README.md, Testing): unit tests built at -O1 without sanitizers,
# two binaries at a time, and the quick CLI and layout shell tests; no browser, server, fuzz, qemu or clang
# rebuild. `make test` runs everything.
check: $(BIN) $(CHECK_BIN)
	@bash tests/run.sh --fast

# The same sources must also build warning-free with clang.
clang-check:
	$(MAKE) --no-print-directory CC=clang B=build/clang BIN=build/clang/deltafin build/clang/deltafin

# The binary in PREFIX/bin and the bundled model in PREFIX/share/deltafin/models/default, where the installed
# binary finds it as its default model; the library for C programs (include/deltafin.h, lib/libdeltafin.a and
# a pkg-config file naming the libraries it needs: `pkg-config --cflags --libs deltafin`).
PREFIX ?= /usr/local
install: $(BIN) $(B)/dist/libdeltafin.a
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/share/deltafin/models/default \
		$(DESTDIR)$(PREFIX)/include $(DESTDIR)$(PREFIX)/lib/pkgconfig
	install -m 755 $(BIN) $(DESTDIR)$(PREFIX)/bin/deltafin
	install -m 644 models/default/* $(DESTDIR)$(PREFIX)/share/deltafin/models/default/
	install -m 644 include/deltafin.h $(DESTDIR)$(PREFIX)/include/deltafin.h
	install -m 644 $(B)/dist/libdeltafin.a $(DESTDIR)$(PREFIX)/lib/libdeltafin.a
	printf '%s\n' 'prefix=$(PREFIX)' 'Name: deltafin' 'Description: Kimi-Linear / Kimi K3 inference library' \
		"Version: $$(sed -n 's/^#define DF_VERSION "\(.*\)"/\1/p' include/deltafin.h)" \
		'Requires: $(PKGS)' 'Cflags: -I$${prefix}/include' 'Libs: -L$${prefix}/lib -ldeltafin -lm -pthread $(MPI_LIBS)' \
		>$(DESTDIR)$(PREFIX)/lib/pkgconfig/deltafin.pc

clean:
	rm -rf build deltafin

# The GPU kernels' CUDA source, embedded as a C string (no CUDA toolkit needed to build; NVRTC compiles it at run
# time on a machine with a GPU).
GPU_CU := $(sort $(wildcard src/gpu/*.cu))
$(B)/gen/gpu_kernels.inc: $(GPU_CU) scripts/embed-cu.sh
	@mkdir -p $(dir $@)
	@bash scripts/embed-cu.sh $(GPU_CU) >$@.tmp && mv $@.tmp $@
$(B)/rel/src/gpu/kernel_src.o $(B)/asan/src/gpu/kernel_src.o $(B)/check/src/gpu/kernel_src.o: $(B)/gen/gpu_kernels.inc
$(B)/rel/src/gpu/kernel_src.o $(B)/asan/src/gpu/kernel_src.o $(B)/check/src/gpu/kernel_src.o: CFLAGS += -I$(B)/gen

# On a machine with an NVIDIA GPU: the engine's tests with the GPU backend (DELTAFIN_GPU selects device 0 for every
# engine the tests open) and the GPU's own tests; "N passed, N failed".
test-gpu: $(BIN) $(CHECK_BIN)
	@bash tests/run-gpu.sh

include src/kernels/kernels.mk
-include $(shell find $(B) -name '*.d' 2>/dev/null)
