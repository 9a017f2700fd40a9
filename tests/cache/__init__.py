"""Tests of the cache layer (``witcert.cache`` and what it drives: store, gate, meter, graphs, host pool, trace)."""
