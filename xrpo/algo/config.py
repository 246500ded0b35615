"""The method's knobs, each declared once: small dataclasses, one docstring and one check per field.

Each section is embedded as it is (as a base class, so its fields keep their flat names) by every config that holds
its knobs: the trainer's ``method`` section (`xrpo.trainer.config.MethodConfig`: every section but `ICLPromptConfig`,
which its ``rollout`` section holds), the planner's `xrpo.rollout.planner.PlanConfig`, TreePO's
`xrpo.rollout.treepo.TreeConfig` and verl's ``algorithm.xrpo`` block (`xrpo.integrations.verl.config.XRPOConfig`).
A user therefore writes ``method.lam_nov=3`` for the trainer and ``algorithm.xrpo.lam_nov=3`` for verl, as before.

The defaults are XRPO's setting (the paper's §4.1 and its sensitivity table's default row); a method preset
(`xrpo.algo.presets`) lists only the knobs it changes. `check_knobs` validates every section an object embeds, plus
the rules that tie sections together, and names the failing key with the caller's prefix (``method.``,
``algorithm.xrpo.``).
"""

from __future__ import annotations

import math
import re
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

from xrpo.algo.advantages import ADV_SCALES
from xrpo.algo.allocation import ALLOC_MODES, check_significance
from xrpo.algo.rounds import KNAPSACK_FALLBACKS, allocator_names
from xrpo.algo.tree import DIVERGENCE_POLICIES as TREE_DIVERGENCES

__all__ = [
    "ADV_SCALES",
    "ALLOC_MODES",
    "AdvantageConfig",
    "AllocationConfig",
    "BatchConfig",
    "CorpusConfig",
    "CuresConfig",
    "ICLConfig",
    "ICLPromptConfig",
    "ICL_NOVELTY",
    "ICL_TRAIN_PROMPTS",
    "KL_ESTIMATORS",
    "LOSS_AGGS",
    "LossConfig",
    "METHOD_SECTIONS",
    "SAMPLERS",
    "PLANNERS",
    "SharpenConfig",
    "StreamConfig",
    "TREE_DIVERGENCES",
    "TreePOConfig",
    "check_int",
    "check_knob_fields",
    "check_knobs",
    "check_number",
    "is_int",
    "knob",
    "knob_section",
    "knob_names",
    "section_values",
]

ICL_TRAIN_PROMPTS = ("original", "icl")
ICL_NOVELTY = ("train", "sample", "exclude")
# the loss's choices (`xrpo.algo.losses` implements them); declared here so that reading a config needs no torch
LOSS_AGGS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")
KL_ESTIMATORS = ("k1", "k3")
SAMPLERS = ("independent", "tree")
PLANNERS = ("rounds", "streaming")


@dataclass
class LossConfig:
    """The policy loss of the update (verl: actor.policy_loss / clip_ratio_* / loss_agg_mode / kl_loss_*)."""

    policy_loss: str = "vanilla"
    """Policy loss from the registry (xrpo.algo.losses): vanilla (token-level clip), gspo, gspo_token."""
    clip_low: float = 0.2
    """Lower clip epsilon of the importance ratio."""
    clip_high: float = 0.28
    """Upper clip epsilon of the importance ratio (DAPO clip-higher)."""
    loss_agg: str = "token-mean"
    """Loss aggregation: token-mean, seq-mean-token-mean or seq-mean-token-sum-norm."""
    kl_coef: float = 0.001
    """beta of the KL term against the frozen reference model (0 disables the reference model)."""
    kl_estimator: str = "k3"
    """KL estimator: k3 or k1."""


@dataclass
class AdvantageConfig:
    """Which advantage each rollout gets before sharpening."""

    adv_scale: str = "std"
    """Group normalisation of advantages: "std" (GRPO) or "none" (Dr. GRPO)."""
    tree_advantage: bool = False
    """TreePO's tree advantage (sub-group advantages of every ancestor sub-tree, averaged per leaf; with
    adv_scale=std normalised over the whole batch) instead of GRPO's group advantage."""


