# Sourced by the scripts that run on the GPU machine (gpu_check.sh, two_gpu_check.sh), from the
# repository root with BUILD set: unpacks the carried build, finds cuBLASLt (the machine's CUDA
# toolkit or PyTorch's wheel), points the tests at this build, and keeps NVLink multicast off (the
# device tool's KINDS.md says why).
[ -f .carry/gpu-build.tar.xz ] && tar -xJf .carry/gpu-build.tar.xz
# An incremental rebuild of some binaries (scripts/build_for_gpu.sh removes a stale one) goes on top.
[ -f .carry/gpu-inc.tar.xz ] && tar -xJf .carry/gpu-inc.tar.xz
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
         $(python3 -c 'import nvidia.cublas, os; print(os.path.dirname(nvidia.cublas.__file__) + "/lib")' 2>/dev/null); do
  [ -e "$d/libcublasLt.so.13" ] && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}" && break
done
export KILN_TESTDATA=$PWD/testdata KILN_BINARY=$PWD/$BUILD/bin/kiln
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
