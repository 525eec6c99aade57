# ctrain build. `make` builds build/libctrain.{a,so}, build/ctrain and the tests;
# `make test` runs the suite; `make bench` runs benchmarks against PyTorch.
# Optional parts are detected; `make` prints what it left out.

CC      ?= gcc
BUILD   ?= build
PREFIX  ?= /usr/local
NVCC    ?= nvcc
# 512-bit vectors for the loops gcc vectorizes itself (its -march=native default prefers 256 bits
# on AVX-512 CPUs): GPT +4%, MLP and CNN +2-3% a step (docs/benchmarks.md)
OPT     ?= -O3 -march=native -mprefer-vector-width=512

# `make SAN=1`: AddressSanitizer + UndefinedBehaviorSanitizer build in build-san/, beside the
# normal one (different flags must not share objects). -O1 keeps it fast enough for the whole
# suite while leaving frame pointers for readable stacks; UBSan stops at the first finding
# (-fno-sanitize-recover) so a test cannot pass with undefined behaviour in it. GCC leaves
# float-to-integer overflow out of -fsanitize=undefined; it is asked for by name because
# values parsed from files and flags are converted that way.
# `make test-asan` builds it and runs the suite against it (tests/asan.supp says what is ignored).
ifeq ($(SAN),1)
BUILD   := build-san
OPT     := -O1 -g -fno-omit-frame-pointer
SANFLAGS := -fsanitize=address,undefined,float-cast-overflow -fno-sanitize-recover=all
endif

# `make fuzz`: libFuzzer targets (fuzz/*.c) against a clang build of the library in
# build-fuzz/, instrumented for coverage, ASan and UBSan. Each target runs FUZZ_SECONDS from
# its committed seed corpus (fuzz/corpus/<target>/, which also holds every crash found so far
# as a regression input); new inputs go to build-fuzz/corpus/, crashes to build-fuzz/crashes/.
# The BLAS is the pthread OpenBLAS there: clang's OpenMP runtime is libomp, and one runtime
# per process is enough. -Wno-pass-failed: with instrumentation in the loop bodies clang cannot
# vectorize the `omp simd` loops and says so, which is expected in this build only.
FUZZ_SECONDS ?= 30
FUZZ_TARGETS := $(patsubst fuzz/%.c,%,$(wildcard fuzz/fuzz_*.c))
ifeq ($(FUZZ),1)
CC      := $(firstword $(shell command -v clang clang-14 2>/dev/null) clang)
BUILD   := build-fuzz
OPT     := -O1 -g -fno-omit-frame-pointer
SANFLAGS := -fsanitize=fuzzer-no-link,address,undefined,float-cast-overflow -fno-sanitize-recover=all -Wno-pass-failed
OPENBLAS := pthread
endif

# OpenBLAS: the OpenMP build (Debian libopenblas-openmp-dev) when it is installed, so the
# BLAS and ctrain's kernels share one libgomp thread pool instead of two sets of threads
# spinning against each other (with the pthread build, 2 threads ran several times slower
# than 1); it is linked by path with an rpath, leaving the system-wide libopenblas.so.0
# alternative (used by e.g. PyTorch) untouched. `make OPENBLAS=pthread` forces the default.
OPENBLAS ?= auto
OMPBLAS_DIR := /usr/lib/$(shell $(CC) -print-multiarch 2>/dev/null)/openblas-openmp
ifneq ($(OPENBLAS),pthread)
ifneq ($(wildcard $(OMPBLAS_DIR)/pkgconfig/openblas.pc),)
BLAS_KIND   := openblas-openmp
BLAS_CFLAGS := $(shell PKG_CONFIG_PATH=$(OMPBLAS_DIR)/pkgconfig pkg-config --cflags openblas)
BLAS_LIBS   := -L$(OMPBLAS_DIR) -lopenblas -Wl,-rpath,$(OMPBLAS_DIR)
endif
endif
PKG_BLAS  := $(shell pkg-config --exists openblas 2>/dev/null && echo openblas)
ifeq ($(BLAS_KIND),)
BLAS_KIND   := $(PKG_BLAS)
BLAS_CFLAGS := $(if $(PKG_BLAS),$(shell pkg-config --cflags openblas),)
BLAS_LIBS   := $(if $(PKG_BLAS),$(shell pkg-config --libs openblas),)
endif
PKG_CJSON := $(shell pkg-config --exists libcjson 2>/dev/null && echo libcjson)
PKG_ZLIB  := $(shell pkg-config --exists zlib 2>/dev/null && echo zlib)
PKG_MPI   := $(shell pkg-config --exists ompi-c 2>/dev/null && echo ompi-c)
# Gloo (Debian libgloo-dev; no pkg-config file): the gloo backend when its headers and library
# link. Its API is C++, so src/distributed/gloo.cc is built with g++ and libstdc++ is linked.
# Not in the fuzz build (clang's fuzzer flags; the targets use no process group).
CXX      ?= g++
HAVE_GLOO := $(if $(filter 1,$(FUZZ)),,$(shell echo 'int main(){}' | $(CXX) -std=c++17 -include gloo/allreduce.h \
               -x c++ - -lgloo -o /dev/null 2>/dev/null && echo yes))
