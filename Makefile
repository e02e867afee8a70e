# mojo_train -- builds the native libraries from one set of sources, one numeric mode per -DMT_NUMERIC_MODE.
#
#   make                      CPU libraries, all three numeric modes, into native/build/
#   make SABOTAGE=optim       a deliberately broken identical CPU library (cards must fail)
#   make test                 the test suite (builds first)
#   make selfcheck            every card on every loadable vendor's identical numeric mode
#   make cuda / make hip      GPU libraries (need nvcc / hipcc)

PYTHON ?= python3
CC ?= cc
BUILD ?= native/build
UNAME := $(shell uname -s)
SO := $(if $(filter Darwin,$(UNAME)),dylib,so)

# Host code every vendor links beside its kernels (errors, checks, identity, schedules):
# native/common/, which the CPU oracle compiles too; the GPU builds never see cpu_oracle/.
SHARED_HOST_SRC := $(wildcard native/common/*.c)
CPU_SRC := $(wildcard native/cpu_oracle/*.c) $(SHARED_HOST_SRC)
# $(call host_objs,<cc flags>,<dir>): compile SHARED_HOST_SRC into <dir>; host_o lists the objects.
define host_objs
	for f in $(SHARED_HOST_SRC); do $(CC) $(BASE_CFLAGS) $(1) -c $$f -o $(2)/$$(basename $$f .c).o || exit 1; done
endef
host_o = $(patsubst native/common/%.c,$(1)/%.o,$(SHARED_HOST_SRC))
HDRS := $(wildcard native/include/*.h native/common/*.h)
CPU_HDRS := $(HDRS) $(wildcard native/cpu_oracle/*.h)
INCLUDES := -Inative/include -Inative/common
BASE_CFLAGS := -std=c11 -O3 -fPIC -Wall -Wextra -Wno-unused-parameter -Wno-missing-field-initializers -fno-fast-math -fno-math-errno -fvisibility=hidden $(INCLUDES) -D_GNU_SOURCE
LDLIBS := -lm -pthread

# Every library is linked to <lib>$(TMP), then sealed: its digest manifest <lib>.sha256 (sha256sum -c
# format; the loader refuses a library that does not match it) is written first, then the library is
# moved into place, so an interrupted build leaves the library absent or older than its sources.
# TMP holds the recipe shell's pid, so two makes building one library at once do not collide.
TMP = .$$$$.tmp
SHA256 := $(shell command -v sha256sum >/dev/null 2>&1 && echo sha256sum || echo 'shasum -a 256')
# $(call digest,<file to hash>,<library>): write <library>.sha256 for the bytes of <file to hash>.
digest = h=$$($(SHA256) < $(1) | cut -d' ' -f1) && test -n "$$h" && printf '%s  %s\n' "$$h" $(notdir $(2)) > $(2).sha256$(TMP) && mv -f $(2).sha256$(TMP) $(2).sha256
# $(call seal,<library>): <library>$(TMP) becomes <library>, its manifest written first.
seal = $(call digest,$(1)$(TMP),$(1)) && mv -f $(1)$(TMP) $(1)
# macOS records a library's own name in it: the final name, not the temporary one it is linked as.
comma := ,
SONAME = $(if $(filter Darwin,$(UNAME)),-Wl$(comma)-install_name$(comma)@rpath/$(notdir $@))
# $(call with_manifests,<libraries>): the libraries and their manifests, as prerequisites.
with_manifests = $(1) $(addsuffix .sha256,$(1))

# The numeric modes' flags (README "Numeric modes"): identical forbids contraction; the others allow it.
MODE_FLAGS_identical := -DMT_NUMERIC_MODE=0 -ffp-contract=off
MODE_FLAGS_deterministic := -DMT_NUMERIC_MODE=1 -ffp-contract=fast
MODE_FLAGS_fast := -DMT_NUMERIC_MODE=2 -ffp-contract=fast

NUMERIC_MODES := identical deterministic fast
CPU_LIBS := $(foreach t,$(NUMERIC_MODES),$(BUILD)/libmojo_train_cpu_$(t).$(SO))
# identical_ftz's CPU library (its recipe and why it needs clang and llvm-link: below)
FTZ_CLANG ?= clang
FTZ_LLVM_LINK ?= $(shell v=$$($(FTZ_CLANG) -dumpversion 2>/dev/null | cut -d. -f1); command -v llvm-link-$$v 2>/dev/null || command -v llvm-link 2>/dev/null)
FTZ_HAVE_TOOLS := $(if $(and $(shell command -v $(FTZ_CLANG) 2>/dev/null),$(FTZ_LLVM_LINK)),yes,)
FTZ_TARGET ?=
FTZ_IR_BASE := $(FTZ_TARGET) -std=c11 -fPIC -fno-fast-math -fno-math-errno -fvisibility=hidden \
	$(INCLUDES) -D_GNU_SOURCE -DMT_NUMERIC_MODE=3 -DMT_NO_CLONES -ffp-contract=off
FTZ_IR_FLAGS := $(FTZ_IR_BASE) -DMT_VENDOR_NAME='"cpu"'
FTZ_LIB := $(BUILD)/libmojo_train_cpu_identical_ftz.$(SO)

ifdef SABOTAGE
SABOTAGE_FLAG := -DMT_SABOTAGE_$(shell echo $(SABOTAGE) | tr a-z A-Z)
all: $(call with_manifests,$(BUILD)/sabotage-$(SABOTAGE)/libmojo_train_cpu_identical.$(SO))
else
all: $(call with_manifests,$(CPU_LIBS))
# identical_ftz is built by clang for the host's CPU (FTZ_TARGET empty): `make` tries it where the
# tools exist and CC compiles for the same CPU (not beside a cross build), and says so when it
# cannot; `make ftz` insists (.ci/run), as does make portability for its aarch64 build.
arch_of = $(firstword $(subst -, ,$(shell $(1) -dumpmachine 2>/dev/null)))
FTZ_IN_ALL ?= $(if $(FTZ_HAVE_TOOLS),$(if $(filter $(call arch_of,$(FTZ_CLANG)),$(call arch_of,$(CC))),yes))
all: ftz-if-possible metal-emulated-if-possible
endif
ftz-if-possible:
ifeq ($(FTZ_IN_ALL),yes)
	@$(MAKE) --no-print-directory ftz || echo "note: the identical_ftz CPU library was not built (the error is above; make ftz repeats it)"
else ifneq ($(FTZ_IN_ALL),no)
	@echo "note: the identical_ftz CPU library is not built $(if $(FTZ_HAVE_TOOLS),beside a cross build (CC=$(CC)),(it needs clang and llvm-link; Debian: apt-get install clang llvm))"
endif
.PHONY: ftz-if-possible
# The Metal kernels' emulated libraries (make metal-emulated, below): built where a C++ compiler is,
# beside a native build; the suite then runs them as vendor metal_emulated.
METAL_EMU_IN_ALL ?= $(if $(shell command -v $(CXX) 2>/dev/null),$(if $(filter $(call arch_of,$(CXX)),$(call arch_of,$(CC))),yes))
metal-emulated-if-possible:
ifeq ($(METAL_EMU_IN_ALL),yes)
	@$(MAKE) --no-print-directory metal-emulated || echo "note: the emulated Metal libraries were not built (the error is above; make metal-emulated repeats it)"
else ifneq ($(METAL_EMU_IN_ALL),no)
	@echo "note: the emulated Metal libraries are not built (no C++ compiler for this machine: CXX=$(CXX))"
endif
.PHONY: metal-emulated-if-possible

# A library without its manifest (built before manifests existed, or the manifest deleted) is
# rebuilt, so that a manifest only ever vouches for bytes this build wrote (seal); a library
# built here writes its own manifest in its recipe, so it is only an order-only prerequisite.
$(BUILD)/%.$(SO).sha256: | $(BUILD)/%.$(SO)
	rm -f $| && $(MAKE) --no-print-directory $|

# $(call cpu_lib,<C flags of the numeric mode>): the one recipe of a CPU library, the sabotage
# build's included (its flags: the identical mode's and SABOTAGE_FLAG).
define cpu_lib
	@mkdir -p $(dir $@)
	$(CC) $(BASE_CFLAGS) $(1) -DMT_VENDOR_NAME='"cpu"' -shared $(SONAME) -o $@$(TMP) $(CPU_SRC) $(LDLIBS) && $(call seal,$@)
endef

$(BUILD)/libmojo_train_cpu_%.$(SO): $(CPU_SRC) $(CPU_HDRS)
	$(call cpu_lib,$(MODE_FLAGS_$*))

$(BUILD)/sabotage-%/libmojo_train_cpu_identical.$(SO): $(CPU_SRC) $(CPU_HDRS)
	$(call cpu_lib,$(MODE_FLAGS_identical) $(SABOTAGE_FLAG))

# ---- identical_ftz: the CPU oracle under the flush rule (native/contracts/ftz.md) ---------------
# Every source to unoptimized LLVM IR (clang), every float32 operation in it replaced by a call of
# the rule's functions (native/cpu_oracle/mt_ftz_ir.py; it stops the build on anything it cannot
# map), linked with those functions (native/include/mt_ftz.h, plain IEEE code) and made internal,
# then optimized and compiled once. The portable loops (-DMT_NO_CLONES): the AVX-512 GEMM and
# attention forms are vector code the rewrite does not map. Needs clang and the llvm-link of the
# same LLVM version; `make` builds it when both are there and says so when they are not.

$(FTZ_LIB): $(CPU_SRC) $(CPU_HDRS) native/cpu_oracle/mt_ftz_ir.py
	@test -n "$(FTZ_HAVE_TOOLS)" || { echo "identical_ftz needs clang and llvm-link (Debian: apt-get install clang llvm)"; exit 1; }
	@mkdir -p $(dir $@)
	$(PYTHON) native/cpu_oracle/mt_ftz_ir.py --compile $@.o$(TMP) $(FTZ_CLANG) $(FTZ_LLVM_LINK) $(CPU_SRC) -- $(FTZ_IR_FLAGS) \
	    && $(FTZ_CLANG) $(FTZ_TARGET) -shared $(SONAME) -o $@$(TMP) $@.o$(TMP) $(LDLIBS) && rm -f $@.o$(TMP) && $(call seal,$@) \
	    || { rm -f $@.o$(TMP) $@$(TMP); exit 1; }

ftz: $(call with_manifests,$(FTZ_LIB))
.PHONY: ftz

# ---- sanitizers (make asan): the CPU libraries with AddressSanitizer + UndefinedBehaviorSanitizer
# Built into native/build/asan/ from the same recipe; use them with the sanitizer runtimes
# preloaded into Python (`make asan-test` shows how). Not part of `all`.
SANITIZE_FLAGS := -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined
ASAN_LIBS := $(foreach m,$(NUMERIC_MODES),$(BUILD)/asan/libmojo_train_cpu_$(m).$(SO))
ASAN_PRELOAD = $(shell $(CC) -print-file-name=libasan.so):$(shell $(CC) -print-file-name=libubsan.so)
ASAN_TESTS ?= $(XDIST) tests

$(BUILD)/asan/libmojo_train_cpu_%.$(SO): $(CPU_SRC) $(CPU_HDRS)
	$(call cpu_lib,$(MODE_FLAGS_$*) $(SANITIZE_FLAGS))

asan: $(call with_manifests,$(ASAN_LIBS))

# The preload reaches every child process; nvcc itself crashes under it, so the tests that run
# nvcc are left out (they check nvcc's bits against the host compiler's and nvcc's PTX for the
# identical_ftz flags, not the library), and so is
# the emulation of the GPU attention kernels (a program of its own, with its own guard pages; it
# checks the kernels' order of operations, not the library's memory), and the gloo process groups
# of tests/test_distributed.py (their native call, mt_accumulate, runs under the sanitizer in
# tests/test_accumulate.py; four torch processes a test under the preload take minutes; the same
# holds for the demo under torchrun). The host block cache (mojo_train/_host_blocks.py) is off:
# a freed block it kept would hide a use after free from the sanitizer (its tests are left out).
# ASAN_TEST_MODES=identical runs the fixtures' identical numeric mode only (CI does, to fit its time;
# the other modes are the same C code compiled with contraction).
# ASAN_LEAVE_OUT: tests CI leaves out of its run (the long command `make asan-test` runs them all).
ASAN_TEST_MODES ?=
ASAN_LEAVE_OUT ?=
asan-test: asan
	MOJO_TRAIN_TEST_NUMERIC_MODES=$(ASAN_TEST_MODES) \
	LD_PRELOAD=$(ASAN_PRELOAD) ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
	MOJO_TRAIN_HOST_CACHE_MB=0 \
	MOJO_TRAIN_LIBRARY_PATH=$(abspath $(BUILD))/asan MOJO_TRAIN_VENDOR=cpu $(PYTHON) -m pytest -q -p no:cacheprovider \
	--deselect tests/test_pinned_math.py::test_compiles_as_cuda_and_host_bits_match \
	--deselect tests/test_ftz_rule.py::test_the_cuda_identical_ftz_flags_put_ftz_on_every_float32_instruction \
	--ignore=tests/test_attention_emulated.py --ignore=tests/test_distributed.py --ignore=tests/test_host_blocks.py \
	--deselect tests/test_demo.py::test_the_distributed_demo_prints_one_process_digests \
	--deselect tests/test_demo.py::test_a_distributed_demo_that_cannot_split_the_batch_is_refused_on_every_rank \
	$(ASAN_LEAVE_OUT) $(ASAN_TESTS)

# ThreadSanitizer over the tests that run the thread pool or call from several threads. Left
# out: the fork test (TSan cannot follow fork), the nvcc test, and the C host's threads test
# (that host program is not built with TSan and loses its output under the preload), and
# tests/test_sanitizers.py (its liveness checks start their own sanitized children), and the
# demos' thread-count tests (tests/test_demo.py: 120 GPT and 120 MLP steps of 4096 tokens each
# took over 7 minutes under TSan; every op they call has thread tests of its own here). Not part
# of `all`.
TSAN_LIBS := $(foreach m,$(NUMERIC_MODES),$(BUILD)/tsan/libmojo_train_cpu_$(m).$(SO))
TSAN_TESTS ?= tests -k "thread or concurren"
# The interpreter itself, not a wrapper script (a shell wrapper such as pyenv's shim crashes
# with the TSan runtime preloaded).
PYTHON_EXE = $(shell $(PYTHON) -c "import sys; print(sys.executable)")

$(BUILD)/tsan/libmojo_train_cpu_%.$(SO): $(CPU_SRC) $(CPU_HDRS)
	$(call cpu_lib,$(MODE_FLAGS_$*) -O1 -g -fsanitize=thread)

tsan: $(call with_manifests,$(TSAN_LIBS))

tsan-test: tsan
	LD_PRELOAD=$(shell $(CC) -print-file-name=libtsan.so) TSAN_OPTIONS=halt_on_error=1:report_signal_unsafe=0 \
	MOJO_TRAIN_HOST_CACHE_MB=0 \
	MOJO_TRAIN_LIBRARY_PATH=$(abspath $(BUILD))/tsan MOJO_TRAIN_VENDOR=cpu $(PYTHON_EXE) -m pytest -q -p no:cacheprovider \
	--deselect tests/test_fp_environment.py::test_a_forked_child_can_step_after_the_parent_used_the_thread_pool \
	--deselect tests/test_pinned_math.py::test_compiles_as_cuda_and_host_bits_match \
	--deselect tests/test_native.py::test_c_host_threads_reproduce_the_serial_bits --ignore=tests/test_sanitizers.py \
	--ignore=tests/test_host_blocks.py --ignore=tests/test_demo.py $(TSAN_TESTS)

.PHONY: asan asan-test tsan tsan-test

# ---- fuzz (make fuzz): the long run of the hostile-argument suite (tests/test_fuzz.py runs a small,
# derandomized budget of it in `make test`): FUZZ_EXAMPLES examples over every public entry point,
# a random seed, every finding counted; appends its record to bench/results/fuzz.md. Not part of `all`.
FUZZ_EXAMPLES ?= 100000
fuzz: all
	$(PYTHON) bench/fuzz.py --examples $(FUZZ_EXAMPLES)

# fuzz-asan: the same long run against the AddressSanitizer + UBSan libraries (make asan): a memory
# error or undefined behaviour that a hostile argument reaches in the C kills its worker, and the
# run counts it as a crash. Its record: bench/results/fuzz-asan.md. allocator_may_return_null=1: a
# shape too large to allocate gets NULL, as from glibc (MemoryError), where ASan's allocator would
# abort ("allocation-size-too-big": a first, stopped run counted 136 crashes in targets drawing huge shapes).
fuzz-asan: asan
	LD_PRELOAD=$(ASAN_PRELOAD) ASAN_OPTIONS=detect_leaks=0:abort_on_error=1:allocator_may_return_null=1 \
	UBSAN_OPTIONS=print_stacktrace=1 \
	MOJO_TRAIN_HOST_CACHE_MB=0 MOJO_TRAIN_LIBRARY_PATH=$(abspath $(BUILD))/asan MOJO_TRAIN_VENDOR=cpu \
	$(PYTHON) bench/fuzz.py --examples $(FUZZ_EXAMPLES) --out bench/results/fuzz-asan.md

.PHONY: fuzz fuzz-asan

# ---- CUDA (make cuda): the same ABI from native/cuda, one library per numeric mode -------------------
NVCC ?= nvcc
CUDA_ARCH ?= -gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90
CUDA_SRC := $(wildcard native/cuda/*.cu)
CUDA_HDRS := $(wildcard native/cuda/*.h native/cuda/*.cuh) $(HDRS)
NVCC_BASE := -O3 -std=c++17 $(CUDA_ARCH) $(INCLUDES) -Inative/cuda -Xcompiler -fPIC,-fvisibility=hidden,-ffp-contract=off,-fno-math-errno
NVCC_MODE_identical := -DMT_NUMERIC_MODE=0 --fmad=false -prec-div=true -prec-sqrt=true -ftz=false
NVCC_MODE_deterministic := -DMT_NUMERIC_MODE=1 --fmad=true -prec-div=true -prec-sqrt=true -ftz=false
NVCC_MODE_fast := -DMT_NUMERIC_MODE=2 --use_fast_math
# identical_ftz: the device's own flush (-ftz=true: .ftz on every float32 instruction) for the
# rule of native/contracts/ftz.md. Whether the hardware judges tininess before rounding, as the
# rule does, is what its cards' boundary lines (products that round up to FLT_MIN) check on a GPU.
# Its host code (native/common) goes through the CPU oracle's rewrite, as the oracle's does.
NVCC_MODE_identical_ftz := -DMT_NUMERIC_MODE=3 --fmad=false -prec-div=true -prec-sqrt=true -ftz=true
CUDA_MODES := $(NUMERIC_MODES) $(if $(FTZ_HAVE_TOOLS),identical_ftz)
CUDA_LIBS := $(foreach t,$(CUDA_MODES),$(BUILD)/libmojo_train_cuda_$(t).$(SO))

cuda: $(call with_manifests,$(if $(SABOTAGE),$(BUILD)/sabotage-$(SABOTAGE)/libmojo_train_cuda_identical.$(SO),$(CUDA_LIBS)))

# $(call cuda_lib,<host C flags>,<nvcc flags of the numeric mode>,<folder of the host objects>): the
# one recipe of a CUDA library, the sabotage build's included. <lib>.sources: the digest of every
# source it was built from, which bench/device_steps.sh checks before a library travels to the GPU
# machine (file times can say "up to date" of a library built from older sources: a copy that
# keeps times, a restored folder; the nineteenth session's embedding kernels never ran for that).
define cuda_lib
	@mkdir -p $(3)
	$(call host_objs,$(1) -DMT_VENDOR_NAME='"cuda"',$(3))
	$(call cuda_link,$(2),$(call host_o,$(3)))
endef
# $(call cuda_link,<nvcc flags>,<host objects>): nvcc over the kernels and the host objects, sealed, stamped.
define cuda_link
	d=$$($(SHA256) $(CUDA_DIGESTED)) && \
	$(NVCC) $(NVCC_BASE) $(1) -DMT_VENDOR_NAME='"cuda"' -shared -o $@$(TMP) $(CUDA_SRC) $(2) && $(call seal,$@) && \
	printf '%s\n' "$$d" > $@.sources$(TMP) && mv -f $@.sources$(TMP) $@.sources
endef
# $(call ftz_host_obj,<vendor>,<object>): native/common under identical_ftz's rule, as one object.
define ftz_host_obj
	@test -n "$(FTZ_HAVE_TOOLS)" || { echo "identical_ftz needs clang and llvm-link (Debian: apt-get install clang llvm)"; exit 1; }
	@mkdir -p $(dir $(2))
	$(PYTHON) native/cpu_oracle/mt_ftz_ir.py --compile-part $(2) $(FTZ_CLANG) $(FTZ_LLVM_LINK) $(SHARED_HOST_SRC) -- \
	    $(FTZ_IR_BASE) -DMT_VENDOR_NAME='"$(1)"'
endef

# The files a CUDA library is built from, flags included (the Makefile): their digest is taken
# before nvcc starts (an edit during the build makes the library stale, not its stamp) and kept
# as <lib>.sources; `make cuda-sources` prints today's, which bench/device_steps.sh compares.
CUDA_DIGESTED = $(CUDA_SRC) $(CUDA_HDRS) $(SHARED_HOST_SRC) native/cpu_oracle/mt_ftz_ir.py Makefile
cuda-sources:
	@$(SHA256) $(CUDA_DIGESTED)

.PHONY: cuda-sources

$(BUILD)/libmojo_train_cuda_%.$(SO): $(CUDA_SRC) $(CUDA_HDRS) $(SHARED_HOST_SRC)
	$(call cuda_lib,$(MODE_FLAGS_$*),$(NVCC_MODE_$*),$(BUILD)/obj-cuda-$*)

$(BUILD)/sabotage-%/libmojo_train_cuda_identical.$(SO): $(CUDA_SRC) $(CUDA_HDRS) $(SHARED_HOST_SRC)
	$(call cuda_lib,$(MODE_FLAGS_identical) $(SABOTAGE_FLAG),$(NVCC_MODE_identical) $(SABOTAGE_FLAG),$(BUILD)/sabotage-$*/obj)

