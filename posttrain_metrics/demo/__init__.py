"""The ``posttrain-metrics demo``: a real, tiny GRPO run on the CPU that a person can watch learn.

Nothing is imported here, so ``import posttrain_metrics.demo`` stays light; the trainer (which needs
torch) lives in :mod:`posttrain_metrics.demo.grpo_toy`.
"""