GLOO_SRC  := $(if $(HAVE_GLOO),src/distributed/gloo.cc,)
GLOO_LIBS := $(if $(HAVE_GLOO),-lgloo -lstdc++,)

ifeq ($(BLAS_KIND),)
$(error OpenBLAS not found: apt-get install libopenblas-dev)
endif
ifeq ($(PKG_CJSON),)
$(error cJSON not found: apt-get install libcjson-dev)
endif
ifeq ($(PKG_ZLIB),)
$(error zlib not found: apt-get install zlib1g-dev)
endif

# CUDA: on when nvcc is on the PATH or in $(CUDA_HOME)/bin (`make CUDA=0` leaves it out;
# the sanitizer and fuzz builds always do). The .cu files are compiled for the machine the
# build runs on, as each nvcc target costs a full compile of every kernel:
#  - `make CUDA_ARCHS="80 90"` (or CUDA_ARCHS in the environment): each listed real
#    architecture plus PTX of the newest, which a newer GPU's driver compiles on first use;
#  - else, with a GPU (nvidia-smi reports its compute capability): that GPU's architecture(s)
#    plus their PTX (one compile: the PTX is the one the code is made from);
#  - else (the toolkit, no GPU): PTX for compute_$(CUDA_PTX_ONLY) only, which the driver of
#    whatever GPU later runs it compiles once and caches (~a minute on first start).
# `make` prints which. Warnings are errors in nvcc and in the host compiler it drives.
# Links cudart and NCCL; cuBLASLt is opened on first use (src/cuda/gemm.c), as linking it
# costs every process, CPU-only ones included, ~70 ms at start.
CUDA_HOME ?= /usr/local/cuda
CUDA      ?= auto
CUDA_WHY  := CUDA=0
ifneq ($(filter 1,$(SAN) $(FUZZ)),)
override CUDA := 0
CUDA_WHY  := left out of sanitizer and fuzz builds
endif
ifeq ($(CUDA),auto)
CUDA_WHY   := no nvcc on the PATH or in $(CUDA_HOME)/bin
NVCC_FOUND := $(firstword $(shell command -v nvcc 2>/dev/null) $(wildcard $(CUDA_HOME)/bin/nvcc))
CUDA := $(if $(NVCC_FOUND),1,0)
ifneq ($(NVCC_FOUND),)
NVCC := $(NVCC_FOUND)
CUDA_HOME := $(patsubst %/bin/nvcc,%,$(realpath $(NVCC_FOUND)))
endif
endif
CUDA_PTX_ONLY ?= 80
CUDA_ARCHS_WHY := $() from CUDA_ARCHS
ifeq ($(CUDA)$(origin CUDA_ARCHS),1undefined)
CUDA_GPU_ARCHS := $(shell nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | tr -d ' .' \
                    | grep -E '^[0-9]+$$' | sort -un)
