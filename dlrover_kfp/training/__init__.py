"""The DLRM training step: data, model, parameter servers, workers and flash checkpoints.

Each PS and each worker is its own OS process (``python -m dlrover_kfp.training.node ps 0``);
torch runs with one intra-op thread in each, because processes that share cores with others
lose far more to thread contention than they gain from a second thread.
"""
