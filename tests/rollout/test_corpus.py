"""xrpo.rollout.corpus: Algorithm 1 line 15, the step's correct rollouts join the ICL corpus."""

from __future__ import annotations

from xrpo.icl import ICLCorpus, get_embedder
from xrpo.rollout.corpus import update_corpus
from xrpo.rollout.records import PlanConfig

from ._fakes import problems_and_rates
from ._fakes import record as _record
from ._fakes import result as _result


def test_update_corpus_skips_blank_correct_rollouts_and_counts_them():
    probs, _, _ = problems_and_rates()
    corpus = ICLCorpus(get_embedder("hash"))
    res = _result(
        [
            _record(0, 1.0, " \\boxed{0}"),
            _record(0, 1.0, ""),
            _record(1, 1.0, " \n"),
            _record(1, 0.0, " \\boxed{5}"),
            _record(2, 1.0, " \\boxed{4}"),
        ]
    )
    m = update_corpus(res, probs, corpus, PlanConfig(), step=7)
    assert m == {"icl/corpus_added": 2.0, "icl/skipped_empty_solutions": 2.0}
    assert corpus.problem_ids() == ["p0", "p2"]
    assert [s.solution for s in corpus.entry("p0")[1]] == [" \\boxed{0}"]
