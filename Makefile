# ctrain build. `make` builds build/libctrain.{a,so}, build/ctrain and the tests;
# `make test` runs the suite; `make bench` runs benchmarks against PyTorch.
# Optional parts are detected; `make` prints what it left out.

CC      ?= gcc
BUILD   ?= build
PREFIX  ?= /usr/local
NVCC    ?= nvcc
OPT     ?= -O3 -march=native

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

ifeq ($(BLAS_KIND),)
$(error OpenBLAS not found: apt-get install libopenblas-dev)
endif
ifeq ($(PKG_CJSON),)
$(error cJSON not found: apt-get install libcjson-dev)
endif
ifeq ($(PKG_ZLIB),)
$(error zlib not found: apt-get install zlib1g-dev)
endif

PKGS     := $(PKG_BLAS) $(PKG_CJSON) $(PKG_ZLIB) $(PKG_MPI)
LPKGS    := $(PKG_CJSON) $(PKG_ZLIB) $(PKG_MPI)
DEFS     := $(if $(PKG_MPI),-DCT_HAVE_MPI=1,)
CFLAGS   := -std=c11 -D_GNU_SOURCE $(OPT) -g -fPIC -fopenmp -Wall -Wextra -Werror \
            -Iinclude -Isrc $(DEFS) $(BLAS_CFLAGS) $(shell pkg-config --cflags $(LPKGS))
LDLIBS   := $(BLAS_LIBS) $(shell pkg-config --libs $(LPKGS)) -fopenmp -lpthread -lm -lrt

LIB_SRC  := $(shell find src -name '*.c' -not -path 'src/cli/*' | sort)
CLI_SRC  := $(wildcard src/cli/*.c)
TEST_SRC := $(wildcard tests/unit/*.c)
MPI_TEST_SRC := $(wildcard tests/mpi/*.c)
EX_SRC   := $(wildcard examples/*.c)
BENCH_SRC := $(wildcard bench/*.c)

LIB_OBJ  := $(LIB_SRC:%.c=$(BUILD)/obj/%.o)
CLI_OBJ  := $(CLI_SRC:%.c=$(BUILD)/obj/%.o)
TEST_BIN := $(TEST_SRC:tests/unit/%.c=$(BUILD)/tests/%)
# programs run under mpirun by tests/scripts (outside build/tests, which tests/run.sh runs directly)
MPI_TEST_BIN := $(MPI_TEST_SRC:tests/mpi/%.c=$(BUILD)/mpi/%)
EX_BIN   := $(EX_SRC:examples/%.c=$(BUILD)/examples/%)
BENCH_BIN := $(BENCH_SRC:bench/%.c=$(BUILD)/bench/%)

all: info $(BUILD)/libctrain.a $(BUILD)/libctrain.so $(BUILD)/ctrain $(TEST_BIN) $(MPI_TEST_BIN) $(EX_BIN) $(BENCH_BIN)

info:
	@echo "ctrain build: blas=$(BLAS_KIND) json=$(PKG_CJSON) zlib=$(PKG_ZLIB) mpi=$(if $(PKG_MPI),yes,no (apt-get install libopenmpi-dev))" \
	      "cuda=no (CUDA backend not part of this build)"

$(BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -MMD -MP -c $< -o $@

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
	@bash tests/run.sh

bench: all
	@bash bench/run.sh

install: all
	install -d $(PREFIX)/include/ctrain $(PREFIX)/lib/pkgconfig $(PREFIX)/bin
	install -m 644 include/ctrain/*.h $(PREFIX)/include/ctrain/
	install -m 644 $(BUILD)/libctrain.a $(PREFIX)/lib/
	install -m 755 $(BUILD)/libctrain.so $(PREFIX)/lib/
	install -m 755 $(BUILD)/ctrain $(PREFIX)/bin/
	sed -e 's|@PREFIX@|$(PREFIX)|' -e 's|@VERSION@|0.1.0|' -e 's|@REQUIRES@|$(PKGS)|' ctrain.pc.in > $(PREFIX)/lib/pkgconfig/ctrain.pc

clean:
	rm -rf $(BUILD)

.PHONY: all info test bench install clean
-include $(LIB_OBJ:.o=.d) $(CLI_OBJ:.o=.d)