@dataclass
class AllocationConfig:
    """How a step's rollout budget is shared between its prompts (XRPO §3.2, hierarchical rollout planning)."""

    allocation: str = "hrp"
    """Rollout allocation: hrp (XRPO's hierarchical planning, priority Pi_q = Delta_q + phi_q), uniform (the w/o-HRP
    ablation and GRPO), or cures (CurES: prompts drawn from the Beta posterior of their accuracy, rollouts in
    proportion to the estimated gradient std; the cures_* knobs; the planner generates the counts its caller chose);
    beyond the paper: knapsack (Knapsack RL: the step's budget in one batch from each prompt's earlier visits, the
    knapsack_* knobs) or xrpo-plus (each round split by a Beta posterior's expected informative rollouts, with the
    last visit)."""
    n_base: int = 4
    """Base rollouts per prompt before planning (paper §4.1: 4); >= 2, the t quantile of Eq. (1) needs n >= 2."""
    plan_rounds: int = 2
    """Planning rounds that split the rest of the step's budget (paper §4.1: 2)."""
    alpha: float = 0.05
    """Significance level of the Student-t confidence interval of Eq. (1), whose confidence is 1 - alpha: 0.05 for a
    95% interval; must be in (0, 0.5) (the paper's sensitivity table writes the confidence, 0.95, as alpha)."""
    lam: float = 0.1
    """Exploration-bonus weight lambda in phi_q = lambda * sqrt(log(1 + T) / n_q)."""
    alloc_mode: str = "proportional"
    """proportional (the paper) or greedy (one rollout at a time to the argmax of Pi_q) allocation within a round."""
    max_extra_per_prompt: int | None = None
    """Cap on the extra rollouts one prompt may get in one planning round (knapsack with knapsack_fallback=leftover
    or jeffreys: in its one batch; the authors' rule caps with knapsack_max_n); None: no cap. Times the prompts it
    must cover the largest round (checked with the config)."""
    group_size_power: float = 1.0
    """xrpo-plus: a group of n rollouts whose rewards are not all equal is worth n^group_size_power in the planner's
    objective, in [0, 1]: 1 maximises the expected rollouts with a non-zero advantage, 0 the expected prompts that
    carry a gradient, 0.5 values a prompt's gradient by the signal-to-noise of its n rollouts
    (xrpo.algo.posterior_alloc)."""
    knapsack_fallback: str = "authors"
    """knapsack: "authors" (the Knapsack RL authors' code: each mixed prompt costs the rollouts that show its rarer
    outcome with probability 0.9; when those costs add up to less than the budget left after the floors, the
    knapsack gets only their sum and the surplus goes evenly to the never-solved and never-seen prompts, else to the
    other unmixed ones; rates from each prompt's latest knapsack_window rewards), or the rule read from the paper's
    description: "leftover" (rates from the last visit; never- and always-solved prompts get only what the mixed
    ones cannot take) or "jeffreys" (those valued at their Jeffreys estimate inside the knapsack)."""
    knapsack_max_n: int = 128
    """knapsack (authors): the most rollouts the knapsack gives one prompt (their recipe's MAX_N = 128; the fallback's
    surplus is not bound by it)."""
    knapsack_window: int = 16
    """knapsack (authors): a prompt's rate is the mean of its latest this many rewards across visits, or of its last
    visit alone when that visit had at least as many (their recipe's REWARD_BUFFER_LENGTH = 16)."""
    knapsack_min_rewards: int = 8
    """knapsack (authors): a prompt with fewer rewards over all its visits has no rate; it gets the even share outside
    the knapsack (their recipe's MIN_BUFFER_LENGTH = 8)."""
    knapsack_zero_at_floor: bool = True
    """knapsack (authors): value a mixed prompt that the knapsack leaves at the 2-rollout floor at 0, as the authors'
    solver does (their DP scores only the rollouts it adds); false values it at the formula's P(non-zero gradient |
    2 rollouts) x p(1 - p)^2."""


@dataclass
class ICLConfig:
    """ICL seeding of prompts with no success so far (XRPO §3.2)."""

    icl: bool = True
    """ICL seeding of prompts with no success."""
    icl_k: int = 2
    """Examples per ICL prompt (paper: K = 2)."""


@dataclass
class ICLPromptConfig:
    """How ICL prompts are built and trained (the trainer's ``rollout`` section holds these)."""

    icl_train_prompt: str = "original"
    """Train ICL-seeded rollouts under the "original" prompt (the model is evaluated without examples) or the "icl"
    prompt they were sampled from (xrpo.rollout.planner's docstring)."""
    icl_min_similarity: float = 0.0
    """Neighbours below this cosine similarity (in [0, 1]) are not used as ICL examples; with none left the prompt
    stays zero-shot."""


