#!/usr/bin/env python3
"""Compiles every kernels/src/cu/*.cu and examples/cu/*.cu (the user example's
twin) with NVRTC for sm_90, in both math modes,
with the options kernels/src/cuda/nvrtc.rs passes. Needs no GPU, only NVRTC's
libraries: the toolkit's lib64, or the `nvidia-cuda-nvrtc` wheel unpacked.

    python3 scripts/nvrtc_check.py /path/to/folder/with/libnvrtc.so.13

Exits 1 if any compile fails, and prints NVRTC's log.
"""
import ctypes
import glob
import os
import sys

lib = sys.argv[1] if len(sys.argv) > 1 else "/usr/local/cuda/lib64"
builtins = sorted(glob.glob(os.path.join(lib, "libnvrtc-builtins.so.13*")))
if builtins:
    ctypes.CDLL(builtins[0], mode=ctypes.RTLD_GLOBAL)
nvrtc = ctypes.CDLL(os.path.join(lib, "libnvrtc.so.13"))
top = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sources = sorted(glob.glob(os.path.join(top, "kernels", "src", "cu", "*.cu")))
sources += sorted(glob.glob(os.path.join(top, "examples", "cu", "*.cu")))
failed = 0
for path in sources:
    src = open(path, "rb").read()
    for fmad in (b"false", b"true"):
        prog = ctypes.c_void_p()
        if nvrtc.nvrtcCreateProgram(ctypes.byref(prog), src, path.encode(), 0, None, None):
            sys.exit(f"{path}: nvrtcCreateProgram failed")
        opts = [b"--fmad=" + fmad, b"--prec-div=true", b"--prec-sqrt=true", b"--ftz=false",
                b"--std=c++17", b"--gpu-architecture=sm_90"]
        rc = nvrtc.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
        size = ctypes.c_size_t()
        nvrtc.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value)
        nvrtc.nvrtcGetProgramLog(prog, log)
        cubin = ctypes.c_size_t()
        nvrtc.nvrtcGetCUBINSize(prog, ctypes.byref(cubin))
        name = os.path.basename(path)
        print(f"{name:16} fmad={fmad.decode():5} {'ok' if rc == 0 else 'FAILED'} cubin {cubin.value} bytes")
        if rc or log.value.strip():
            print(log.value.decode().strip())
        failed += rc != 0
        nvrtc.nvrtcDestroyProgram(ctypes.byref(prog))
sys.exit(1 if failed else 0)
