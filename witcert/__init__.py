"""WitCert: a provably sound runtime meter for KV-cache quantization (see SPEC.md)."""

__version__ = "0.1.0"
