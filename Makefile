# mojo_train -- builds the native libraries from one set of sources, one tier per -DMT_TIER.
#
#   make                      CPU libraries, all three tiers, into native/build/
#   make SABOTAGE=optim       a deliberately broken identical CPU library (cards must fail)
#   make test                 the test suite (builds first)
#   make selfcheck            every card on every loadable vendor's identical tier
#   make cuda / make hip      GPU libraries (need nvcc / hipcc)

PYTHON ?= python3
CC ?= cc
BUILD ?= native/build
UNAME := $(shell uname -s)
SO := $(if $(filter Darwin,$(UNAME)),dylib,so)

CPU_SRC := $(wildcard native/cpu_oracle/*.c)
HDRS := $(wildcard native/include/*.h native/cpu_oracle/*.h)
INCLUDES := -Inative/include -Inative/cpu_oracle
BASE_CFLAGS := -std=c11 -O3 -fPIC -Wall -Wextra -Wno-unused-parameter -Wno-missing-field-initializers -fno-fast-math -fno-math-errno -fvisibility=hidden $(INCLUDES) -D_GNU_SOURCE
LDLIBS := -lm -pthread

# The tiers' flags (README "Tiers"): identical forbids contraction; the others allow it.
TIER_FLAGS_identical := -DMT_TIER=0 -ffp-contract=off
TIER_FLAGS_deterministic := -DMT_TIER=1 -ffp-contract=fast
TIER_FLAGS_fast := -DMT_TIER=2 -ffp-contract=fast

TIERS := identical deterministic fast
CPU_LIBS := $(foreach t,$(TIERS),$(BUILD)/libmojo_train_cpu_$(t).$(SO))

ifdef SABOTAGE
SABOTAGE_FLAG := -DMT_SABOTAGE_$(shell echo $(SABOTAGE) | tr a-z A-Z)
all: $(BUILD)/sabotage-$(SABOTAGE)/libmojo_train_cpu_identical.$(SO)
else
all: $(CPU_LIBS)
endif

$(BUILD)/libmojo_train_cpu_%.$(SO): $(CPU_SRC) $(HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(BASE_CFLAGS) $(TIER_FLAGS_$*) -DMT_VENDOR_NAME='"cpu"' -shared -o $@ $(CPU_SRC) $(LDLIBS)

$(BUILD)/sabotage-%/libmojo_train_cpu_identical.$(SO): $(CPU_SRC) $(HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(BASE_CFLAGS) $(TIER_FLAGS_identical) $(SABOTAGE_FLAG) -DMT_VENDOR_NAME='"cpu"' -shared -o $@ $(CPU_SRC) $(LDLIBS)

# ---- CUDA (make cuda): the same ABI from native/cuda, one library per tier -------------------
NVCC ?= nvcc
CUDA_ARCH ?= -gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90
CUDA_SRC := $(wildcard native/cuda/*.cu)
CUDA_HDRS := $(wildcard native/cuda/*.h native/cuda/*.cuh) $(HDRS)
NVCC_BASE := -O3 -std=c++17 $(CUDA_ARCH) $(INCLUDES) -Inative/cuda -Xcompiler -fPIC,-fvisibility=hidden,-ffp-contract=off,-fno-math-errno
NVCC_TIER_identical := -DMT_TIER=0 --fmad=false -prec-div=true -prec-sqrt=true -ftz=false
NVCC_TIER_deterministic := -DMT_TIER=1 --fmad=true -prec-div=true -prec-sqrt=true -ftz=false
NVCC_TIER_fast := -DMT_TIER=2 --use_fast_math
CUDA_LIBS := $(foreach t,$(TIERS),$(BUILD)/libmojo_train_cuda_$(t).$(SO))

cuda: $(if $(SABOTAGE),$(BUILD)/sabotage-$(SABOTAGE)/libmojo_train_cuda_identical.$(SO),$(CUDA_LIBS))

$(BUILD)/libmojo_train_cuda_%.$(SO): $(CUDA_SRC) $(CUDA_HDRS) native/cpu_oracle/mt_host.c
	@mkdir -p $(BUILD)/obj-cuda-$*
	$(CC) $(BASE_CFLAGS) $(TIER_FLAGS_$*) -DMT_VENDOR_NAME='"cuda"' -c native/cpu_oracle/mt_host.c -o $(BUILD)/obj-cuda-$*/mt_host.o
	$(NVCC) $(NVCC_BASE) $(NVCC_TIER_$*) -DMT_VENDOR_NAME='"cuda"' -shared -o $@ $(CUDA_SRC) $(BUILD)/obj-cuda-$*/mt_host.o

$(BUILD)/sabotage-%/libmojo_train_cuda_identical.$(SO): $(CUDA_SRC) $(CUDA_HDRS) native/cpu_oracle/mt_host.c
	@mkdir -p $(BUILD)/sabotage-$*/obj
	$(CC) $(BASE_CFLAGS) $(TIER_FLAGS_identical) -DMT_VENDOR_NAME='"cuda"' -c native/cpu_oracle/mt_host.c -o $(BUILD)/sabotage-$*/obj/mt_host.o
	$(NVCC) $(NVCC_BASE) $(NVCC_TIER_identical) $(SABOTAGE_FLAG) -DMT_VENDOR_NAME='"cuda"' -shared -o $@ $(CUDA_SRC) $(BUILD)/sabotage-$*/obj/mt_host.o

check-cuda:
	$(PYTHON) bench/check_cuda.py

test: all
	$(PYTHON) -m pytest -q tests

selfcheck: all
	$(PYTHON) -m mojo_train selfcheck

demo: selfcheck

clean:
	rm -rf $(BUILD)

.PHONY: all test selfcheck demo clean cuda check-cuda
