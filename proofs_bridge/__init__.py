"""Proofs bridge: ties the SPEC formulas, the fp64 reference and the kernel constants together
(and, once ``lean/`` exists, the Lean statements). See ``proofs_bridge.check``."""
