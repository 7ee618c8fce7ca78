"""Align: logs and traces on one clock, log lines attached to the tree nodes they describe.

`clock` estimates per-rank (and per-host) clock offsets and applies them; `requests` builds request
trees (request → the steps it was batched in); `align` attaches log records to those nodes.
"""
