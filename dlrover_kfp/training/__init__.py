"""The DLRM training step: data, model, parameter servers, workers and flash checkpoints.

Each PS and each worker is its own OS process (``python -m dlrover_kfp.training.node ps 0``).
A worker runs ``floor(cpu)`` torch intra-op threads, at least one, and a PS one: a PS's
parallelism is a thread per worker connection, and threads past a pod's whole cores only fight
its quota and its prefetch thread (the measurements: :func:`.node.torch_threads`).
"""