@dataclass
class StreamConfig:
    """When the planning rounds are planned (the trainer's ``rollout`` section holds these; docs/methods.md,
    "Streaming rollout planning"). They change when rollouts are generated, not the method's equations."""

    planner: str = "rounds"
    """rounds (Algorithm 1: each planning round waits for every prompt's rollouts of the round before) or streaming
    (beyond the paper: a prompt's next round is planned as soon as its group completes, with the prompts that
    completed with it, while other requests still decode; needs an engine that streams: rollout.engine=hf-cb or
    vllm)."""
    stream_quorum: float = 0.5
    """streaming: the share of the step's prompts that must be ready for a round before that round's wave is
    planned (their even shares of the round's budget split by Pi_q among them); a round's last prompts are planned
    once all of them are ready. 1 plans every round over all prompts at once (rounds' allocation)."""


@dataclass
class CorpusConfig:
    """The ICL corpus: how solutions are embedded and how many are kept (the trainer's ``rollout`` section and verl's
    ``algorithm.xrpo`` block hold these)."""

    embedder: str = "wordllama"
    """Embedder for ICL retrieval (xrpo.icl.get_embedder): "wordllama" (offline default), "minilm", "hash" or a
    sentence-transformers model such as the paper's Qwen/Qwen3-Embedding-8B."""
    corpus_max_per_problem: int = 2
    """Verified solutions kept per problem in the corpus: the shortest plus the most recent others
    (xrpo.icl.ICLCorpus)."""


@dataclass
class SharpenConfig:
    """Novelty-guided advantage sharpening, XRPO §3.3 Eq. (6)."""

    sharpen: bool = True
    """Novelty-guided advantage sharpening, Eq. (6)."""
    icl_novelty: str = "train"
    """Sharpening of ICL-seeded rollouts trained under another prompt than the one they were sampled from: "train"
    scores their s(y) (Eq. 4) under the prompt they are trained under (where they look novel), "sample" under the ICL
    prompt they were sampled from, "exclude" leaves them out of sharpening (docs/methods.md, "Sharpening and
    ICL-seeded rollouts")."""
    lam_nov: float = 2.5
    """lambda_nov of Eq. (6) (paper §4.1: 2.5)."""
    kappa_clip: float = 0.5
    """kappa_clip of Eq. (6) (paper §4.1: 0.5)."""
    full_reward: float = 1.0
    """Reward at or above which a rollout counts as correct: sharpened (Eq. 6), an ICL success, added to the
    corpus."""


@dataclass
class BatchConfig:
    """How a step's batch of rollouts is gathered."""

    sampler: str = "independent"
    """How a step's rollouts are sampled: "independent" (each from its prompt: GRPO, XRPO's planner) or "tree"
    (TreePO: each prompt's rollouts grown as a tree of segments, xrpo.rollout.treepo; its width is the prompt's even
    share of the step's rollouts)."""
    dynamic_sampling: bool = False
    """DAPO dynamic sampling: drop groups whose rewards are all equal and refill from new prompts."""
    max_gen_batches: int = 1
    """DAPO: at most this many generation batches per step when refilling."""


@dataclass
class TreePOConfig:
    """TreePO's tree sampler (Li et al. 2025, arXiv 2508.17445; xrpo.rollout.treepo), used with sampler=tree."""

    tree_segment_len: int = 0
    """TreePO: most tokens per segment; 0 = ceil(max_new_tokens / tree_max_depth) (TreePO: 512 of 7,168)."""
    tree_max_depth: int = 14
    """TreePO: most segments per path (TreePO: 14)."""
    tree_branch: int = 2
    """TreePO: forks per live path per segment (TreePO: 2, a binary tree)."""
    tree_init_branch: int = 2
    """TreePO: paths the root forks into (TreePO's "Fixed Init Divergence": 2); capped at the tree's width."""
    tree_divergence: str = "uniform"
    """TreePO: split of a tree's branching budget over its live paths: uniform, low_logprob (more forks for unlikely
    last segments) or high_logprob."""
    tree_divergence_temp: float = 2.0
    """TreePO: softmax temperature of the log-prob divergence policies (TreePO §4.4: 2.0)."""
    tree_fallback: bool = True
    """TreePO: re-expand a finished path from a random segment boundary when a tree runs out of live paths before it
    has its width of leaves."""

    def segment_tokens(self, max_new_tokens: int) -> int:
        """The segment length in tokens for completions of at most ``max_new_tokens``."""
        return self.tree_segment_len or math.ceil(max_new_tokens / self.tree_max_depth)


