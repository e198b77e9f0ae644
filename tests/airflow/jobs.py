"""The small DLRM job the Airflow tests train: a few seconds of training per 10,000 rows on
one core, one worker and one PS of one core each (a pod imports torch, ~2.2 s of CPU,
before it trains: at half a core that doubles, on every run)."""

from __future__ import annotations


def tiny_job(name: str, scenario: str, rows: int = 8000) -> str:
    return f"""\
name: {name}
scenario: {scenario}
model: {{embedding_dim: 8, table_sizes: [100, 50, 200, 30], dense_features: 4,
        bottom_mlp: [16, 8], top_mlp: [16, 1]}}
data: {{format: synthetic, rows: {rows}, seed: 1}}
training: {{batch_size: 256, epochs: 1, learning_rate: 0.05}}
resources:
  limits: {{cpu: 2, memory: 4Gi}}
  workers: {{count: 1, cpu: 1, memory: 1Gi}}
  ps: {{count: 1, cpu: 1, memory: 1Gi}}
elastic: {{min_workers: 1, max_workers: 1, max_ps: 1}}
"""
