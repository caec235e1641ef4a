#!/bin/bash
# The two GPU-check calls rehearsed on a machine with no GPU and no driver (2026-12-07, 2-core
# x86): a real CUDA build made with CUDA 13.5's nvcc from PyPI, loaded through a stand-in
# libcuda whose every driver call answers "no device", so llama.cpp runs every layer on the CPU
# backend. It checks the build, the link and the check's steps, not CUDA's numbers.
set -e
R=${R:-/tmp/reh}; N=$R/nv/nvidia/cu13; mkdir -p $R
python3 -m pip install -q --target $R/nv nvidia-cuda-nvcc nvidia-cuda-crt nvidia-cuda-runtime \
  nvidia-cuda-cccl nvidia-cublas nvidia-nvvm
python3 -m pip install -q --target $R/pylib scikit-build-core cmake ninja  # what the image has
for l in cudart cublas cublasLt; do ln -sf lib$l.so.13 $N/lib/lib$l.so; done  # for CMake
mkdir -p $N/lib/stubs $R/stub
gcc -shared -fPIC -O1 -Wl,-soname,libcuda.so.1 -o $R/stub/libcuda.so.1 "$(dirname "$0")/cuda_stub.c"
ln -sf libcuda.so.1 $R/stub/libcuda.so && cp -a $R/stub/libcuda.so* $N/lib/stubs/
export PATH=$N/bin:$R/pylib/bin:$PATH
# call 1 (here: sm_90 named, since there is no GPU for "native")
PYTHONPATH=$R/pylib .venv/bin/python scripts/gpu_check.py run --stage build --state $R/state \
  --out $R/out1 --cmake-arg=-DCMAKE_CUDA_ARCHITECTURES=90 --cmake-arg=-DCUDAToolkit_ROOT=$N
# call 2 as is stops at the offload gate ("the CUDA build cannot offload"): no GPU device here.
# To run every later step on the CPU backend anyway, a copy with the gate taken out:
sed -e "s|^ROOT = Path(__file__).resolve().parent.parent|ROOT = Path(\"$PWD\")|" \
    -e 's|    if not dry and not report.data\["gpu_offload"\]:|    if False:|' \
    scripts/gpu_check.py > $R/gpu_check_rehearsal.py
LD_LIBRARY_PATH=$R/stub:$N/lib .venv/bin/python $R/gpu_check_rehearsal.py run --stage check \
  --budget 100000 --state $R/state --out $R/out2
