"""Tests of the Lean <-> code bridge (``proofs_bridge``)."""