$(BUILD)/libmojo_train_cuda_identical_ftz.$(SO): $(CUDA_SRC) $(CUDA_HDRS) $(SHARED_HOST_SRC) native/cpu_oracle/mt_ftz_ir.py
	$(call ftz_host_obj,cuda,$(BUILD)/obj-cuda-identical_ftz/host.o)
	$(call cuda_link,$(NVCC_MODE_identical_ftz),$(BUILD)/obj-cuda-identical_ftz/host.o)

# The float-behaviour probe on an NVIDIA GPU, with identical_ftz's device flags (bench/ftz_probe_cuda.cu).
$(BUILD)/ftz_probe_cuda: bench/ftz_probe_cuda.cu native/metal/mt_ftz_probe_cases.c native/metal/mt_ftz_probe_cases.h \
		native/metal/mt_ftz_probe_ops.h native/metal/mt_metal_options.h native/include/mt_ftz.h
	@mkdir -p $(dir $@)
	$(CC) -std=c99 -O2 -ffp-contract=off -fno-fast-math $(INCLUDES) -Inative/metal -c native/metal/mt_ftz_probe_cases.c \
	    -o $@.cases$(TMP).o && $(NVCC) -O2 $(CUDA_ARCH) $(INCLUDES) -Inative/metal $(NVCC_MODE_identical_ftz) \
	    -Xcompiler -ffp-contract=off -o $@ bench/ftz_probe_cuda.cu $@.cases$(TMP).o; rc=$$?; rm -f $@.cases$(TMP).o; exit $$rc

