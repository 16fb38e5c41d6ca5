"""The Triton backend: a table-driven persistent backward and a forward, for any CUDA GPU Triton
supports and for Triton's CPU interpreter. ``tiles`` is pure Python; the kernels import torch and
triton."""
