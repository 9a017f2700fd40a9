"""Integrations of the WitCert meter into serving engines (``witcert.integrations.sglang``)."""
