"""xrpo.rollout.prompts: the exact strings a rollout engine receives, plain and ICL-seeded, with and without a chat
template, and the token budget of an ICL prompt."""

from __future__ import annotations

import copy

import pytest

from xrpo.data import Problem
from xrpo.icl import Example
from xrpo.rollout.prompts import PromptRenderer

TEMPLATE = (
    "{%- for m in messages -%}[{{ m['role'] }}]{{ m['content'] }}{%- endfor -%}"
    "{%- if add_generation_prompt -%}[assistant]{%- endif -%}"
)
EXAMPLES = [Example("a", "1+1", " 2", 0.9), Example("b", "2+2", " 4", 0.5), Example("c", "3+3", " 6", 0.1)]


@pytest.fixture()
def chat_tok(tiny_tokenizer):
    tok = copy.deepcopy(tiny_tokenizer)
    tok.chat_template = TEMPLATE
    return tok


@pytest.fixture()
def plain_tok(tiny_tokenizer):
    tok = copy.deepcopy(tiny_tokenizer)
    tok.chat_template = None
    return tok


def test_plain_prompts_with_and_without_the_chat_template(chat_tok, plain_tok):
    text = Problem("q", "5+5", "10")
    chat = Problem("m", [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "5+5"}], "10")
    r = PromptRenderer(chat_tok, prompt_template="Q: {prompt}\nA:")
    assert r.use_chat_template  # on by default where the tokenizer has a template
    assert r.render(text) == "[user]Q: 5+5\nA:[assistant]"
    # the template applies to the last user message; the system message stays as written
    assert r.render(chat) == "[system]Be brief.[user]Q: 5+5\nA:[assistant]"
    assert PromptRenderer(chat_tok, system_prompt="S").render(text) == "[system]S[user]5+5[assistant]"
    assert PromptRenderer(chat_tok, system_prompt="S").render(chat).count("[system]") == 1  # the problem's wins
    p = PromptRenderer(plain_tok, prompt_template="Q: {prompt}\nA:")
    assert not p.use_chat_template
    assert p.render(text) == "Q: 5+5\nA:"
    assert p.render(chat) == "Be brief.\nQ: 5+5\nA:"  # no template: contents joined, system first


def test_fewshot_icl_prompt_follows_the_task_format_and_drops_the_least_similar_to_fit(plain_tok):
    r = PromptRenderer(
        plain_tok, icl_style="fewshot", prompt_template="Q: {prompt}\nA:", fewshot_example="Q: {problem}\nA:{solution}"
    )
    problem = Problem("q", "5+5", "10")
    out = r.render_icl(problem, EXAMPLES[:2])
    assert out.text == "Q: 1+1\nA: 2\nQ: 2+2\nA: 4\nQ: 5+5\nA:"
    assert (out.num_examples, out.truncated, out.dropped) == (2, 0, 0)
    assert r.render_icl(problem, []).text == r.render(problem)  # no examples: the plain prompt
    one = "Q: 1+1\nA: 2\nQ: 5+5\nA:"
    budget = r.count_tokens(one)
    r.max_prompt_tokens = budget
    out = r.render_icl(problem, EXAMPLES)
    assert (out.text, out.num_examples, out.dropped) == (one, 1, 2)  # the two least similar left out
    r.max_prompt_tokens = r.count_tokens(r.render(problem))
    out = r.render_icl(problem, EXAMPLES)
    assert (out.text, out.num_examples, out.dropped) == (r.render(problem), 0, 3)


