"""A trace-driven cluster simulator that compares resource policies for PS training jobs.

A trace (:mod:`.trace`) lists jobs as users submit them: arrival time, the job spec (with the
user's own request and quota) and the job's hidden truth (:mod:`.truth`: how fast it trains on a
given shape, how much CPU and memory its pods really use). Stragglers come from real per-worker
mini-batch times of Alibaba PAI (:mod:`.stragglers`). The policies (``manual``, ``optimus``,
``dlrover-oss``, ``dlrover-kfp``) see only what a job master sees (:mod:`.api`).
"""
