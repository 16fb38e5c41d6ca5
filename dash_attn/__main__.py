"""``python -m dash_attn ...`` is ``dash-attn ...``."""

from dash_attn.cli import main

raise SystemExit(main())