# The sweep of the unguarded quotient and root on an NVIDIA GPU, under an exact mode's device flags
# (bench/unguarded_sweep_cuda.cu): native/build/unguarded_sweep_cuda_identical and _identical_ftz.
$(BUILD)/unguarded_sweep_cuda_%: bench/unguarded_sweep_cuda.cu $(HDRS)
	@mkdir -p $(dir $@)
	$(NVCC) -O3 -std=c++17 $(CUDA_ARCH) $(INCLUDES) $(NVCC_MODE_$*) -Xcompiler -ffp-contract=off,-fno-math-errno -o $@ $<

check-cuda:
	$(PYTHON) bench/check_cuda.py

# The suite runs on every core when pytest-xdist is installed (README's set-up command installs
# it): one worker process per logical core (xdist's `auto` counts physical cores where psutil is
# installed: one on a 2-vCPU hyperthreaded runner); TEST_WORKERS=1 (or empty) runs it in this
# process. The tests keep no state between files that a worker could miss, and the GPU machine's
# runs use it too.
TEST_WORKERS ?= logical
XDIST = $(shell $(PYTHON) -c "import xdist" 2>/dev/null && test -n "$(TEST_WORKERS)" && test "$(TEST_WORKERS)" != 1 \
	&& echo "-n $(TEST_WORKERS)")

