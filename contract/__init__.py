"""The leaf of the layering: constants and small pure functions of the mathematical contract
(SPEC.md) that the fp64 reference (``witcert``), the kernels (``kernels``) and the proofs bridge
all import. It imports nothing of the project, so ``kernels`` never imports ``witcert``."""
