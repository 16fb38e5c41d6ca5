"""Integrations with training frameworks; each submodule imports its framework on first use
(``dash_attn.integrations.transformers`` needs transformers)."""