test: all
	$(PYTHON) -m pytest -q $(XDIST) tests

selfcheck: all
	$(PYTHON) -m mojo_train selfcheck

demo: selfcheck
	$(PYTHON) -m mojo_train demo

clean:
	rm -rf $(BUILD)

.PHONY: all test selfcheck demo clean cuda check-cuda

# ---- HIP (make hip): the very same native/cuda sources, compiled as HIP for AMD -------------
# No kernel source of its own: native/cuda/*.cu go through hipcc with -x hip, and the
# portability header native/cuda/mt_gpu.h picks HIP's spellings (MT_HIP). Debian's hipcc
# (HIP 5.2, clang 15) targets gfx90a. Compile-checked only (native/hip/README.md says why).
# The numeric modes mirror the CUDA ones: identical = no contraction, correctly rounded fp32 divide
# and sqrt, subnormals kept (the explicit flags restate clang 15's HIP defaults, except
# -ffp-contract, whose HIP default is fast-honor-pragmas); deterministic = the same with
# contraction; fast = nvcc's --use_fast_math on the device only (-Xarch_device keeps
# -ffast-math off the host code and crtfastmath.o, which would set FTZ/DAZ for the whole
# process that loads the library, out of the link).
HIPCC ?= hipcc
HIP_ARCH ?= --offload-arch=gfx90a
HIPCC_BASE := -O3 -std=c++17 $(HIP_ARCH) $(INCLUDES) -Inative/cuda -DMT_HIP -fPIC -fvisibility=hidden -fno-math-errno -Wno-unused-result
HIPCC_EXACT := -fhip-fp32-correctly-rounded-divide-sqrt -fno-gpu-flush-denormals-to-zero
HIPCC_MODE_identical := -DMT_NUMERIC_MODE=0 -ffp-contract=off -fno-fast-math $(HIPCC_EXACT)
HIPCC_MODE_deterministic := -DMT_NUMERIC_MODE=1 -ffp-contract=fast -fno-fast-math $(HIPCC_EXACT)
HIPCC_MODE_fast := -DMT_NUMERIC_MODE=2 -ffp-contract=fast -Xarch_device -ffast-math -fgpu-flush-denormals-to-zero -fno-hip-fp32-correctly-rounded-divide-sqrt
# identical_ftz: identical's flags with the device's flush on (the rule's tininess unmeasured on AMD)
HIPCC_MODE_identical_ftz := -DMT_NUMERIC_MODE=3 -ffp-contract=off -fno-fast-math -fhip-fp32-correctly-rounded-divide-sqrt \
	-fgpu-flush-denormals-to-zero
