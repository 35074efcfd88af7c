# train_sdc build. `make` builds the trainers and their tests: the CPU trainer and tests, and the CUDA
# trainer and tests when nvcc is present; `make test` builds the rest (the emulated CUDA binaries, the
# Python environment, the reference checkpoints) and runs every test. Autodetects mpicc (MPI data parallelism)
# and OpenMP, and says what it found. -fno-trapping-math -fno-math-errno change no value (IEEE results
# stay exact; only FP exception flags and errno are ignored) and let the lane loops vectorise.
#   make NATIVE=0      portable build without -march=native
#   make NO_MPI=1      single-process build even where mpicc exists
#   make NO_CUDA=1     no CUDA targets even where nvcc exists
# A change of configuration (these switches, GPU_ARCH, mpicc or nvcc appearing, the compiler) rebuilds
# every binary it concerns: build/config-c.stamp and build/config-cuda.stamp record it.
# the first rule a bare `make` runs (the configuration stamps below are rules too, and come first)
.DEFAULT_GOAL := all
CC_PLAIN ?= cc
PYTHON ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
SHARED_DATA ?= $(abspath ../shared/data)

CFLAGS := -O3 -fno-trapping-math -fno-math-errno -std=gnu11 -Wall -Wextra -Wno-unused-function -Wno-unused-parameter -Wno-stringop-truncation -Wno-format-truncation
ifneq ($(NATIVE),0)
  CFLAGS += -march=native
endif
LDLIBS := -lm

# OpenMP
OMP_OK := $(shell echo 'int main(){return 0;}' | $(CC_PLAIN) -fopenmp -x c - -o /dev/null 2>/dev/null && echo yes)
ifeq ($(OMP_OK),yes)
  CFLAGS += -fopenmp
  $(info [make] OpenMP: yes)
else
  $(info [make] OpenMP: not found, building single-threaded)
endif

# MPI
MPICC := $(shell command -v mpicc 2>/dev/null)
ifeq ($(NO_MPI),1)
  MPICC :=
endif
ifneq ($(MPICC),)
  TRAIN_CC := $(MPICC)
  TRAIN_FLAGS := -DUSE_MPI
  $(info [make] MPI: yes ($(MPICC)), train_sdc runs data-parallel under mpirun)
else
  TRAIN_CC := $(CC_PLAIN)
  TRAIN_FLAGS :=
  $(info [make] MPI: no mpicc, train_sdc is built single-process (apt-get install openmpi-bin libopenmpi-dev))
endif

# CUDA: the GPU trainer and its tests, when nvcc is present. GPU_ARCH picks the target (90: H100/H200,
# 80: A100); `make cuda-check` compiles every CUDA file for both sm_90 and sm_80 (CI runs it).
NVCC := $(shell command -v nvcc 2>/dev/null)
ifeq ($(NO_CUDA),1)
  NVCC :=
endif
GPU_ARCH ?= 90
NVCC_FLAGS := -O3 -std=c++17 --expt-relaxed-constexpr -Xcompiler -Wall,-Wno-unused-function,-fopenmp -Wno-deprecated-gpu-targets
NVCC_LIBS := -lcublasLt -lcublas -lgomp
CUDA_TARGETS :=
ifneq ($(NVCC),)
  CUDA_TARGETS := train_sdc_cu $(if $(wildcard test_sdc.cu),test_sdc_cu)
  NCCL_H := $(firstword $(wildcard $(dir $(NVCC))../include/nccl.h /usr/include/nccl.h /usr/local/include/nccl.h))
  ifneq ($(NCCL_H),)
    NVCC_FLAGS += -DUSE_NCCL
    NVCC_LIBS += -lnccl
    NCCL_NOTE := NCCL: yes
  else
    NCCL_NOTE := NCCL: no (train_sdc_cu trains on one GPU)
  endif
  ifneq ($(MPICC),)
    NVCC_FLAGS += -DUSE_MPI $(shell $(MPICC) --showme:compile 2>/dev/null)
    NVCC_LIBS += $(shell $(MPICC) --showme:link 2>/dev/null | sed 's/-Wl,[^ ]*//g')
  endif
  $(info [make] CUDA: $(NVCC), sm_$(GPU_ARCH); $(NCCL_NOTE))
else
  $(info [make] CUDA: no nvcc, skipping the GPU trainer)
endif

