"""xrpo.eval: evaluation of trained policies (`xrpo eval`, `xrpo report`).

Submodules (import them directly; this package imports nothing):
    evaluate  the `xrpo eval` driver
    report    `xrpo report`: a training run's logs as one page
    plots     pass@k and response-length plots
pass@k and cons@k themselves are pure math: `xrpo.algo.passk`.
"""