HIP_LIBS := $(foreach t,$(CUDA_MODES),$(BUILD)/libmojo_train_hip_$(t).$(SO))

hip: $(call with_manifests,$(if $(SABOTAGE),$(BUILD)/sabotage-$(SABOTAGE)/libmojo_train_hip_identical.$(SO),$(HIP_LIBS)))

# $(call hip_lib,<host C flags>,<hipcc flags of the numeric mode>,<folder of the host objects>): the
# one recipe of a HIP library, the sabotage build's included.
define hip_lib
	@mkdir -p $(3)
	$(call host_objs,$(1) -DMT_VENDOR_NAME='"hip"',$(3))
	$(call hip_link,$(2),$(call host_o,$(3)))
endef
define hip_link
	HIP_PLATFORM=amd $(HIPCC) $(HIPCC_BASE) $(1) -DMT_VENDOR_NAME='"hip"' -shared -o $@$(TMP) -x hip $(CUDA_SRC) -x none $(2) && $(call seal,$@)
endef

$(BUILD)/libmojo_train_hip_%.$(SO): $(CUDA_SRC) $(CUDA_HDRS) $(SHARED_HOST_SRC)
	$(call hip_lib,$(MODE_FLAGS_$*),$(HIPCC_MODE_$*),$(BUILD)/obj-hip-$*)

