# Sourced by the GPU scripts: puts the CUDA toolkit's lib64 (NVRTC, its
# builtins, cuBLAS) on LD_LIBRARY_PATH, since the GPU machine's loader path
# has only the driver. Sets CUDA_LIB (empty when not found).
CUDA_LIB=
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/cuda-13*/lib64; do
  [ -e "$d/libnvrtc.so.13" ] && { CUDA_LIB=$d; break; }
done
if [ -z "$CUDA_LIB" ]; then
  f=$(find / \( -path /proc -o -path /sys -o -path /dev \) -prune \
    -o -name 'libnvrtc.so.13*' -print -quit 2>/dev/null)
  [ -n "$f" ] && CUDA_LIB=$(dirname "$f")
fi
if [ -n "$CUDA_LIB" ]; then
  export LD_LIBRARY_PATH="$CUDA_LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  # cuBLAS may live in another folder of the toolkit (or a pip wheel).
  if ! ls "$CUDA_LIB"/libcublas.so.13* >/dev/null 2>&1; then
    f=$(find / \( -path /proc -o -path /sys -o -path /dev \) -prune \
      -o -name 'libcublas.so.13*' -print -quit 2>/dev/null)
    [ -n "$f" ] && export LD_LIBRARY_PATH="$(dirname "$f"):$LD_LIBRARY_PATH"
  fi
fi
