"""xrpo.eval: evaluation of trained policies.

Submodules (import them directly; this package imports nothing):
    metrics   pass@k (Chen et al. 2021 unbiased estimator) and cons@k (majority vote), pure Python/numpy
"""
