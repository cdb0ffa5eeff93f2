# kiln — plain Makefile. `make help` lists the targets.
#
# Needs: gcc or clang (C11), the CUDA toolkit (NVRTC + headers) at $(CUDA_HOME),
# libsqlite3-dev, libxxhash-dev, libclang-14-dev (`make deps` installs what is missing, and
# python3-venv where python3 has no ensurepip: python/tests/test_install.py makes a venv; and
# python3-dev where Debian's python3 has no headers: the package's optional run() in C).
# libcuda and libnvrtc are dlopen'ed at run time: nothing links against the driver or NVRTC
# (NVRTC's start-up cost stays off cache hits).

CUDA_HOME ?= /usr/local/cuda
RELEASE   ?=
ifeq ($(RELEASE),1)
# a release build: the planner's invariant checks (KILN__ASSERT, runtime/runtime.h) compiled
# out, objects kept apart from the default (checked) build's
BUILD     ?= build-release
RELEASE_FLAGS := -DNDEBUG
else
BUILD     ?= build
RELEASE_FLAGS :=
endif
CC        ?= cc
SAN       ?=

WARN    := -Wall -Wextra -Wpedantic -Werror -Wshadow -Wstrict-prototypes -Wmissing-prototypes \
           -Wformat=2 -Wvla -Wno-format-nonliteral -Wno-format-truncation
# clang (make fuzz, CC=clang) does not know gcc's -Wformat-truncation
ifneq ($(findstring clang,$(CC)),)
WARN    += -Wno-unknown-warning-option
endif
CFLAGS  ?= -O2 -g
ALLCFLAGS := -std=c11 -D_GNU_SOURCE -fPIC -fvisibility=hidden $(WARN) $(CFLAGS) $(RELEASE_FLAGS) $(SAN) \
             -Iinclude -Ijit -Ijit/snippet -Icache -Iruntime -Itools/check -Itemplates/common -I$(BUILD)/gen -isystem $(CUDA_HOME)/include \
             -isystem /usr/lib/llvm-14/include \
             -DKILN_NVRTC_DEFAULT='"$(CUDA_HOME)/lib64/libnvrtc.so.13"'
LDLIBS  := -lsqlite3 -ldl -lpthread -lm
LDFLAGS ?=