@dataclass
class CuresConfig:
    """CurES (Zeng et al. 2025, arXiv 2510.01037), used with allocation=cures (docs/methods.md, CurES)."""

    cures_prior_alpha: float = 1.0
    """CurES: alpha_0 of the Beta prior of every problem's accuracy (CurES code: Beta(1, 1))."""
    cures_prior_beta: float = 1.0
    """CurES: beta_0 of the Beta prior (CurES code: 1)."""
    cures_temp_scale: float = 100.0
    """CurES: c of the per-prompt temperature T_i = c * alpha_i in P_i ~ exp(sqrt(p_i (1 - p_i)) / T_i) (CurES code:
    1 / 1e-2; within 0.5% of uniform sampling, smaller is sharper)."""
    cures_warmup_rollouts: int = 4
    """CurES: rollouts of every training problem before step 1 that initialise the posterior (CurES code:
    num_rollout_min = 4); counted in summary.json (cures.warmup_rollouts); 0 skips the warm-up."""
    cures_min_count: int = 2
    """CurES: the least rollouts a drawn prompt gets (xrpo: 2, so its group has a reward variance)."""
    cures_success_threshold: float = 0.5
    """CurES: a rollout counts as a success in the posterior when its reward exceeds this (CurES code: 0.5)."""


# the sections of a method, in the order `xrpo train --help` and `knob_names` list them; a preset sets these knobs
METHOD_SECTIONS: tuple[type, ...] = (
    LossConfig,
    AdvantageConfig,
    AllocationConfig,
    ICLConfig,
    SharpenConfig,
    BatchConfig,
    TreePOConfig,
    CuresConfig,
)


def knob_names(sections: tuple[type, ...] = METHOD_SECTIONS) -> tuple[str, ...]:
    """The field names of ``sections``, in order."""
    return tuple(f.name for s in sections for f in fields(s))


def section_values(obj: Any, *sections: type) -> dict[str, Any]:
    """The values of every field of ``sections`` on ``obj`` (to build one embedding config from another)."""
    return {name: getattr(obj, name) for name in knob_names(sections)}


# -- checks ----------------------------------------------------------------------------------------------------------
def _fail(where: str, name: str, what: str, value: Any) -> None:
    raise ValueError(f"config field {where}{name} {what}, got {value!r}")


def _one_of(choices: tuple[str, ...]) -> str:
    return "must be one of " + (", ".join(choices[:-1]) + " or " + choices[-1] if len(choices) > 1 else choices[0])


def is_int(v: Any) -> bool:
    """An int that is not a bool (True == 1 is no count), the rule of `check_int` and of the readers of JSON records."""
    return isinstance(v, int) and not isinstance(v, bool)


def _check_choice(obj: Any, where: str, name: str, choices: tuple[str, ...]) -> None:
    if getattr(obj, name) not in choices:
        _fail(where, name, _one_of(choices), getattr(obj, name))


def check_int(obj: Any, where: str, name: str, least: int, why: str = "") -> None:
    """``obj.name`` is an int (not a bool) >= ``least``; else a ValueError naming ``where`` + ``name``."""
    v = getattr(obj, name)
    if not is_int(v) or v < least:
        _fail(where, name, f"must be {'' if is_int(v) else 'an int '}>= {least}{why}", v)


def check_number(
    obj: Any,
    where: str,
    name: str,
    least: float | None = None,
    strict: bool = False,
    most: float | None = None,
    why: str = "",
) -> None:
    """A finite number (an infinite clip, coefficient or rate is no setting: it turns the step's sums into inf or
    NaN) in [least, most] (``strict``: > least); ``why`` is appended to the error."""
    v = getattr(obj, name)
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    if ok and least is not None:
        ok = v > least if strict else v >= least
    if ok and most is not None:
        ok = v <= most
    if not ok:
        what = "a finite number"
        if least is not None:
            what += f" {'>' if strict else '>='} {least:g}"
        if most is not None:
            what += f"{' and' if least is not None else ''} <= {most:g}"
        _fail(where, name, f"must be {what}{why}", v)


