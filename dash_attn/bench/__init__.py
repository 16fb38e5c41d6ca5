"""GPU benchmarks of dash-attn against its peers (``dash-attn bench``).

Modules: ``main`` (the command: arguments, stages, files), ``configs`` (the grid), ``sweep`` (the
GPU loops), ``runinfo`` (machine header, deadline, log), ``providers`` (what is timed), ``timing``
(FLOPs and timers), ``e2e`` (one transformer block), ``model`` (DAG model vs measurement),
``report`` (tables), ``plot`` (figures), ``packed`` (the varlen and sliding-window rows of issue
#12, with ``packed_rows``, ``packed_providers``, ``packed_report``); none imports a module that
imports it back. Importing
this package loads neither torch nor triton: the command must be able to say "no GPU here" on
any machine.
"""