$(BUILD)/sabotage-%/libmojo_train_hip_identical.$(SO): $(CUDA_SRC) $(CUDA_HDRS) $(SHARED_HOST_SRC)
	$(call hip_lib,$(MODE_FLAGS_identical) $(SABOTAGE_FLAG),$(HIPCC_MODE_identical) $(SABOTAGE_FLAG),$(BUILD)/sabotage-$*/obj-hip)

$(BUILD)/libmojo_train_hip_identical_ftz.$(SO): $(CUDA_SRC) $(CUDA_HDRS) $(SHARED_HOST_SRC) native/cpu_oracle/mt_ftz_ir.py
	$(call ftz_host_obj,hip,$(BUILD)/obj-hip-identical_ftz/host.o)
	$(call hip_link,$(HIPCC_MODE_identical_ftz),$(BUILD)/obj-hip-identical_ftz/host.o)

.PHONY: hip

# ---- math sweep (make math-sweep): the pinned math routines over all 2^32 floats -------------
# An exhaustive check of mt_pinned.h's pinned exp, log, log1p, erf, tanh and 1 + erf against glibc's double (long
# double near rounding boundaries), multithreaded (MATH_SWEEP_THREADS); prints one table row per
# routine: max ulp error, inputs not correctly rounded, the worst input, special values.
# Record runs in bench/results/math_sweep.md. Not part of `all`: a few minutes on two cores.
MATH_SWEEP_THREADS ?= 2
MATH_SWEEP_CC ?= gcc
$(BUILD)/math_sweep: bench/math_sweep.c $(wildcard native/include/mt_pinned*.h)
	@mkdir -p $(dir $@)
	$(MATH_SWEEP_CC) -O2 -ffp-contract=off -Inative/include -pthread -o $@ bench/math_sweep.c -lm

math-sweep: $(BUILD)/math_sweep
	$(BUILD)/math_sweep -t $(MATH_SWEEP_THREADS)

.PHONY: math-sweep

# ---- C example (make example): examples/train_xor.c trains through mojo_train.h alone ---------
# Built into native/build/ beside the library it links (rpath: the binary's own folder), then
# run from another folder, as a C host outside the repository would run it.
EXAMPLE_RPATH := $(if $(filter Darwin,$(UNAME)),@loader_path,'$$ORIGIN')
$(BUILD)/train_xor: examples/train_xor.c native/include/mojo_train.h $(BUILD)/libmojo_train_cpu_identical.$(SO)
	$(CC) -std=c11 -O2 -Wall -Wextra -Inative/include -o $@ examples/train_xor.c -L$(BUILD) -lmojo_train_cpu_identical -Wl,-rpath,$(EXAMPLE_RPATH)

example: $(BUILD)/train_xor
	cd "$${TMPDIR:-/tmp}" && $(abspath $(BUILD))/train_xor

.PHONY: example