def _loss(o: Any, where: str) -> None:
    check_number(o, where, "clip_low", 0)
    if o.clip_low >= 1:  # a ratio clipped at 1 - eps_low <= 0 is no clip
        _fail(where, "clip_low", "must be < 1 (the ratio is clipped below at 1 - clip_low)", o.clip_low)
    check_number(o, where, "clip_high", 0)
    _check_choice(o, where, "loss_agg", LOSS_AGGS)
    check_number(o, where, "kl_coef", 0)
    _check_choice(o, where, "kl_estimator", KL_ESTIMATORS)


def _advantage(o: Any, where: str) -> None:
    _check_choice(o, where, "adv_scale", ADV_SCALES)


def _allocation(o: Any, where: str) -> None:
    _check_choice(o, where, "allocation", allocator_names())  # the registry of xrpo.algo.rounds
    check_int(o, where, "n_base", 2, " (the t quantile needs n >= 2)")
    check_int(o, where, "plan_rounds", 0)
    check_significance(o.alpha, f"config field {where}alpha")
    check_number(o, where, "lam", 0)
    _check_choice(o, where, "alloc_mode", ALLOC_MODES)
    if o.max_extra_per_prompt is not None:
        check_int(o, where, "max_extra_per_prompt", 0, " or null")
    check_number(o, where, "group_size_power", 0, most=1)
    _check_choice(o, where, "knapsack_fallback", KNAPSACK_FALLBACKS)
    check_int(o, where, "knapsack_max_n", 2, " (the 2-rollout floor of every prompt)")
    check_int(o, where, "knapsack_window", 1)
    check_int(o, where, "knapsack_min_rewards", 0)
    if o.allocation == "knapsack" and o.knapsack_fallback == "authors" and o.max_extra_per_prompt is not None:
        _fail(
            where,
            "max_extra_per_prompt",
            f"must be null with allocation=knapsack and knapsack_fallback=authors (the authors' rule caps a "
            f"prompt with {where}knapsack_max_n)",
            o.max_extra_per_prompt,
        )


def _icl(o: Any, where: str) -> None:
    check_int(o, where, "icl_k", 1)


def _icl_prompt(o: Any, where: str) -> None:
    _check_choice(o, where, "icl_train_prompt", ICL_TRAIN_PROMPTS)
    check_number(o, where, "icl_min_similarity", 0, most=1)  # a cosine similarity


def _stream(o: Any, where: str) -> None:
    _check_choice(o, where, "planner", PLANNERS)
    check_number(o, where, "stream_quorum", 0, strict=True)
    if o.stream_quorum > 1:
        _fail(where, "stream_quorum", "must be in (0, 1] (a share of the step's prompts)", o.stream_quorum)


def _corpus(o: Any, where: str) -> None:
    if not isinstance(o.embedder, str) or not o.embedder:
        _fail(where, "embedder", "must name an embedder (e.g. 'wordllama')", o.embedder)
    check_int(o, where, "corpus_max_per_problem", 1)


def _sharpen(o: Any, where: str) -> None:
    _check_choice(o, where, "icl_novelty", ICL_NOVELTY)
    check_number(o, where, "lam_nov", 0)
    check_number(o, where, "kappa_clip", 0)
    check_number(o, where, "full_reward")


def _batch(o: Any, where: str) -> None:
    _check_choice(o, where, "sampler", SAMPLERS)
    check_int(o, where, "max_gen_batches", 1)


def _treepo(o: Any, where: str) -> None:
    check_int(o, where, "tree_segment_len", 0, " (0: derived)")
    for name in ("tree_max_depth", "tree_branch", "tree_init_branch"):
        check_int(o, where, name, 1)
    _check_choice(o, where, "tree_divergence", TREE_DIVERGENCES)
    check_number(o, where, "tree_divergence_temp", 0, strict=True)


def _cures(o: Any, where: str) -> None:
    check_number(o, where, "cures_prior_alpha", 0, strict=True)
    check_number(o, where, "cures_prior_beta", 0, strict=True)
    check_number(o, where, "cures_temp_scale", 0, strict=True)
    check_number(o, where, "cures_success_threshold")
    check_int(o, where, "cures_warmup_rollouts", 0)
    check_int(o, where, "cures_min_count", 2, " (a group of one has no reward variance)")


