"""Helpers shared by the test modules: tiny models, recorded meter configurations."""
