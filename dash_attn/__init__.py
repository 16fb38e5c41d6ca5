"""dash-attn: deterministic attention backward with DASH schedules, in Triton."""

__version__ = "0.1.0"
