"""Tests of the fp64 reference formulas (``witcert.bounds``), the schemes and the scheme table."""
