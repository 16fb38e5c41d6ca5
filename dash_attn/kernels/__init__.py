"""Triton kernels. Set TRITON_INTERPRET before importing them: it is read at decoration time."""
