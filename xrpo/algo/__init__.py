"""xrpo.algo: the paper's math as pure functions (numpy arrays / torch tensors in, arrays and metric dicts out).

Submodules (import them directly; this package imports nothing so that each stays optional and light):
    allocation   Eq. (1)-(3): t-CI half-width, uncertainty reduction, exploration bonus, priority, budget split,
                 the per-step phase schedule (hierarchical rollout planning, §3.2)
    advantages   GRPO / Dr. GRPO group advantages, Eq. (4) length-normalised log-likelihood, Eq. (5) novelty,
                 Eq. (6) novelty-guided advantage sharpening (§3.3); registry of advantage kinds ("group", "tree")
    losses       policy-loss registry ("vanilla" clipped surrogate, "gspo", "gspo_token"), loss aggregation
                 (token-mean, seq-mean-token-mean, seq-mean-token-sum-norm), k1/k3 KL penalty
    sampling     DAPO dynamic-sampling group filter
    passk        §4.1 evaluation metrics: unbiased pass@k (Chen et al. 2021) and cons@k (majority vote)
    knapsack     Knapsack RL's value P(non-zero gradient) x p(1-p)^2 and exact DP over (prompt, budget), and the
                 rule read from its paper's description (estimate from a prompt's last visit; beyond the paper)
    knapsack_rl  Knapsack RL as its authors' code implements it: the estimate from a prompt's latest rewards, each
                 mixed prompt's cost, the fallback to never-solved prompts, the knapsack over the mixed ones
    posterior_alloc  xrpo-plus: a planning round placed by a Beta posterior's expected informative rollouts
    presets      named methods (grpo, dapo, gspo, dr_grpo, xrpo, ablations) as knob values with their sources
"""
