"""xrpo.eval: evaluation of trained policies (`xrpo eval`, `xrpo report`).

Submodules (import them directly; this package imports nothing):
    evaluate  the `xrpo eval` driver: model, data, resume, sampling, outputs, top to bottom
    config    `EvalConfig`: every option of `xrpo eval`, one docstring each
    model     MODEL: run and checkpoint directories, and the training settings eval takes its defaults from
    spec      the DATA spec language and the datasets it names
    settings  every default filled in (what settings.json records)
    store     the resume store: settings.json and the per-problem files
    build     engine, renderer and test-time ICL corpus (through `xrpo.models.loading`, `xrpo.rollout.build`)
    icl       test-time ICL prompts
    results   results.json, results.md, plots
    report    `xrpo report`: a training run's logs as one page
    plots     pass@k and response-length plots
pass@k and cons@k themselves are pure math: `xrpo.algo.passk`.
"""
