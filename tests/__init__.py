"""WitCert test suite: one subpackage per layer (bounds, kernels, cache, integrations, cli, bridge), shared
helpers in ``tests.helpers``, fixtures in ``tests/data``. Packages, so test module basenames may repeat."""
