"""The probes of ``benchmarks/bad_inputs.py`` by area, each module with ``probes(tmp)``: its
categories and, for each, (tried, handled cleanly)."""