def test_fewshot_examples_next_to_the_question_after_the_templates_own_shots(plain_tok, chat_tok):
    template = "Q: 2+3\nA: 5\n\nQ: {prompt}\nA:"
    r = PromptRenderer(
        plain_tok,
        icl_style="fewshot",
        prompt_template=template,
        fewshot_example="Q: {problem}\nA:{solution}\n",
        fewshot_position="question",
    )
    problem = Problem("q", "5+5", "10")
    out = r.render_icl(problem, EXAMPLES[:2])
    # the template's fixed shot first, then the examples, most similar (1+1) last, then the question
    assert out.text == "Q: 2+3\nA: 5\n\nQ: 2+2\nA: 4\n\nQ: 1+1\nA: 2\n\nQ: 5+5\nA:"
    assert (out.num_examples, out.dropped) == (2, 0)
    # "start" puts them before the template's shot, most similar first
    start = PromptRenderer(
        plain_tok, icl_style="fewshot", prompt_template=template, fewshot_example="Q: {problem}\nA:{solution}\n"
    )
    assert start.render_icl(problem, EXAMPLES[:2]).text == (
        "Q: 1+1\nA: 2\n\nQ: 2+2\nA: 4\n\nQ: 2+3\nA: 5\n\nQ: 5+5\nA:"
    )
    # a budget: the least similar is dropped first, the most similar stays next to the question
    r.max_prompt_tokens = r.count_tokens("Q: 2+3\nA: 5\n\nQ: 1+1\nA: 2\n\nQ: 5+5\nA:")
    out = r.render_icl(problem, EXAMPLES)
    assert (out.text, out.num_examples, out.dropped) == ("Q: 2+3\nA: 5\n\nQ: 1+1\nA: 2\n\nQ: 5+5\nA:", 1, 2)
    # a template with nothing before the question's line: the same text as "start", the order reversed
    bare = PromptRenderer(
        plain_tok,
        icl_style="fewshot",
        prompt_template="Q: {prompt}\nA:",
        fewshot_example="Q: {problem}\nA:{solution}",
        fewshot_position="question",
    )
    assert bare.render_icl(problem, EXAMPLES[:2]).text == "Q: 2+2\nA: 4\nQ: 1+1\nA: 2\nQ: 5+5\nA:"
    with pytest.raises(ValueError, match="needs a text prompt"):
        r.render_icl(Problem("m", [{"role": "user", "content": "5+5"}], "10"), EXAMPLES[:1])
    with pytest.raises(ValueError, match="chat template"):
        PromptRenderer(chat_tok, icl_style="fewshot", fewshot_position="question")
    with pytest.raises(ValueError, match="fewshot_position must be one of"):
        PromptRenderer(plain_tok, icl_style="fewshot", fewshot_position="end")


def test_paper_icl_prompt_is_the_user_message_and_fits_the_budget_with_the_template(chat_tok):
    r = PromptRenderer(chat_tok, icl_style="paper")
    problem = Problem("q", "5+5", "10")
    out = r.render_icl(problem, EXAMPLES[:2])
    assert out.text.startswith("[user]") and out.text.endswith("[assistant]")
    body = out.text[len("[user]") : -len("[assistant]")]
    assert "<examples>" in body and "1+1" in body and "2+2" in body and "<new_problem>" in body and "5+5" in body
    assert out.num_examples == 2 and out.truncated == 0
    # a budget below the full prompt: solutions cut or examples left out, the wrapped prompt within the budget
    long = [Example("a", "1+1", " two " * 60, 0.9), Example("b", "2+2", " four " * 60, 0.5)]
    full = r.count_tokens(r.render_icl(problem, long).text)
    r.max_prompt_tokens = full - 40
    cut = r.render_icl(problem, long)
    assert r.count_tokens(cut.text) <= full - 40 and (cut.truncated > 0 or cut.dropped > 0)


def test_bad_arguments(chat_tok, plain_tok):
    with pytest.raises(ValueError, match="icl_style must be one of"):
        PromptRenderer(chat_tok, icl_style="xml")
    with pytest.raises(ValueError, match="prompt_template must contain {prompt}"):
        PromptRenderer(chat_tok, prompt_template="Q:")
    with pytest.raises(ValueError, match="use_chat_template=True but the tokenizer has no chat_template"):
        PromptRenderer(plain_tok, use_chat_template=True)