# the GPU's architectures this nvcc can compile for (a GPU newer than the toolkit: PTX only)
CUDA_ARCHS := $(if $(CUDA_GPU_ARCHS),$(filter $(CUDA_GPU_ARCHS),$(patsubst sm_%,%,$(shell $(NVCC) --list-gpu-code 2>/dev/null))))
CUDA_ARCHS_WHY := $(if $(CUDA_ARCHS),$() from the GPU,: $(if $(CUDA_GPU_ARCHS),the GPU's sm_$(CUDA_GPU_ARCHS) is unknown to this nvcc,no GPU here))
endif
CUDA_PTX   := $(if $(strip $(CUDA_ARCHS)),$(lastword $(CUDA_ARCHS)),$(CUDA_PTX_ONLY))
# what the objects hold, for `make`'s line and `ctrain env` (CT_CUDA_TARGETS)
CUDA_TARGETS := $(if $(strip $(CUDA_ARCHS)),sm_$(subst $() $(),/,$(strip $(CUDA_ARCHS))) + PTX,PTX compute_$(CUDA_PTX) only)
# sources that need the toolkit: everything under src/cuda and the NCCL backend
CUDA_C_SRC := $(shell find src/cuda -name '*.c' 2>/dev/null | sort) src/distributed/nccl.c
CUDA_CU_SRC := $(shell find src/cuda -name '*.cu' 2>/dev/null | sort)
ifeq ($(CUDA),1)
CUDA_DEFS := -DCT_HAVE_CUDA=1 -DCT_CUDA_TARGETS='"$(CUDA_TARGETS)"' -DCT_CUDA_LIBDIR='"$(CUDA_HOME)/lib64"' \
             -I$(CUDA_HOME)/include
# -u keeps src/cuda/device.o in static links: it registers the CUDA backend at start
CUDA_LIBS := -Wl,-u,ct_cuda_register -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lnccl -lcudart -lstdc++ -ldl
NVFLAGS  := -std=c++17 -O3 -g -lineinfo -Werror all-warnings -Xcompiler -fPIC,-Wall,-Wextra,-Werror \
            $(foreach a,$(CUDA_ARCHS),-gencode arch=compute_$(a),code=sm_$(a)) \
            -gencode arch=compute_$(CUDA_PTX),code=compute_$(CUDA_PTX) -Iinclude -Isrc -DCT_HAVE_CUDA=1
endif

PKGS     := $(PKG_BLAS) $(PKG_CJSON) $(PKG_ZLIB) $(PKG_MPI)
LPKGS    := $(PKG_CJSON) $(PKG_ZLIB) $(PKG_MPI)
DEFS     := $(if $(PKG_MPI),-DCT_HAVE_MPI=1,) $(if $(HAVE_GLOO),-DCT_HAVE_GLOO=1,) $(CUDA_DEFS)
CFLAGS   := -std=c11 -D_GNU_SOURCE $(OPT) -g -fPIC -fopenmp -Wall -Wextra -Werror $(SANFLAGS) \
            -Iinclude -Isrc $(DEFS) $(BLAS_CFLAGS) $(shell pkg-config --cflags $(LPKGS))
LDLIBS   := $(SANFLAGS) $(BLAS_LIBS) $(shell pkg-config --libs $(LPKGS)) $(GLOO_LIBS) $(CUDA_LIBS) -fopenmp -lpthread -lm -lrt
CXXFLAGS := -std=c++17 -D_GNU_SOURCE $(OPT) -g -fPIC -Wall -Wextra -Werror $(SANFLAGS) -Iinclude -Isrc $(DEFS)

LIB_SRC  := $(filter-out $(CUDA_C_SRC),$(shell find src -name '*.c' -not -path 'src/cli/*' | sort))
ifeq ($(CUDA),1)
LIB_SRC  += $(CUDA_C_SRC)
endif
CLI_SRC  := $(wildcard src/cli/*.c)
TEST_SRC := $(wildcard tests/unit/*.c)
MPI_TEST_SRC := $(wildcard tests/mpi/*.c)
EX_SRC   := $(wildcard examples/*.c)
BENCH_SRC := $(wildcard bench/*.c)

LIB_OBJ  := $(LIB_SRC:%.c=$(BUILD)/obj/%.o) $(GLOO_SRC:%.cc=$(BUILD)/obj/%.o) $(if $(filter 1,$(CUDA)),$(CUDA_CU_SRC:%.cu=$(BUILD)/obj/%.cu.o))
# GPU tests (tests/gpu/*.c): built only with CUDA; each skips with "no CUDA GPU" where none is
GPU_TEST_SRC := $(if $(filter 1,$(CUDA)),$(wildcard tests/gpu/*.c))
GPU_TEST_BIN := $(GPU_TEST_SRC:tests/gpu/%.c=$(BUILD)/tests/%)
CLI_OBJ  := $(CLI_SRC:%.c=$(BUILD)/obj/%.o)
TEST_BIN := $(TEST_SRC:tests/unit/%.c=$(BUILD)/tests/%)
# programs run under mpirun by tests/scripts (outside build/tests, which tests/run.sh runs directly)
MPI_TEST_BIN := $(MPI_TEST_SRC:tests/mpi/%.c=$(BUILD)/mpi/%)
EX_BIN   := $(EX_SRC:examples/%.c=$(BUILD)/examples/%)
BENCH_BIN := $(BENCH_SRC:bench/%.c=$(BUILD)/bench/%)

all: info $(BUILD)/libctrain.a $(BUILD)/libctrain.so $(BUILD)/ctrain $(TEST_BIN) $(GPU_TEST_BIN) $(MPI_TEST_BIN) $(EX_BIN) $(BENCH_BIN)

# the link flags of this configuration (tests/scripts/cuda_emu_device.sh links its own programs)
print-ldlibs:
	@echo $(LDLIBS)
# its feature macros (the emulated device recompiles the backend table with CUDA on)
print-defs:
	@echo $(DEFS)

info:
	@echo "ctrain build: blas=$(BLAS_KIND) json=$(PKG_CJSON) zlib=$(PKG_ZLIB) mpi=$(if $(PKG_MPI),yes,no (apt-get install libopenmpi-dev))" \
	      "gloo=$(if $(HAVE_GLOO),yes,no (apt-get install libgloo-dev))" \
	      "cuda=$(if $(filter 1,$(CUDA)),yes ($(CUDA_HOME), $(CUDA_TARGETS)$(CUDA_ARCHS_WHY)$(if $(findstring CUDA_ARCHS,$(CUDA_ARCHS_WHY)),,; CUDA_ARCHS=... to choose)),no ($(CUDA_WHY)))"

# Objects depend on the CUDA setting: switching CUDA=0/1 or the CUDA targets rebuilds them
# instead of linking objects compiled for the other setting.
CUDA_STAMP := $(BUILD)/cuda-$(CUDA)$(if $(filter 1,$(CUDA)),-$(if $(strip $(CUDA_ARCHS)),$(subst $() $(),_,$(strip $(CUDA_ARCHS))),ptx$(CUDA_PTX))).stamp
$(CUDA_STAMP):
	@mkdir -p $(BUILD) && rm -f $(BUILD)/cuda-*.stamp && touch $@

$(BUILD)/obj/%.o: %.c $(CUDA_STAMP)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -MMD -MP -c $< -o $@

# The AVX2 GEMM family (and the fused attention's AVX2 kernels) is the code of a CPU without AVX-512 on every build machine: 16 vector
# registers, no EVEX encodings (-march=native would otherwise lend it AVX-512's 32)
$(BUILD)/obj/src/ops/cpu/sgemm_avx2.o $(BUILD)/obj/src/ops/cpu/flash_avx2.o: CFLAGS += -mno-avx512f

$(BUILD)/obj/%.cu.o: %.cu $(CUDA_STAMP)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) -MMD -MP -MF $(@:.o=.d) -c $< -o $@

$(BUILD)/obj/%.o: %.cc $(CUDA_STAMP)
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) -MMD -MP -c $< -o $@

$(BUILD)/libctrain.a: $(LIB_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(BUILD)/libctrain.so: $(LIB_OBJ)
	$(CC) -shared -o $@ $^ $(LDLIBS)

$(BUILD)/ctrain: $(CLI_OBJ) $(BUILD)/libctrain.a
	$(CC) -o $@ $(CLI_OBJ) $(BUILD)/libctrain.a $(LDLIBS)

$(BUILD)/tests/%: tests/unit/%.c tests/ct_test.h tests/dist_pattern.h $(BUILD)/libctrain.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Itests -o $@ $< $(BUILD)/libctrain.a $(LDLIBS)

$(BUILD)/tests/%: tests/gpu/%.c tests/ct_test.h $(wildcard tests/gpu/*.h) $(BUILD)/libctrain.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Itests -o $@ $< $(BUILD)/libctrain.a $(LDLIBS)

$(BUILD)/mpi/%: tests/mpi/%.c tests/dist_pattern.h $(BUILD)/libctrain.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Itests -o $@ $< $(BUILD)/libctrain.a $(LDLIBS)

$(BUILD)/examples/%: examples/%.c $(BUILD)/libctrain.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $< $(BUILD)/libctrain.a $(LDLIBS)

$(BUILD)/bench/%: bench/%.c $(BUILD)/libctrain.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $< $(BUILD)/libctrain.a $(LDLIBS)

test: all
	@CT_BUILD=$(BUILD) bash tests/run.sh

# The suite under ASan + UBSan (build-san/). Leak reports that are Open MPI's or its
# plugins' own are suppressed (tests/asan.supp); everything else fails the test. Open MPI
# unloads its plugins before LeakSanitizer looks, which leaves their allocations without a
# module name to match: keeping them loaded makes the suppressions apply.
SAN_ENV := OMPI_MCA_mca_base_component_disable_dlclose=1 ASAN_OPTIONS=detect_leaks=1 \
           LSAN_OPTIONS=suppressions=$(CURDIR)/tests/asan.supp:print_suppressions=0 \
           UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
# what the suite runs (everything but the benchmarks)
test-bins: $(BUILD)/libctrain.a $(BUILD)/libctrain.so $(BUILD)/ctrain $(TEST_BIN) $(GPU_TEST_BIN) $(MPI_TEST_BIN) $(EX_BIN)
test-asan:
	@$(MAKE) --no-print-directory SAN=1 test-bins
	@$(SAN_ENV) CT_BUILD=build-san bash tests/run.sh $(TESTS)

bench: all
	@bash bench/run.sh

# libFuzzer links its own main(): targets get -fsanitize=fuzzer at link time only.
$(BUILD)/fuzz/%: fuzz/%.c fuzz/fuzz.h $(BUILD)/libctrain.a $(BUILD)/obj/src/cli/train_opts.o
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -fsanitize=fuzzer -o $@ $< $(if $(findstring train_opts,$*),$(BUILD)/obj/src/cli/train_opts.o) \
	      $(BUILD)/libctrain.a $(LDLIBS)
fuzz-build: $(FUZZ_TARGETS:%=$(BUILD)/fuzz/%)
# The seed generator (a plain program): `make fuzz-corpus` rewrites fuzz/corpus/*/seed-*.
$(BUILD)/fuzz/make_corpus: fuzz/make_corpus.c fuzz/fuzz.h $(BUILD)/libctrain.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $< $(BUILD)/libctrain.a $(LDLIBS)
fuzz-corpus:
	@$(MAKE) --no-print-directory FUZZ=1 build-fuzz/fuzz/make_corpus
	build-fuzz/fuzz/make_corpus

# -close_fd_mask=3: the readers' error messages would drown libFuzzer's own report (which,
# with the sanitizers', still goes to the terminal); -rss_limit_mb: a 2 GB allocation from a
# small input is a finding, not a reason to swap.
fuzz:
	@command -v clang >/dev/null || command -v clang-14 >/dev/null || \
	    { echo "make fuzz needs clang with libFuzzer: apt-get install clang libclang-rt-dev libomp-dev"; exit 1; }
	@$(MAKE) --no-print-directory FUZZ=1 fuzz-build
	@for t in $(FUZZ_TARGETS); do \
	    mkdir -p build-fuzz/corpus/$$t build-fuzz/crashes fuzz/corpus/$$t; \
	    build-fuzz/fuzz/$$t -max_total_time=$(FUZZ_SECONDS) -close_fd_mask=3 -rss_limit_mb=2048 -max_len=65536 \
	        -print_final_stats=1 -artifact_prefix=build-fuzz/crashes/$$t- build-fuzz/corpus/$$t fuzz/corpus/$$t \
	        > build-fuzz/$$t.log 2>&1 || { tail -60 build-fuzz/$$t.log; echo "FAIL $$t: input in build-fuzz/crashes/"; exit 1; }; \
	    echo "ok   $$t: $$(grep -h '^stat::number_of_executed_units' build-fuzz/$$t.log | grep -o '[0-9]*$$') runs in $(FUZZ_SECONDS) s," \
	         "corpus $$(ls build-fuzz/corpus/$$t | wc -l) inputs"; \
	done

install: all
	install -d $(PREFIX)/include/ctrain $(PREFIX)/lib/pkgconfig $(PREFIX)/bin
	install -m 644 include/ctrain/*.h $(PREFIX)/include/ctrain/
	install -m 644 $(BUILD)/libctrain.a $(PREFIX)/lib/
	install -m 755 $(BUILD)/libctrain.so $(PREFIX)/lib/
	install -m 755 $(BUILD)/ctrain $(PREFIX)/bin/
	sed -e 's|@PREFIX@|$(PREFIX)|' -e 's|@VERSION@|0.1.0|' -e 's|@REQUIRES@|$(PKGS)|' -e 's|@CUDA_LIBS@|$(CUDA_LIBS)|' -e 's|@GLOO_LIBS@|$(GLOO_LIBS)|' ctrain.pc.in > $(PREFIX)/lib/pkgconfig/ctrain.pc

clean:
	rm -rf $(BUILD) build-san build-fuzz build-emu

.PHONY: all info print-ldlibs print-defs test test-bins test-asan fuzz fuzz-build fuzz-corpus bench install clean
-include $(LIB_OBJ:.o=.d) $(CLI_OBJ:.o=.d)