# ---- Metal (macOS only): the library and the float-behaviour probe (native/metal/) ---------------
# make metal builds native/build/libmojo_train_metal_identical_ftz.dylib (Apple GPUs flush float32
# subnormals, so identical_ftz is the one mode they can meet): the host code (native/common and
# native/metal/mt_metal_*.c) under the flush rule's rewrite, as every identical_ftz build (clang and
# llvm-link of one LLVM version: Homebrew's llvm, FTZ_CLANG=$$(brew --prefix llvm)/bin/clang), the
# kernel sources embedded as one string (mt_metal_amalgamate.py) that the runtime
# (mt_metal_runtime.m) compiles without fast math at first use.
METAL_HOST_SRC := $(wildcard native/metal/mt_metal_*.c)
METAL_KERNEL_SRC := $(wildcard native/metal/mt_metal_*.metal)
METAL_HDRS := $(wildcard native/metal/*.h native/metal/emulator/*.h) native/metal/shim/metal_stdlib
METAL_LIB := $(BUILD)/libmojo_train_metal_identical_ftz.$(SO)
$(BUILD)/metal/mt_metal_source.c: $(METAL_KERNEL_SRC) $(METAL_HDRS) $(HDRS) native/metal/mt_metal_amalgamate.py
	@mkdir -p $(dir $@)
	$(PYTHON) native/metal/mt_metal_amalgamate.py $@

$(METAL_LIB): $(SHARED_HOST_SRC) $(METAL_HOST_SRC) $(HDRS) $(METAL_HDRS) native/metal/mt_metal_runtime.m \
		$(BUILD)/metal/mt_metal_source.c native/cpu_oracle/mt_ftz_ir.py
	@test "$(UNAME)" = Darwin || { echo "the Metal library builds on macOS only (make metal-emulated runs its kernels here)"; exit 1; }
	@test -n "$(FTZ_HAVE_TOOLS)" || { echo "identical_ftz needs clang and llvm-link of one version (brew install llvm; FTZ_CLANG=\$$(brew --prefix llvm)/bin/clang)"; exit 1; }
	$(PYTHON) native/cpu_oracle/mt_ftz_ir.py --compile-part $(BUILD)/metal/host.o $(FTZ_CLANG) $(FTZ_LLVM_LINK) \
	    $(SHARED_HOST_SRC) $(METAL_HOST_SRC) -- $(FTZ_IR_BASE) -DMT_VENDOR_NAME='"metal"' -Inative/metal
	$(CC) -O2 -fPIC -c $(BUILD)/metal/mt_metal_source.c -o $(BUILD)/metal/source.o
	$(CC) -O2 -fPIC -fobjc-arc -fvisibility=hidden $(INCLUDES) -Inative/metal -c native/metal/mt_metal_runtime.m \
	    -o $(BUILD)/metal/runtime.o
	$(CC) -shared $(SONAME) -o $@$(TMP) $(BUILD)/metal/host.o $(BUILD)/metal/source.o $(BUILD)/metal/runtime.o \
	    -framework Metal -framework Foundation -framework CoreGraphics $(LDLIBS) && $(call seal,$@)

metal: $(call with_manifests,$(METAL_LIB))
.PHONY: metal

# make metal-probe builds native/build/mt_ftz_probe; run it with the kernel's path, it prints a JSON
# report of how the Mac's GPU treats subnormals (.github/workflows/macos.yml keeps it).
$(BUILD)/mt_ftz_probe: native/metal/mt_ftz_probe.m native/metal/mt_ftz_probe_cases.c native/metal/mt_ftz_probe_cases.h \
		native/metal/mt_ftz_probe_ops.h native/metal/mt_metal_options.h native/include/mt_ftz.h
	@test "$(UNAME)" = Darwin || { echo "the Metal probe builds on macOS only"; exit 1; }
	@mkdir -p $(dir $@)
	$(CC) -O2 -ffp-contract=off -fno-fast-math -fobjc-arc -Inative/include -Inative/metal -o $@ native/metal/mt_ftz_probe.m \
	    native/metal/mt_ftz_probe_cases.c -framework Metal -framework Foundation

metal-probe: $(BUILD)/mt_ftz_probe

.PHONY: metal-probe

# ---- Metal on a CPU (make metal-emulated): the Metal kernel sources run by an emulator ---------
# native/metal/'s kernels compiled as C++ through the shim (native/metal/shim/metal_stdlib) and run
# one threadgroup at a time by native/metal/emulator/, behind the very host code the macOS library
# has (native/metal/mt_metal_*.c over mt_metal_runtime.h): vendor metal_emulated, so the cards and
# the suite check the kernels' indexing, trees and refusals here. identical_ftz puts the kernels'
# and the host's float32 arithmetic under the flush rule (mt_ftz_ir.py), standing for a GPU that
# follows native/contracts/ftz.md; identical runs them under IEEE gradual underflow.
CXX ?= c++
METAL_EMU_DEPS := $(SHARED_HOST_SRC) $(METAL_HOST_SRC) $(METAL_KERNEL_SRC) $(METAL_HDRS) $(HDRS) \
	$(wildcard native/metal/emulator/*.cpp) native/cpu_oracle/mt_ftz_ir.py
METAL_EMU_MODES := identical $(if $(FTZ_HAVE_TOOLS),identical_ftz)
METAL_EMU_LIBS := $(foreach t,$(METAL_EMU_MODES),$(BUILD)/libmojo_train_metal_emulated_$(t).$(SO))
METAL_EMU_CXXFLAGS := -std=c++17 -fPIC -fno-fast-math -fno-math-errno -ffp-contract=off -fvisibility=hidden \
	-Wno-unknown-pragmas -Wno-attributes $(INCLUDES) -Inative/metal -Inative/metal/shim
METAL_EMU_NAME := -DMT_VENDOR_NAME='"metal_emulated"'

$(BUILD)/libmojo_train_metal_emulated_identical.$(SO): $(METAL_EMU_DEPS)
	@rm -rf $(BUILD)/obj-metal-emulated-identical && mkdir -p $(BUILD)/obj-metal-emulated-identical   # no object of a removed source
	for f in $(SHARED_HOST_SRC) $(METAL_HOST_SRC); do $(CC) $(BASE_CFLAGS) $(MODE_FLAGS_identical) $(METAL_EMU_NAME) \
	    -Inative/metal -c $$f -o $(BUILD)/obj-metal-emulated-identical/$$(basename $$f .c).o || exit 1; done
	$(CXX) $(METAL_EMU_CXXFLAGS) -O2 -DMT_NUMERIC_MODE=0 -c native/metal/emulator/mt_metal_emulator_kernels.cpp \
	    -o $(BUILD)/obj-metal-emulated-identical/kernels.o
	$(CXX) -std=c++17 -O2 -fPIC -fvisibility=hidden $(INCLUDES) -Inative/metal -c native/metal/emulator/mt_metal_emulator.cpp \
	    -o $(BUILD)/obj-metal-emulated-identical/runtime.o
	$(CXX) -shared $(SONAME) -o $@$(TMP) $(BUILD)/obj-metal-emulated-identical/*.o $(LDLIBS) && $(call seal,$@)

$(BUILD)/libmojo_train_metal_emulated_identical_ftz.$(SO): $(METAL_EMU_DEPS)
	@test -n "$(FTZ_HAVE_TOOLS)" || { echo "identical_ftz needs clang and llvm-link (Debian: apt-get install clang llvm)"; exit 1; }
	@rm -rf $(BUILD)/obj-metal-emulated-identical_ftz && mkdir -p $(BUILD)/obj-metal-emulated-identical_ftz
	$(PYTHON) native/cpu_oracle/mt_ftz_ir.py --compile-part $(BUILD)/obj-metal-emulated-identical_ftz/host.o $(FTZ_CLANG) \
	    $(FTZ_LLVM_LINK) $(SHARED_HOST_SRC) $(METAL_HOST_SRC) -- $(FTZ_IR_BASE) $(METAL_EMU_NAME) -Inative/metal
	$(PYTHON) native/cpu_oracle/mt_ftz_ir.py --compile-part $(BUILD)/obj-metal-emulated-identical_ftz/kernels.o $(FTZ_CLANG) \
	    $(FTZ_LLVM_LINK) native/metal/emulator/mt_metal_emulator_kernels.cpp -- $(FTZ_TARGET) -x c++ $(METAL_EMU_CXXFLAGS) \
	    -DMT_NUMERIC_MODE=3
	$(FTZ_CLANG)++ $(FTZ_TARGET) -std=c++17 -O2 -fPIC -fvisibility=hidden $(INCLUDES) -Inative/metal \
	    -c native/metal/emulator/mt_metal_emulator.cpp -o $(BUILD)/obj-metal-emulated-identical_ftz/runtime.o
	$(FTZ_CLANG)++ $(FTZ_TARGET) -shared $(SONAME) -o $@$(TMP) $(BUILD)/obj-metal-emulated-identical_ftz/*.o $(LDLIBS) \
	    && $(call seal,$@)

metal-emulated: $(call with_manifests,$(METAL_EMU_LIBS))
.PHONY: metal-emulated

# ---- portability (make portability): the CPU oracle's cards from other compilers and CPUs -----
# Every card, identical numeric mode, from three more builds of the very same sources: clang on
# this host, and gcc and clang for aarch64 (clang's builds also make identical_ftz, whose cards
# then run too: the flush rule's functions give the same bits on both CPU families); the aarch64 libraries are run by Python for aarch64
# under qemu-aarch64 (user mode), with Debian's interpreter fetched into $(AARCH64_PY) by
# tests/cross/aarch64_python.sh. The one card reader (python -m mojo_train selfcheck) checks each
# build; any differing line fails the target. Needs clang, gcc-aarch64-linux-gnu, libc6-dev-arm64-cross and qemu-user
# (Debian's packages; .ci/run installs them). Not part of `all`: 3 min 21 s here from nothing
# (the interpreter fetched, the 9 libraries built, 3 x 13 cards).
CLANG ?= clang
AARCH64_GCC ?= aarch64-linux-gnu-gcc
AARCH64_CLANG ?= $(CLANG) --target=aarch64-linux-gnu
AARCH64_PY ?= $(BUILD)/aarch64-python
PORTABLE_BUILDS := clang aarch64-gcc aarch64-clang
# $(call run_cards,<build folder>,<python command>): every card against that folder's libraries.
# It first makes sure that the library loaded is that build's (the loader would fall back to another).
run_cards = export MOJO_TRAIN_VENDOR=cpu MOJO_TRAIN_LIBRARY_PATH=$(abspath $(BUILD))/$(1) PYTHONPATH=$(CURDIR) && \
	$(2) -c "import mojo_train, platform, sys; p = mojo_train.backend_info()['path']; \
	print('cards against', p, 'on', platform.machine()); \
	sys.exit(None if p.startswith('$(abspath $(BUILD))/$(1)/') else 'that is not the $(1) build')" && \
	{ test "$(1)" = aarch64-gcc || $(2) -c "import mojo_train, sys; p = mojo_train.backend_info('identical_ftz')['path']; \
	sys.exit(None if p.startswith('$(abspath $(BUILD))/$(1)/') else 'identical_ftz: ' + p + ' is not the $(1) build')"; } && \
	$(2) -m mojo_train selfcheck

# The builds use both cores, and the three card runs go side by side (each one process; the two
# under qemu take the longest), each run's output kept together (--output-sync).
AARCH64_RUN = qemu-aarch64 -L $(AARCH64_PY) $(AARCH64_PY)/usr/bin/python3.11
portability:
	$(MAKE) --no-print-directory -j2 CC="$(CLANG)" BUILD=$(BUILD)/clang FTZ_IN_ALL=no METAL_EMU_IN_ALL=no all ftz
	$(MAKE) --no-print-directory -j2 CC="$(AARCH64_GCC)" BUILD=$(BUILD)/aarch64-gcc
	$(MAKE) --no-print-directory -j2 CC="$(AARCH64_CLANG)" BUILD=$(BUILD)/aarch64-clang FTZ_IN_ALL=no \
	    FTZ_TARGET=--target=aarch64-linux-gnu all ftz
	sh tests/cross/aarch64_python.sh $(AARCH64_PY)
	$(MAKE) --no-print-directory -j3 --output-sync=target $(PORTABLE_CARDS)

# A static pattern rule, so that the card runs can be phony (a file of that name cannot skip one).
PORTABLE_CARDS := $(addprefix portable-cards-,$(PORTABLE_BUILDS))
$(PORTABLE_CARDS): portable-cards-%:
	$(call run_cards,$*,$(if $(filter aarch64-%,$*),$(AARCH64_RUN),$(PYTHON)))

.PHONY: portability $(PORTABLE_CARDS)

# ---- GPU sanitizers (make sanitize-cuda): compute-sanitizer's memcheck, racecheck, initcheck and
# synccheck over every card on host and device buffers, each tool first shown live on a planted
# defect (bench/sanitizer_canaries.cu). Needs a GPU; record: bench/results/sanitize-cuda.md.
# Under an MPS daemon of its own by default (racecheck's one-SM launches then share the SMs:
# ~10x the time-sliced rate on the H200); SANITIZE_CUDA_ARGS= runs time-sliced, and takes the
# script's other options (--resume, --deadline S, --cards ..., --runs REGEX, --windows K ...).
SANITIZE_CUDA_ARGS ?= --mps
sanitize-cuda:
	$(PYTHON) bench/sanitize_cuda.py $(SANITIZE_CUDA_ARGS)

.PHONY: sanitize-cuda