HEADERS := $(wildcard llmc/*/*.h)
CUDA_HEADERS := $(wildcard llmc/*/*.cuh)
# the test-only headers: tests/*.h (test_sdc.c and test_sdc.cu), tests/cuda/ (the parts of test_sdc.cu)
TEST_HEADERS := $(wildcard tests/*.h)
TEST_CUDA_HEADERS := $(wildcard tests/cuda/*.h tests/cuda/*.cuh)

# The build configuration: compilers (and their versions), flags, MPI found or not, NATIVE, GPU_ARCH,
# NO_CUDA. build/config-c.stamp (the C binaries) and build/config-cuda.stamp (the CUDA ones) are
# rewritten only when their content changes, and every binary depends on its stamp, so a binary built
# under another configuration (e.g. single-process before OpenMPI was installed) is rebuilt.
C_STAMP := build/config-c.stamp
CUDA_STAMP := build/config-cuda.stamp
C_CONFIG := cc $(CC_PLAIN) $(shell $(CC_PLAIN) --version 2>/dev/null | head -n 1) | train_sdc cc $(TRAIN_CC) $(TRAIN_FLAGS) | $(CFLAGS) $(LDLIBS)
CUDA_CONFIG := nvcc $(NVCC) $(if $(NVCC),$(shell $(NVCC) --version 2>/dev/null | tail -n 1)) | $(NVCC_FLAGS) $(NVCC_LIBS) | sm_$(GPU_ARCH)
define write_stamp
ifneq ($$(strip $(2)),$$(strip $$(shell cat $(1) 2>/dev/null)))
  $$(shell mkdir -p build && printf '%s\n' '$(2)' > $(1))
  $$(info [make] build configuration new or changed: $(1) rewritten, its binaries will be rebuilt)
endif
endef
$(eval $(call write_stamp,$(C_STAMP),$(C_CONFIG)))
ifneq ($(NVCC),)
  $(eval $(call write_stamp,$(CUDA_STAMP),$(CUDA_CONFIG)))
endif
# (re)made when absent at run time, e.g. after `make clean all`
$(C_STAMP):
	@mkdir -p build && printf '%s\n' '$(C_CONFIG)' > $@
$(CUDA_STAMP):
	@mkdir -p build && printf '%s\n' '$(CUDA_CONFIG)' > $@

.PHONY: all test venv refckpts clean cuda-check
all: train_sdc test_sdc $(CUDA_TARGETS)

train_sdc: train_sdc.c $(HEADERS) $(C_STAMP)
	$(TRAIN_CC) $(CFLAGS) $(TRAIN_FLAGS) -o $@ $< $(LDLIBS)

test_sdc: test_sdc.c train_sdc.c $(HEADERS) $(TEST_HEADERS) $(C_STAMP)
	$(CC_PLAIN) $(CFLAGS) -o $@ $< $(LDLIBS)

# the CPU GEMMs against the core's FMA peak (scripts/bench_cpu.sh --table prints it beside the training rows)
bench_gemm: dev/bench/bench_gemm.c $(HEADERS) $(C_STAMP)
	$(CC_PLAIN) $(CFLAGS) -I. -o $@ $< $(LDLIBS)

train_sdc_cu: train_sdc.cu $(HEADERS) $(CUDA_HEADERS) $(CUDA_STAMP)
	$(NVCC) $(NVCC_FLAGS) -arch=sm_$(GPU_ARCH) -o $@ $< $(NVCC_LIBS)

test_sdc_cu: test_sdc.cu train_sdc.cu train_sdc.c $(HEADERS) $(CUDA_HEADERS) $(TEST_HEADERS) $(TEST_CUDA_HEADERS) $(CUDA_STAMP)
	$(NVCC) $(NVCC_FLAGS) -arch=sm_$(GPU_ARCH) -o $@ $< $(NVCC_LIBS)

# every CUDA source for both architectures (objects only; a compile error fails the build)
CUDA_CHECK_SRCS := train_sdc $(if $(wildcard test_sdc.cu),test_sdc)
cuda-check: $(if $(NVCC),$(foreach a,80 90,$(foreach f,$(CUDA_CHECK_SRCS),build/cuda/sm$(a)/$(f).o)))
build/cuda/sm%/train_sdc.o: train_sdc.cu $(HEADERS) $(CUDA_HEADERS) $(CUDA_STAMP)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCC_FLAGS) -arch=sm_$* -c -o $@ $<
build/cuda/sm%/test_sdc.o: test_sdc.cu train_sdc.cu train_sdc.c $(HEADERS) $(CUDA_HEADERS) $(TEST_HEADERS) $(TEST_CUDA_HEADERS) $(CUDA_STAMP)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCC_FLAGS) -arch=sm_$* -c -o $@ $<

# CUDA emulation (dev/cuda_emu): the same CUDA sources built with the host C++ compiler against
# the project's own CUDA runtime / cuBLASLt / NCCL declarations (dev/cuda_emu/include; no CUDA toolkit)
# and run on the CPU. cu2emu.py mirrors the sources (the test-only headers of tests/ too, so that their
# #include paths resolve in the mirror as in the tree) into build/emu/src with each <<<...>>> launch and
# __shared__ declaration rewritten (lines kept, #line names the original). test_sdc_emu: the whole
# test_sdc.cu suite; train_sdc_emu: the GPU trainer (NCCL over MPI when mpicc exists); emu_selftest: the
# emulator's own tests. `make test` runs them (test-emu), each emulated test under two schedules whose
# device-to-host digests must agree (dev/cuda_emu/run_twice.py).
EMU_CXX ?= g++
EMU_DIR := dev/cuda_emu
EMU_FLAGS := -std=c++17 -O2 -fopenmp -Wall -Wno-unknown-pragmas -Wno-sign-compare -Wno-unused-function -Wno-unused-variable \
             -I$(EMU_DIR)/include
EMU_HDRS := $(wildcard $(EMU_DIR)/include/*.h)
EMU_SRCS := train_sdc.cu test_sdc.cu train_sdc.c $(HEADERS) $(CUDA_HEADERS) $(TEST_HEADERS) $(TEST_CUDA_HEADERS) $(EMU_DIR)/emu_selftest.cu
EMU_LIB := build/emu/emu_runtime.o build/emu/cublaslt_emu.o
ifneq ($(MPICC),)
  EMU_MPI_FLAGS := -DUSE_MPI $(shell $(MPICC) --showme:compile 2>/dev/null)
  EMU_MPI_LIBS := $(shell $(MPICC) --showme:link 2>/dev/null)
endif
.PHONY: emu test-emu test-emu-full
emu: test_sdc_emu train_sdc_emu emu_selftest

build/emu/src.stamp: $(EMU_SRCS) $(EMU_DIR)/cu2emu.py
	@mkdir -p build/emu/src
	$(PYTHON) $(EMU_DIR)/cu2emu.py --out build/emu/src $(EMU_SRCS)
	@touch $@
build/emu/emu_runtime.o: $(EMU_DIR)/emu_runtime.cpp $(EMU_HDRS)
	@mkdir -p build/emu
	$(EMU_CXX) $(EMU_FLAGS) -c -o $@ $<
build/emu/cublaslt_emu.o: $(EMU_DIR)/cublaslt_emu.cpp $(EMU_HDRS)
	@mkdir -p build/emu
	$(EMU_CXX) $(EMU_FLAGS) -c -o $@ $<
build/emu/nccl_emu.o: $(EMU_DIR)/nccl_emu.cpp $(EMU_HDRS)
	$(EMU_CXX) $(EMU_FLAGS) -c -o $@ $<
build/emu/nccl_emu_mpi.o: $(EMU_DIR)/nccl_emu.cpp $(EMU_HDRS)
	$(EMU_CXX) $(EMU_FLAGS) $(EMU_MPI_FLAGS) -c -o $@ $<
test_sdc_emu: build/emu/src.stamp $(EMU_LIB) build/emu/nccl_emu.o
	$(EMU_CXX) $(EMU_FLAGS) -DUSE_NCCL -o $@ -x c++ build/emu/src/test_sdc.cu -x none $(EMU_LIB) build/emu/nccl_emu.o -lm
train_sdc_emu: build/emu/src.stamp $(EMU_LIB) build/emu/nccl_emu_mpi.o
	$(EMU_CXX) $(EMU_FLAGS) -DUSE_NCCL $(EMU_MPI_FLAGS) -o $@ -x c++ build/emu/src/train_sdc.cu -x none $(EMU_LIB) build/emu/nccl_emu_mpi.o $(EMU_MPI_LIBS) -lm
emu_selftest: build/emu/src.stamp $(EMU_LIB)
	$(EMU_CXX) $(EMU_FLAGS) -o $@ -x c++ build/emu/src/$(EMU_DIR)/emu_selftest.cu -x none $(EMU_LIB) -lm

# the emulated tests of `make test`: the emulator's self-tests, then the whole test_sdc.cu suite under two
# schedules (fwd, rev) run side by side, one core each; their digests must be equal
test-emu: emu
	./emu_selftest
	OMP_NUM_THREADS=1 $(PYTHON) $(EMU_DIR)/run_twice.py -- ./test_sdc_emu -states dev/reference/states -ckpts build/ref
# slower extras: a third schedule (seeded random) for test_sdc_emu, and tests/test_emu.py's long variants (the
# Q/K-fault and backward-path tests on every tiny preset, the longer element-wise clean run)
test-emu-full: emu venv refckpts
	./emu_selftest
	OMP_NUM_THREADS=1 $(PYTHON) $(EMU_DIR)/run_twice.py --schedules fwd,rand:1 -- ./test_sdc_emu -states dev/reference/states -ckpts build/ref
	TSDC_EMU_FULL=1 TSDC_DATA_DIR=$(SHARED_DATA) OMP_NUM_THREADS=2 $(VPY) -m pytest -q tests/test_emu.py

# local Python environment for data preparation, the weight importer and the Python tests
venv: $(VENV)/.stamp
$(VENV)/.stamp: requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip
	$(VPY) -m pip install -q -r requirements.txt
	touch $@

# reference checkpoints: the committed HF weights through the user's import path
REF_PRESETS := tiny-llama tiny-qwen3 tiny-nanochat
REF_CKPTS := $(addprefix build/ref/,$(addsuffix .ckpt,$(REF_PRESETS)))
refckpts: $(REF_CKPTS)
build/ref/%.ckpt: dev/reference/states/%/model.safetensors dev/reference/hf_to_ckpt.py dev/tsdc_io.py $(VENV)/.stamp
	@mkdir -p build/ref
	$(VPY) dev/reference/hf_to_ckpt.py dev/reference/states/$* $@ --preset $*

test: all cuda-check venv refckpts emu
	$(MAKE) --no-print-directory test-cublaslt
	OMP_NUM_THREADS=2 ./test_sdc -states dev/reference/states -ckpts build/ref
	$(MAKE) --no-print-directory test-emu
	TSDC_DATA_DIR=$(SHARED_DATA) OMP_NUM_THREADS=2 $(VPY) -m pytest -q tests

clean:
	rm -rf train_sdc test_sdc bench_gemm train_sdc_cu test_sdc_cu test_sdc_emu train_sdc_emu emu_selftest build

# ---------------------------------------------------------------------------------------------------
# cuBLASLt emulation (dev/cuda_emu): its unit tests, with the host compiler only (no CUDA
# toolkit). test-cublaslt runs them with 2 threads, 1 thread, AVX2 and SSE2 forced: the bits must not change.
EMU_CXX ?= g++
EMU_CXXFLAGS ?= -std=c++17 -O2 -fopenmp -Wall -Idev/cuda_emu/include
build/emu/test_cublaslt: dev/cuda_emu/test_cublaslt.cpp dev/cuda_emu/cublaslt_emu.cpp dev/cuda_emu/include/cublasLt.h dev/cuda_emu/include/library_types.h dev/cuda_emu/include/cuda_emu_cublaslt_stats.h
	@mkdir -p $(dir $@)
	$(EMU_CXX) $(EMU_CXXFLAGS) -o $@ dev/cuda_emu/test_cublaslt.cpp dev/cuda_emu/cublaslt_emu.cpp
test-cublaslt: build/emu/test_cublaslt
	@for env in "OMP_NUM_THREADS=2" "OMP_NUM_THREADS=1" "OMP_NUM_THREADS=2 CUBLASLT_EMU_SIMD=avx2" "OMP_NUM_THREADS=2 CUBLASLT_EMU_SIMD=sse"; do \
	  env $$env ./build/emu/test_cublaslt > build/emu/test_cublaslt.log 2>&1 || { cat build/emu/test_cublaslt.log; echo "FAILED with $$env"; exit 1; }; \
	  echo "$$env: $$(tail -n 1 build/emu/test_cublaslt.log)"; done
.PHONY: test-cublaslt