_SECTION_CHECKS = {
    LossConfig: _loss,
    AdvantageConfig: _advantage,
    AllocationConfig: _allocation,
    ICLConfig: _icl,
    ICLPromptConfig: _icl_prompt,
    StreamConfig: _stream,
    CorpusConfig: _corpus,
    SharpenConfig: _sharpen,
    BatchConfig: _batch,
    TreePOConfig: _treepo,
    CuresConfig: _cures,
}


def check_knobs(obj: Any, where: str = "") -> None:
    """Check every section ``obj`` embeds, then the rules across sections; a ValueError names ``where`` + the key."""
    for section, check in _SECTION_CHECKS.items():
        if isinstance(obj, section):
            for f in fields(section):  # a YAML "false" or a null is not false (verl's blocks: untyped)
                if f.type in (bool, "bool") and not isinstance(getattr(obj, f.name), bool):
                    _fail(where, f.name, "must be true or false", getattr(obj, f.name))
            check(obj, where)
    has = lambda *names: all(hasattr(obj, n) for n in names)  # noqa: E731
    if has("tree_advantage", "sharpen") and obj.tree_advantage and obj.sharpen:
        _fail(
            where,
            "sharpen",
            f"must be false with {where}tree_advantage=true (Eq. 6 sharpens GRPO's group "
            "advantage, which the tree advantage replaces)",
            obj.sharpen,
        )
    if has("allocation", "icl") and obj.allocation == "cures" and obj.icl:
        _fail(
            where,
            "icl",
            "must be false with allocation=cures (CurES generates each step in one batch; ICL "
            "seeding needs XRPO's planning rounds)",
            obj.icl,
        )
    if has("allocation", "dynamic_sampling") and obj.allocation == "cures" and obj.dynamic_sampling:
        _fail(
            where,
            "dynamic_sampling",
            "must be false with allocation=cures (CurES chooses its own prompts)",
            obj.dynamic_sampling,
        )
    if has("sampler", "allocation", "icl") and obj.sampler == "tree":
        # the tree sampler grows every prompt's rollouts at once: nothing to plan per round, no ICL prompt
        if obj.allocation != "uniform":
            _fail(
                where,
                "allocation",
                f"must be uniform with {where}sampler=tree (hierarchical planning allocates "
                "rounds of independent rollouts; a tree's width is the prompt's even share)",
                obj.allocation,
            )
        if obj.icl:
            _fail(
                where,
                "icl",
                f"must be false with {where}sampler=tree (ICL seeding draws independent rollouts from an ICL prompt)",
                obj.icl,
            )


# ---------------------------------------------------------------------------------------------------------------
# a knob under another name (`xrpo simulate`'s flat options): default, docstring and check stay the section's
# ---------------------------------------------------------------------------------------------------------------


def knob(section: type, name: str, default: Any = MISSING) -> Any:
    """A dataclass field that is ``section``'s knob ``name`` under the field's own name (`xrpo simulate`'s
    ``rounds`` is `AllocationConfig`'s ``plan_rounds``): its default is the section's unless ``default`` is given,
    its docstring is the section's (`xrpo.rundir.fields.field_docs`, unless the field has its own), and
    `check_knob_fields` runs the section's check on it."""
    sec = {f.name: f for f in fields(section)}[name]
    return field(default=sec.default if default is MISSING else default, metadata={"knob": (section, name)})


def knob_section(obj: Any, section: type) -> Any:
    """``section`` with ``obj``'s values of its `knob` fields (the section's defaults for the others)."""
    values = {
        f.metadata["knob"][1]: getattr(obj, f.name)
        for f in fields(obj)
        if f.metadata.get("knob", (None,))[0] is section
    }
    return section(**values)


def check_knob_fields(obj: Any) -> None:
    """Run the owning section's check on every `knob` field of ``obj``; an error names the field and the knob."""
    names = {f.metadata["knob"]: f.name for f in fields(obj) if "knob" in f.metadata}
    for section in dict.fromkeys(sec for sec, _ in names):
        try:
            _SECTION_CHECKS[section](knob_section(obj, section), "")
        except ValueError as e:
            named = re.match(r"config field (\w+)", str(e))
            field_name = names.get((section, named.group(1))) if named else None
            raise ValueError(f"{field_name}: {e}" if field_name else str(e)) from None
