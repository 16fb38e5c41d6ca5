"""GPU benchmarks of dash-attn against its peers (``dash-attn bench``).

Modules: ``sweep`` (the command), ``providers`` (what is timed), ``timing`` (FLOPs and timers),
``e2e`` (one transformer block), ``model`` (DAG model vs measurement), ``report`` (tables),
``plot`` (figures). Importing this package loads neither torch nor triton: the command must be able
to say "no GPU here" on any machine.
"""
