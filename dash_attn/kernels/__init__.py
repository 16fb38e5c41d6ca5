"""Triton kernels. Import only after deciding on TRITON_INTERPRET (it is read at decoration time)."""
