# kernels.mk — per-file ISA flags for the kernels (included by the Makefile) and the aarch64 cross build of
# the kernels and their unit test, run under qemu-aarch64 by tests/shell/test_neon_qemu.sh.
# The ISA files are compiled with their instruction sets enabled; kern_available checks the CPU at run time
# before any of their code runs, so the binary still works on CPUs without them.
KERN_ARCH := $(shell $(CC) -dumpmachine 2>/dev/null)
ifneq ($(filter x86_64%,$(KERN_ARCH)),)
KERN_BUILDS       := $(B)/rel $(B)/asan $(B)/check
KERN_AVX2_FLAGS   := -mavx2 -mfma -mf16c
KERN_AVX512_FLAGS := -mavx2 -mfma -mf16c -mavx512f -mavx512bw -mavx512vl -mavx512dq
$(KERN_BUILDS:%=%/src/kernels/kernels_avx2.o): CFLAGS += $(KERN_AVX2_FLAGS)
KERN_AMX_FLAGS    := $(KERN_AVX512_FLAGS) -mavx512bf16 -mamx-tile -mamx-bf16
$(KERN_BUILDS:%=%/src/kernels/kernels_avx512.o): CFLAGS += $(KERN_AVX512_FLAGS)
$(KERN_BUILDS:%=%/src/kernels/kernels_amx.o): CFLAGS += $(KERN_AMX_FLAGS)
endif

# Cross build: only the kernels, tensor/util and the kernels test, statically, no pkg-config libraries.
CROSS_CC   ?= aarch64-linux-gnu-gcc
CROSS_SRC  := $(sort $(wildcard src/kernels/*.c)) src/common/tensor.c src/common/util.c tests/unit/test_kernels.c
$(B)/aarch64/test_kernels: $(CROSS_SRC) $(wildcard src/kernels/*.h) src/common/tensor.h src/common/util.h \
		src/common/error.h include/deltafin.h
	@mkdir -p $(dir $@)
	@echo "CC  $@ (aarch64)"
	@$(CROSS_CC) -O2 -g -std=c11 -D_GNU_SOURCE $(WARN) -fvisibility=hidden -Iinclude -Isrc -Itests/unit -pthread \
		-fno-strict-aliasing -static -o $@ $(CROSS_SRC) -lm -pthread

ifneq ($(shell command -v $(CROSS_CC) 2>/dev/null),)
tests-build: $(B)/aarch64/test_kernels
endif
