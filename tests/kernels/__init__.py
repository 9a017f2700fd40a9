"""Tests of the Triton kernels (``kernels/``): conformance to the fp64 reference, the overlay, codegen."""