LIB_SRC  := $(wildcard jit/*.c jit/snippet/*.c) $(wildcard cache/*.c) $(wildcard runtime/*.c)
LIB_OBJ  := $(LIB_SRC:%.c=$(BUILD)/obj/%.o) $(BUILD)/obj/gen/templates.o
# tools/: the CLI (tools/cli), the float64 check library (tools/check: its own archive, linked
# by the CLI, the tests and the bench, never into libkiln), the bench (tools/bench) and the
# build-time template embedder (tools/build).
TOOL_SRC  := $(wildcard tools/cli/*.c)
TOOL_OBJ  := $(TOOL_SRC:%.c=$(BUILD)/obj/%.o)
CHECK_SRC := $(wildcard tools/check/*.c)
CHECK_OBJ := $(CHECK_SRC:%.c=$(BUILD)/obj/%.o)
TEST_SRC := $(wildcard tests/*.c)
# the fuzz targets (tests/fuzz/) are also in the test runner, their entry points renamed, to
# replay their kept inputs (tests/test_fuzz.c); the manifest target needs the CLI's reader
FUZZ_SRC := $(wildcard tests/fuzz/fuzz_*.c)
CLI_LIB_OBJ := $(filter-out %/kiln.o,$(TOOL_OBJ))
TEST_OBJ := $(TEST_SRC:%.c=$(BUILD)/obj/%.o) $(FUZZ_SRC:%.c=$(BUILD)/obj/%.o) $(CLI_LIB_OBJ)
TEMPLATES := $(shell find templates -name '*.cuh' -o -name '*.h' | LC_ALL=C sort)

LIB_A  := $(BUILD)/lib/libkiln.a
LIB_SO := $(BUILD)/lib/libkiln.so
CHECK_A := $(BUILD)/lib/libkilncheck.a
KILN   := $(BUILD)/bin/kiln
TESTS  := $(BUILD)/bin/kiln-tests
BENCH  := $(BUILD)/bin/kiln-bench
EMBED  := $(BUILD)/bin/kiln-embed
# the Python package's optional run() in C (python/kiln/hot.c, CPython's stable ABI): built
# where python3's headers are installed, else left out (the package then runs on ctypes alone)
PY_INC := $(shell python3 -c "import sysconfig; print(sysconfig.get_paths()['include'])" 2>/dev/null)
HOT_SO := $(if $(wildcard $(PY_INC)/Python.h),$(BUILD)/lib/_kiln_hot.abi3.so)

.PHONY: probe gpu-seed all deps test test-gpu test-full demo bench-gpu help check asan ubsan fuzz fuzz-build format format-check tidy compdb clean
all: $(LIB_A) $(LIB_SO) $(HOT_SO) $(CHECK_A) $(KILN) $(TESTS) $(BENCH)

help:
	@echo "make            build $(LIB_A), $(LIB_SO), $(KILN) and the test runner, with the"
	@echo "                invariant checks compiled in (a broken one prints file:line and aborts)"
	@echo "make RELEASE=1  the same without them (-DNDEBUG), into build-release/ (any target)"
	@echo "make deps       install missing Debian packages (sqlite3, xxhash, clang-14 dev; python3-venv"
	@echo "                where python3 lacks it, for the pip install test; python3-dev for the"
	@echo "                Python package's run() in C); test and demo run it"
	@echo "make test       CPU tests (GPU tests skip without a GPU); last line 'N passed, N failed'"
	@echo "make test-gpu   GPU tests only (fails without a GPU)"
	@echo "make test-full  CPU tests plus the full NVRTC grid (slow)"
	@echo "make demo       build, warm docs/demo.manifest into the default cache, list it,"
	@echo "                and run 'kiln check' on each variant when a GPU is present"
	@echo "make probe      build/bin/wgmma-probe (nvcc): checks the wgmma descriptor forms on an sm_90 GPU"
	@echo "make gpu-seed   compile the GPU tests' kernels (tests/gpu.manifest, tests/python.manifest) for sm_90a into"
	@echo "                .seed/cache.tar.xz, for a GPU lease to carry (KILN_SEED_CACHE)"
	@echo "make bench-gpu  on a GPU machine: the referee (tools/bench/referee.sh all; FlashInfer from .whl/),"
	@echo "                logs under \$$OUT; docs/perf.md says how to make the tables from it"
	@echo "make check      test + asan + ubsan"
	@echo "make asan|ubsan CPU tests under AddressSanitizer / UndefinedBehaviorSanitizer"
	@echo "make fuzz       libFuzzer (clang, ASan + UBSan) on the spec, variant, planner, manifest, cubin,"
	@echo "                cache-row and snippet readers, FUZZ_SECONDS (60) each; crashes in build-fuzz/crashes/"
	@echo "make format     clang-format every C file (.clang-format); make format-check: fail if any"
	@echo "                file would change (CI runs it);  make tidy: clang-tidy"
	@echo "make compdb     compile_commands.json (needs bear)"
	@echo "make clean      remove $(BUILD)/"

deps:
	@missing=""; for p in libsqlite3-dev libxxhash-dev libclang-14-dev; do \
	    dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if command -v python3 >/dev/null 2>&1 && ! python3 -c 'import ensurepip' >/dev/null 2>&1; then \
	    missing="$$missing python3-venv"; fi; \
	if [ "$$(command -v python3)" = /usr/bin/python3 ] && ! python3 -c 'import os, sys, sysconfig; \
	    sys.exit(not os.path.exists(sysconfig.get_paths()["include"] + "/Python.h"))'; then \
	    missing="$$missing python3-dev"; fi; \
	command -v clang-format >/dev/null 2>&1 || missing="$$missing clang-format"; \
	if [ -n "$$missing" ]; then \
	    echo "installing:$$missing"; \
	    SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	    $$SUDO apt-get update -qq && $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	else echo "deps: all present"; fi
	@test -f $(CUDA_HOME)/include/nvrtc.h || { echo "deps: no CUDA toolkit at $(CUDA_HOME) (set CUDA_HOME)"; exit 1; }

# a fuzz target in the test runner: libFuzzer's entry points renamed after the file
$(BUILD)/obj/tests/fuzz/%.o: ALLCFLAGS += -Itools/cli -DLLVMFuzzerTestOneInput=kiln_$(basename $(notdir $@))_one \
    -DLLVMFuzzerInitialize=kiln_$(basename $(notdir $@))_init

# The float64 references' row blocks (check_common.c): -O3 vectorises their independent sums
# (the same operations in the same order a sum, so the same bits; 1.5-2x on the 2-core box)
$(BUILD)/obj/tools/check/check_common.o: ALLCFLAGS += -O3

$(BUILD)/obj/%.o: %.c $(wildcard include/*.h jit/*.h jit/snippet/*.h cache/*.h runtime/*.h tools/*/*.h tests/*.h templates/common/*.h) $(BUILD)/gen/kiln_gen.h
	@mkdir -p $(dir $@)
	$(CC) $(ALLCFLAGS) -c $< -o $@

$(BUILD)/gen/kiln_gen.h:
	@mkdir -p $(BUILD)/gen
	@echo '/* generated by the Makefile — do not edit */' > $@

$(EMBED): tools/build/embed.c
	@mkdir -p $(dir $@)
	$(CC) -std=c11 -D_GNU_SOURCE $(WARN) -O2 $(SAN) $< -o $@

$(BUILD)/gen/templates.c: $(EMBED) $(TEMPLATES) Makefile
	@mkdir -p $(dir $@)
	$(EMBED) templates $@ $(TEMPLATES:templates/%=%)

$(BUILD)/obj/gen/templates.o: $(BUILD)/gen/templates.c
	@mkdir -p $(dir $@)
	$(CC) $(ALLCFLAGS) -Wno-overlength-strings -c $< -o $@

$(LIB_A): $(LIB_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(LIB_SO): $(LIB_OBJ)
	@mkdir -p $(dir $@)
	$(CC) -shared $(SAN) $(LDFLAGS) -o $@ $^ $(LDLIBS)

# -Wpedantic off: CPython's slot tables hold functions as void *
$(BUILD)/lib/_kiln_hot.abi3.so: python/kiln/hot.c include/kiln.h
	@mkdir -p $(dir $@)
	$(CC) -std=c11 -fPIC -shared -fvisibility=hidden $(filter-out -Wpedantic,$(WARN)) $(CFLAGS) \
	    $(SAN) -Iinclude -isystem $(PY_INC) $(LDFLAGS) -o $@ $<

$(CHECK_A): $(CHECK_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(KILN): $(TOOL_OBJ) $(CHECK_A) $(LIB_A)
	@mkdir -p $(dir $@)
	$(CC) $(SAN) $(LDFLAGS) -o $@ $(TOOL_OBJ) $(CHECK_A) $(LIB_A) $(LDLIBS)

BENCH_OBJ := $(patsubst %.c,$(BUILD)/obj/%.o,$(wildcard tools/bench/*.c))
$(BENCH): $(BENCH_OBJ) $(CHECK_A) $(LIB_A)
	@mkdir -p $(dir $@)
	$(CC) $(SAN) $(LDFLAGS) -o $@ $(BENCH_OBJ) $(CHECK_A) $(LIB_A) $(LDLIBS)

$(TESTS): $(TEST_OBJ) $(CHECK_A) $(LIB_A)
	@mkdir -p $(dir $@)
	$(CC) $(SAN) $(LDFLAGS) -o $@ $(TEST_OBJ) $(CHECK_A) $(LIB_A) $(LDLIBS)

test: deps
	$(MAKE) all
	$(TESTS) --kiln $(KILN)

test-gpu: all
	$(TESTS) --gpu --kiln $(KILN)

test-full: all
	KILN_TEST_FULL=1 $(TESTS) --kiln $(KILN)

bench-gpu: all
	tools/bench/referee.sh all

# The GPU tests' kernels compiled for sm_90a here (no GPU needed), packed for a GPU lease to carry.
# the wgmma probe (tools/probe/wgmma_probe.cu): nvcc for sm_90a; run build/bin/wgmma-probe on an H100 / H200
probe: $(BUILD)/bin/wgmma-probe
$(BUILD)/bin/wgmma-probe: tools/probe/wgmma_probe.cu templates/common/hopper.cuh templates/common/wgmma.cuh templates/common/device.cuh
	@mkdir -p $(dir $@)
	$(CUDA_HOME)/bin/nvcc -std=c++17 -O2 -gencode arch=compute_90a,code=sm_90a -Itemplates -o $@ $<

# gpu-seed's twin tests: lines 'SPEC|TUNE-PREFIX' on stdin, each warmed with KILN_TUNE
# TUNE-PREFIX followed by the loop's $$t (tests/test_batch.c's wgmma_twins cases)
WARM_TWINS = while IFS='|' read -r spec pre; do echo "$$spec arch=sm_90a" | KILN_TUNE=$$pre$$t \
	KILN_CACHE_DIR=$(BUILD)/seed $(KILN) warm --arch sm_90a --jobs 1 - > /dev/null || exit 1; done

gpu-seed: all
	rm -rf $(BUILD)/seed && mkdir -p $(BUILD)/seed .seed
	KILN_CACHE_DIR=$(BUILD)/seed $(KILN) warm --arch sm_90a --jobs $$(nproc) tests/gpu.manifest
	# the Python tests' kernels beyond those (device_tests.sh's python.manifest), once recorded
	if [ -s tests/python.manifest ]; then KILN_CACHE_DIR=$(BUILD)/seed $(KILN) warm \
	    --arch sm_90a --jobs $$(nproc) tests/python.manifest || exit 1; fi
	# the gpu_mma_sync_* tests run the prefill grids once more on the mma.sync family
	grep op=prefill tests/gpu.manifest | KILN_TUNE=wgmma=0 KILN_CACHE_DIR=$(BUILD)/seed \
	    $(KILN) warm --arch sm_90a --jobs $$(nproc) -
	# the gpu_wgmma_pack_* tests run them on the wgmma family with packed rows (pack=1; their
	# groups divide 64, and few-token batches pack on mma.sync as they do by default)
	grep op=prefill tests/gpu.manifest | grep -E ' group=(1|2|4|8|16|32|64) ' | KILN_TUNE=pack=1 \
	    KILN_CACHE_DIR=$(BUILD)/seed $(KILN) warm --arch sm_90a --jobs $$(nproc) -
	# gpu_wgmma_persist_maskdata: the single-request mask-data prefills on the dynamic persistent
	# grid (persist=2, opt-in: its job counter after the tile map)
	grep -E '^op=prefill .*mask_data=' tests/gpu.manifest | grep -v -e kv=ragged -e kv=paged | \
	    KILN_TUNE=persist=2 KILN_CACHE_DIR=$(BUILD)/seed $(KILN) warm --arch sm_90a --jobs $$(nproc) -
	# gpu_batch_fused_merge runs its batch decode kernels fused too (merge=1; the patterns
	# match a few more decode kernels)
	grep -e 'group=4 layout=nhd mask=none window=0 logits=none lse=1 kv=paged arch' \
	    -e 'group=1 layout=nhd mask=none window=0 logits=none lse=1 kv=paged arch' \
	    -e 'head_dim=64 group=4 layout=nhd mask=none window=0 logits=softcap lse=1 kv=ragged arch' \
	    -e 'group=4 layout=nhd mask=none window=0 logits=none lse=1 kv=paged rope=1 arch' \
	    tests/gpu.manifest | grep op=decode | KILN_TUNE=merge=1 KILN_CACHE_DIR=$(BUILD)/seed \
	    $(KILN) warm --arch sm_90a --jobs $$(nproc) -
	# gpu_batch_pdl runs its batch kernels with pdl=0 too (pdl=1 is sm_90a's default)
	grep -x -e 'op=decode dtype=bf16 head_dim=128 group=4 layout=nhd mask=none window=0 logits=none lse=1 kv=paged arch=sm_90a' \
	    -e 'op=decode dtype=bf16 head_dim=128 group=1 layout=nhd mask=none window=0 logits=none lse=1 kv=paged arch=sm_90a' \
	    -e 'op=prefill dtype=bf16 head_dim=128 group=4 layout=nhd mask=none window=0 logits=none lse=1 kv=ragged arch=sm_90a' \
	    tests/gpu.manifest | KILN_TUNE=pdl=0 KILN_CACHE_DIR=$(BUILD)/seed \
	    $(KILN) warm --arch sm_90a --jobs $$(nproc) -
	# gpu_wgmma_xjob: its prefill kernels with xjob=0 and xjob=1 (opt-in), d256 with persist=2
	for t in xjob=0 xjob=1; do printf '%s arch=sm_90a\n' \
	    'op=prefill dtype=bf16 head_dim=128 group=4 kv=ragged mask=causal lse=1' \
	    'op=prefill dtype=bf16 head_dim=128 group=1 kv=paged lse=1' \
	    'op=prefill dtype=bf16 head_dim=64 group=4 kv=ragged mask=causal lse=1' \
	    'op=prefill dtype=bf16 head_dim=128 group=4 kv=paged mask=causal logits=softcap window=1 lse=1' | \
	    KILN_TUNE=$$t KILN_CACHE_DIR=$(BUILD)/seed $(KILN) warm --arch sm_90a --jobs $$(nproc) - || exit 1; \
	    echo 'op=prefill dtype=bf16 head_dim=256 group=4 kv=ragged mask=causal lse=1 arch=sm_90a' | \
	    KILN_TUNE=persist=2,$$t KILN_CACHE_DIR=$(BUILD)/seed $(KILN) warm --arch sm_90a --jobs $$(nproc) - || exit 1; done
	# gpu_wgmma_kvsplit: its twins' kernels, each under its two tunes (tests/test_batch.c)
	for t in kvsplit=0 kvsplit=1; do printf '%s\n' \
	    'op=prefill dtype=bf16 head_dim=128 group=4 kv=ragged mask=causal lse=1|' \
	    'op=prefill dtype=bf16 head_dim=128 group=1 kv=paged lse=1|' \
	    'op=prefill dtype=bf16 head_dim=128 group=4 kv=paged mask=causal lse=1|load=1,' \
	    'op=prefill dtype=f16 head_dim=64 group=4 kv=ragged mask=causal lse=1|persist=1,xjob=1,' \
	    'op=prefill dtype=bf16 head_dim=128 group=4 kv=paged mask=causal logits=softcap window=1 lse=1|' \
	    'op=prefill dtype=bf16 head_dim=256 group=4 kv=ragged mask=causal lse=1|' \
	    'op=prefill dtype=bf16 head_dim=256 group=2 kv=paged lse=1|persist=2,' \
	    'op=prefill q_dtype=bf16 kv_dtype=e4m3 out_dtype=bf16 head_dim=128 group=4 kv=paged mask=causal lse=1|' \
	    'op=prefill q_dtype=f16 kv_dtype=e5m2 out_dtype=f16 head_dim=64 group=4 kv=ragged lse=1|' \
	    'op=prefill dtype=bf16 head_dim=128 group=4 kv=ragged mask=causal rope=1|' | \
	    $(WARM_TWINS) || exit 1; done
	# gpu_wgmma_qregs: its twins' kernels, each under its two tunes (tests/test_batch.c)
	for t in qregs=0 qregs=1; do printf '%s\n' \
	    'op=prefill dtype=bf16 head_dim=128 group=4 kv=ragged mask=causal lse=1|' \
	    'op=prefill dtype=bf16 head_dim=128 group=1 kv=paged lse=1|persist=0,' \
	    'op=prefill dtype=bf16 head_dim=128 group=4 kv=paged mask=causal lse=1|load=1,' \
	    'op=prefill dtype=f16 head_dim=64 group=4 kv=ragged mask=causal lse=1|persist=1,' \
	    'op=prefill dtype=bf16 head_dim=128 group=4 kv=paged mask=causal logits=softcap window=1 lse=1|kvsplit=1,' \
	    'op=prefill q_dtype=bf16 kv_dtype=e4m3 out_dtype=bf16 head_dim=128 group=4 kv=paged mask=causal lse=1|' \
	    'op=prefill dtype=bf16 head_dim=128 group=4 kv=ragged mask=causal rope=1|' | \
	    $(WARM_TWINS) || exit 1; done
	# gpu_batch_decode_ksplit: its kernels under their KILN_TUNE ksplit= (opt-in; tests/test_batch.c)
	t=; printf '%s\n' \
	    'op=decode dtype=bf16 head_dim=128 group=4 kv=paged lse=1|ksplit=4' \
	    'op=decode dtype=bf16 head_dim=128 group=4 kv=paged lse=1|ksplit=2' \
	    'op=decode dtype=f16 head_dim=64 group=4 kv=ragged logits=softcap|ksplit=4' \
	    'op=decode dtype=f16 head_dim=128 group=8 kv=paged logits=alibi window=1 lse=1|ksplit=4' \
	    'op=decode dtype=bf16 head_dim=128 group=16 kv=paged|ksplit=2' \
	    'op=decode dtype=bf16 head_dim=256 group=4 kv=paged lse=1|ksplit=2' \
	    'op=decode q_dtype=bf16 kv_dtype=e4m3 out_dtype=bf16 head_dim=128 group=4 kv=paged lse=1|ksplit=4' | \
	    $(WARM_TWINS) || exit 1
	# gpu_batch_decode_pack_groups, _simt, _hx and _bulk: their kernels under their KILN_TUNE (opt-in)
	t=; printf '%s\n' \
	    'op=decode dtype=bf16 head_dim=128 group=1 kv=paged lse=1|pack=1' \
	    'op=decode dtype=bf16 head_dim=128 group=2 kv=paged lse=1|pack=1' \
	    'op=decode dtype=bf16 head_dim=128 group=3 kv=paged lse=1|pack=1' \
	    'op=decode dtype=bf16 head_dim=128 group=3 kv=paged lse=1|pack=1,merge=1' \
	    'op=decode dtype=f16 head_dim=64 group=5 kv=ragged logits=softcap|pack=1' \
	    'op=decode dtype=bf16 head_dim=256 group=6 kv=paged logits=alibi window=1 lse=1|pack=1' \
	    'op=decode q_dtype=bf16 kv_dtype=e4m3 out_dtype=bf16 head_dim=128 group=7 kv=paged lse=1|pack=1' \
	    'op=decode dtype=bf16 head_dim=128 group=9 kv=paged lse=1|pack=1' \
	    'op=decode dtype=f16 head_dim=128 group=11 kv=ragged lse=1|pack=1' \
	    'op=decode q_dtype=bf16 kv_dtype=e5m2 out_dtype=bf16 head_dim=128 group=13 kv=paged|pack=1' \
	    'op=decode dtype=bf16 head_dim=64 group=15 kv=paged logits=softcap lse=1|pack=1' \
	    'op=decode dtype=bf16 head_dim=128 group=20 kv=paged lse=1|pack=1' \
	    'op=decode dtype=bf16 head_dim=128 group=20 kv=paged lse=1|pack=1,merge=1' \
	    'op=decode q_dtype=bf16 kv_dtype=e4m3 out_dtype=bf16 head_dim=128 group=24 kv=paged|pack=1' \
	    'op=decode dtype=f16 head_dim=64 group=32 kv=ragged lse=1|pack=1' \
	    'op=decode dtype=bf16 head_dim=256 group=17 kv=paged logits=alibi window=1|pack=1' \
	    'op=decode dtype=f16 head_dim=64 group=64 kv=ragged logits=softcap window=1|pack=1' \
	    'op=decode dtype=bf16 head_dim=128 group=1 kv=paged lse=1|pack=0' \
	    'op=decode dtype=f16 head_dim=128 group=1 kv=paged layout=hnd|pack=0' \
	    'op=decode dtype=f16 head_dim=64 group=4 kv=ragged logits=softcap|pack=0' \
	    'op=decode dtype=bf16 head_dim=128 group=8 kv=paged logits=alibi window=1 lse=1|pack=0' \
	    'op=decode dtype=bf16 head_dim=256 group=2 kv=paged lse=1|pack=0' \
	    'op=decode dtype=bf16 head_dim=128 group=1 kv=paged lse=1|pack=0,merge=1' \
	    'op=decode dtype=bf16 head_dim=128 group=4 kv=paged lse=1|hx=1' \
	    'op=decode dtype=f16 head_dim=64 group=8 kv=ragged logits=softcap|hx=1' \
	    'op=decode q_dtype=bf16 kv_dtype=e4m3 out_dtype=bf16 head_dim=128 group=4 kv=paged lse=1|hx=1' \
	    'op=decode dtype=bf16 head_dim=128 group=3 kv=paged lse=1|pack=1,hx=1' \
	    'op=decode dtype=bf16 head_dim=128 group=4 kv=paged lse=1|hx=1,ksplit=2' \
	    'op=decode dtype=bf16 head_dim=128 group=4 kv=paged lse=1|bulk=1' \
	    'op=decode dtype=f16 head_dim=64 group=8 kv=ragged logits=softcap|bulk=1' \
	    'op=decode dtype=bf16 head_dim=256 group=4 kv=paged logits=alibi window=1 lse=1|bulk=1' \
	    'op=decode dtype=bf16 head_dim=128 group=3 kv=paged lse=1|pack=1,bulk=1' \
	    'op=decode dtype=bf16 head_dim=128 group=4 kv=paged lse=1|bulk=1,ksplit=2,hx=1' \
	    'op=decode dtype=bf16 head_dim=128 group=8 kv=paged lse=1|bulk=1,merge=1' \
	    'op=decode dtype=bf16 head_dim=128 group=4 kv=paged lse=1|bulk=2' \
	    'op=decode dtype=bf16 head_dim=128 group=4 kv=paged layout=hnd lse=1|bulk=2' \
	    'op=decode dtype=f16 head_dim=64 group=8 kv=ragged logits=softcap|bulk=2' \
	    'op=decode dtype=bf16 head_dim=256 group=4 kv=paged logits=alibi window=1 lse=1|bulk=2' \
	    'op=decode dtype=bf16 head_dim=128 group=3 kv=paged lse=1|pack=1,bulk=2' \
	    'op=decode dtype=bf16 head_dim=128 group=4 kv=paged lse=1|bulk=2,ksplit=2,hx=1' \
	    'op=decode dtype=bf16 head_dim=128 group=8 kv=paged lse=1|bulk=2,merge=1' | \
	    $(WARM_TWINS) || exit 1
	python3 -c "import sqlite3, sys; sqlite3.connect(sys.argv[1]).execute('PRAGMA wal_checkpoint(TRUNCATE)')" $(BUILD)/seed/kernels.db
	tar -C $(BUILD)/seed -cf - kernels.db nvrtc-version | xz -6 -T0 > .seed/cache.tar.xz
	@ls -l .seed/cache.tar.xz

demo: deps
	$(MAKE) all
	@./tools/scripts/demo.sh $(KILN)

check: test asan ubsan

asan:
	$(MAKE) BUILD=build-asan SAN="-fsanitize=address -fno-omit-frame-pointer" test

ubsan:
	$(MAKE) BUILD=build-ubsan SAN="-fsanitize=undefined -fno-sanitize-recover=undefined" test

FORMAT_FILES = $$(git ls-files '*.c' '*.h' ':!templates/')

# libFuzzer targets (tests/fuzz/fuzz_*.c; clang with ASan and UBSan, in build-fuzz/): `make fuzz`
# builds them and runs each for FUZZ_SECONDS from its seeds (tools/scripts/fuzz.sh); an input
# that crashes one is kept under build-fuzz/crashes/ and ends the run with status 1
FUZZ_SECONDS ?= 60
FUZZ_BIN := $(FUZZ_SRC:tests/fuzz/fuzz_%.c=$(BUILD)/bin/fuzz-%)
FUZZ_SAN := -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer

fuzz:
	$(MAKE) BUILD=build-fuzz CC=clang CFLAGS="-O1 -g" SAN="$(FUZZ_SAN) -fsanitize=fuzzer-no-link" fuzz-build
	tools/scripts/fuzz.sh build-fuzz $(FUZZ_SECONDS)

fuzz-build: $(FUZZ_BIN)

$(BUILD)/bin/fuzz-%: tests/fuzz/fuzz_%.c $(CLI_LIB_OBJ) $(CHECK_A) $(LIB_A)
	@mkdir -p $(dir $@)
	$(CC) $(ALLCFLAGS) -Itools/cli -fsanitize=fuzzer -o $@ $< $(CLI_LIB_OBJ) $(CHECK_A) $(LIB_A) $(LDLIBS)

format:
	clang-format -i $(FORMAT_FILES)

format-check:
	@command -v clang-format >/dev/null || { echo "format-check: no clang-format"; exit 1; }
	clang-format --dry-run -Werror $(FORMAT_FILES)

tidy: $(BUILD)/gen/templates.c
	clang-tidy $$(git ls-files 'jit/*.c' 'cache/*.c' 'runtime/*.c' 'tools/*.c') -- $(ALLCFLAGS)

compdb:
	$(MAKE) clean && bear -- $(MAKE) all

clean:
	rm -rf $(BUILD) build-asan build-ubsan build-release build-fuzz
