"""Simulation: synthetic workloads with a known truth, and jobs driven by the real planner.

The planner functions called here are the ones the elastic runtime calls; the simulation only
replaces the cluster and the trainer with a known throughput function.
"""
