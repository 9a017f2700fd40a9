"""Tests of the serving-engine integrations (``witcert.integrations``: SGLang)."""
