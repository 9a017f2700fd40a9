"""Triton kernels of WitCert: paged layout, write path, decode with the meter (SPEC §8)."""
