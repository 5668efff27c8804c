"""`verispec train` on the tiny byte-level Llama of `bench --quick`: Magpie and document
prompts, cached features (equal to the feature channel's), the unrolled EAGLE loss (equal to
drafting), the vocabulary, determinism and resumption, fitting on several data directories
(`--also`), and a trained head that the engine accepts far more often than an untrained one on
held-back sequences."""

from __future__ import annotations

import json
import time
from dataclasses import replace

import pytest
import torch
from safetensors.torch import load_file, save_file

from verispec import GREEDY, generate
from verispec.bench.quick import tiny_llama, tiny_tokenizer
from verispec.cli import main
from verispec.head_kind import HeadKind
from verispec.heads import load_head, read_config
from verispec.models.base import FINAL
from verispec.models.runtimes.hf import HFCausalLM
from verispec.proposers.eagle import EagleProposer
from verispec.train import data as data_module
from verispec.train import documents as documents_module
from verispec.train.data import (
    DataCache, InstructionRecipe, ResponseRecipe, answer_groups, compute_features, concatenate_features, data_recipe, grow,
    load_features,
)
from verispec.train.documents import DocumentRecipe, Documents, Passage, quoted
from verispec.train.loop import (
    TrainSettings, TrainingData, build_head, choose_vocab, eagle_steps, evaluate, fit, head_loss, heldout_split,
    heldout_split_by_part, learning_rate, shifted,
)
from verispec.train.prompts import OPENERS, end_of_turn_ids, fold, user_turn_prefix

END = 2  # <|im_end|> of the tiny tokenizer
# The tiny random model never closes a user turn by itself, so its turns are cut at max_tokens.
TINY_INSTRUCTIONS = InstructionRecipe(batch=24, max_tokens=20, min_chars=1, closed_only=False)
TINY_RESPONSES = ResponseRecipe(max_new_tokens=40, batch=24)
# Short passages: the tiny tokenizer spends a token per byte.
TINY_DOCUMENTS = DocumentRecipe(min_chars=40, max_chars=200, batch=6, answer_batch_tokens=1200, python_distributions=False)
PASSAGES = [
    Passage("alpha", "The alpha tool reads its settings from alpha.conf and prints a report."),
    Passage("beta", "Run beta --check to verify the archive before you unpack it with beta -x."),
    Passage("gamma", "Gamma keeps one log per day under /var/log/gamma and rotates them weekly."),
    Passage("python:delta", "Delta parses dates written in many formats and returns them as timestamps."),
]


@pytest.fixture(scope="module")
def tiny():
    tokenizer = tiny_tokenizer()
    return tiny_llama(len(tokenizer)).requires_grad_(False), tokenizer


@pytest.fixture(scope="module")
def tiny_data(tiny, tmp_path_factory):
    model, tokenizer = tiny
    cache = DataCache(tmp_path_factory.mktemp("data"))
    conversations = grow(cache, model, tokenizer, (END,), 0, time.monotonic() + 600, TINY_INSTRUCTIONS, TINY_RESPONSES, max_sequences=96)
    stored, taps = load_features(cache, model, conversations)
    return cache, conversations, stored, taps


def test_magpie_prefix_is_the_template_up_to_the_users_words(tiny):
    _, tokenizer = tiny
    assert tokenizer.decode(user_turn_prefix(tokenizer)) == "<|im_start|>user\n"
    assert end_of_turn_ids(tokenizer, (END,)) == (END,)
    assert fold("  Say  HI\n") == fold("say hi")


def test_grow_is_deterministic_and_resumes_round_by_round(tiny, tmp_path):
    model, tokenizer = tiny
    whole, parts = DataCache(tmp_path / "whole"), DataCache(tmp_path / "parts")
    grown = grow(whole, model, tokenizer, (END,), 3, time.monotonic() + 600, TINY_INSTRUCTIONS, TINY_RESPONSES, max_sequences=40)
    first = grow(parts, model, tokenizer, (END,), 3, time.monotonic() + 600, TINY_INSTRUCTIONS, TINY_RESPONSES, max_sequences=20)
    resumed = grow(parts, model, tokenizer, (END,), 3, time.monotonic() + 600, TINY_INSTRUCTIONS, TINY_RESPONSES, max_sequences=40)
    assert 20 <= len(first) < 40 and grown == resumed == parts.conversations()
    assert len({fold(c.instruction) for c in grown}) == len(grown)
    assert {c.sampled for c in grown} == {False, True}


def test_grow_to_a_count_is_exact_and_a_function_of_the_seed_and_the_count(tiny, tmp_path):
    """`conversations=N` stops at exactly N, cutting the round that reaches it; two growths of
    one seed and count write the same sequences.jsonl; grown to a cut count and then further,
    the cut round is replayed, so the file equals one growth to the larger count; a cache
    holding more than N is refused."""
    model, tokenizer = tiny
    one, two, parts = (DataCache(tmp_path / name) for name in ("one", "two", "parts"))
    for cache in (one, two):
        assert len(grow(cache, model, tokenizer, (END,), 7, 0.0, TINY_INSTRUCTIONS, TINY_RESPONSES, conversations=37)) == 37
    assert one.sequences_path.read_bytes() == two.sequences_path.read_bytes()
    assert len(one.conversations()) == 37 and one.partial_round() == one.conversations()[-1].round  # 37 cuts a round of 24
    first = grow(parts, model, tokenizer, (END,), 7, 0.0, TINY_INSTRUCTIONS, TINY_RESPONSES, conversations=13)
    assert len(first) == 13 and parts.partial_round() == first[-1].round
    assert len(grow(parts, model, tokenizer, (END,), 7, 0.0, TINY_INSTRUCTIONS, TINY_RESPONSES, conversations=37)) == 37
    assert parts.sequences_path.read_bytes() == one.sequences_path.read_bytes()
    whole = grow(parts, model, tokenizer, (END,), 7, time.monotonic() + 600, TINY_INSTRUCTIONS, TINY_RESPONSES, max_sequences=40)
    assert parts.partial_round() is None and whole[:37] == one.conversations()
    assert [c.round for c in whole] == sorted(c.round for c in whole) and len({fold(c.instruction) for c in whole}) == len(whole)
    with pytest.raises(ValueError, match="already holds 37 conversations, more than the 20"):
        grow(one, model, tokenizer, (END,), 7, 0.0, TINY_INSTRUCTIONS, TINY_RESPONSES, conversations=20)


def test_magpie_recipe_is_unchanged_so_existing_data_directories_keep_growing():
    recipe = data_recipe("smollm2-135m-instruct", 0, InstructionRecipe(), ResponseRecipe())
    assert json.dumps(recipe) == (
        '{"model": "smollm2-135m-instruct", "seed": 0, "instructions": {"method": "magpie: sample the user turn from '
        'the chat template\'s empty user prefix", "temperature": 1.0, "top_p": 0.95, "max_tokens": 96, "min_chars": 12, '
        '"max_chars": 400, "batch": 64, "closed_only": true}, "responses": {"answers": "the target\'s own, greedy and '
        'sampled at temperature 1 (top-k/top-p off)", "max_new_tokens": 192, "sampled_one_in": 3, "batch": 64}}'
    )

def test_openers_start_each_rounds_user_turns_and_are_recorded(tiny, tmp_path):
    """`--prompts openers`: round r's instructions all begin with openers[r % len]; the recipe
    names the openers (so another list is another data directory); without openers the opener
    is empty and the record is plain Magpie's."""
    model, tokenizer = tiny
    recipe = replace(TINY_INSTRUCTIONS, openers=("Write", "Solve it:"))
    grown = grow(DataCache(tmp_path), model, tokenizer, (END,), 4, time.monotonic() + 600, recipe, TINY_RESPONSES, max_sequences=60)
    assert {c.round for c in grown} >= {0, 1, 2}
    for c in grown:
        opener = recipe.openers[c.round % 2]
        assert c.instruction.startswith(opener) and len(c.instruction) > len(opener), (c.round, c.instruction)
        assert tokenizer.decode(c.prompt_ids).count(c.instruction) == 1
    record = data_recipe("m", 4, recipe, TINY_RESPONSES)["instructions"]
    assert record["openers"] == ["Write", "Solve it:"] and record["method"].startswith("magpie with openers")
    assert InstructionRecipe().opener(5) == "" and "openers" not in InstructionRecipe().as_dict()
    assert len(OPENERS) % ResponseRecipe().sampled_one_in != 0 and len(set(OPENERS)) == len(OPENERS)



def test_grow_with_documents_quotes_passages_resumes_and_runs_out(tiny, tmp_path):
    """Every instruction is one template over one quoted passage; the rounds resumed one at a
    time equal one run; growth stops when every (passage, template) pair was used."""
    model, tokenizer = tiny
    documents = Documents(TINY_DOCUMENTS, PASSAGES)
    whole, parts = DataCache(tmp_path / "whole"), DataCache(tmp_path / "parts")
    grown = grow(whole, model, tokenizer, (END,), 5, time.monotonic() + 600, documents, TINY_RESPONSES)
    first = grow(parts, model, tokenizer, (END,), 5, time.monotonic() + 600, documents, TINY_RESPONSES, max_sequences=10)
    resumed = grow(parts, model, tokenizer, (END,), 5, time.monotonic() + 600, documents, TINY_RESPONSES)
    assert len(first) == 12 and grown == resumed == parts.conversations()
    assert len(grown) == len(PASSAGES) * len(TINY_DOCUMENTS.templates) == len({c.instruction for c in grown})
    assert [c.round for c in grown] == sorted(c.round for c in grown) and {c.sampled for c in grown} == {False, True}
    made = {t.format(text=quoted(p.text)) for t in TINY_DOCUMENTS.templates for p in PASSAGES}
    assert {c.instruction for c in grown} == made
    for c in grown:
        assert tokenizer.decode(c.prompt_ids).count(c.instruction) == 1
        assert c.answer_ids and (c.answer_ids[-1] == END or len(c.answer_ids) == TINY_RESPONSES.max_new_tokens)


def test_answer_groups_keep_magpie_batches_and_group_long_prompts_by_length():
    prompts = [[1] * n for n in (50, 400, 60, 390, 55, 410, 70)]
    responses = ResponseRecipe(max_new_tokens=100, batch=3)
    assert answer_groups(prompts, responses, None) == [[0, 1, 2], [3, 4, 5], [6]]
    groups = answer_groups(prompts, responses, 1600)
    assert sorted(i for g in groups for i in g) == list(range(len(prompts)))
    assert groups == [[0, 4, 2], [6], [3, 1, 5]]
    for g in groups:
        assert len(g) <= 3 and (len(g) == 1 or len(g) * max(len(prompts[i]) + 100 for i in g) <= 1600)


def test_concatenated_features_equal_one_cache_holding_both(tiny, tiny_data, tmp_path):
    model, tokenizer = tiny
    _, conversations, stored, taps = tiny_data
    documents = Documents(TINY_DOCUMENTS, PASSAGES)
    other = grow(DataCache(tmp_path), model, tokenizer, (END,), 1, time.monotonic() + 600, documents, TINY_RESPONSES, max_sequences=6)
    other_stored, _ = compute_features(model, other)
    union = concatenate_features([stored, other_stored])
    together, together_taps = compute_features(model, conversations + other)
    assert together_taps == taps
    for name in ("tokens", "starts", "answer_starts", "argmax"):
        assert torch.equal(union[name], together[name]), name
    assert torch.allclose(union["features"].float(), together["features"].float(), atol=0.05, rtol=0.02)
    assert torch.allclose(union["logsumexp"], together["logsumexp"], atol=1e-4)


def test_cached_features_are_the_feature_channels(tiny, tiny_data):
    model, _ = tiny
    _, conversations, stored, taps = tiny_data
    lm = HFCausalLM(model)
    lm.record_features(taps)
    for s in (0, 7):
        ids = conversations[s].prompt_ids + conversations[s].answer_ids
        a, b = int(stored["starts"][s]), int(stored["starts"][s + 1])
        channel = lm.score_features(ids, taps).reshape(len(ids), len(taps), -1)  # [n, F, H]
        cached = stored["features"][a:b].float()
        assert torch.allclose(cached, channel, atol=1e-2 * channel.abs().max().item(), rtol=1e-2)
        assert torch.equal(stored["argmax"][a:b].long(), lm.score(ids).argmax(-1))


def test_vocabulary_is_the_most_frequent_tokens_plus_end_of_turn():
    tokens = torch.tensor([5, 5, 5, 9, 9, 1, 7, 7, 7, 7])
    assert choose_vocab(tokens, 2, always=()).tolist() == [5, 7]
    assert choose_vocab(tokens, 2, always=(3,)).tolist() == [3, 7]
    assert choose_vocab(tokens, 100, always=()).tolist() == [1, 5, 7, 9]


def test_unrolled_steps_equal_drafting_with_the_heads_cache(tiny):
    """Step j of the training-time-test unroll at anchor t gives exactly the logits drafting
    computes: the true pairs 0..t in the cache, then the head's own predicted features fed back."""
    model, _ = tiny
    lm = HFCausalLM(model)
    settings = TrainSettings(kind="eagle", taps="final", vocab_size=64)
    head = build_head("eagle", settings, lm, model.config, "tiny", torch.arange(64)).eval()
    ids = torch.randint(0, 200, (1, 12))
    hidden = torch.randn(1, 12, 64)
    with torch.no_grad():
        steps = eagle_steps(head, ids, hidden, 3)
        for t in (0, 4, 8):
            cache = head.new_cache()
            logits, predicted = head(ids[:, 1 : t + 2], hidden[:, : t + 1], cache)
            assert torch.allclose(logits[0, -1], steps[0][0][0, t], atol=1e-4)
            for j in (1, 2):
                logits, predicted = head(ids[:, t + 1 + j : t + 2 + j], predicted[:, -1:], cache)
                assert torch.allclose(logits[0, -1], steps[j][0][0, t], atol=1e-4), (t, j)


def test_an_epoch_holds_every_training_sequence_once_in_batches_of_like_length(tiny_data):
    _, _, stored, taps = tiny_data
    settings = TrainSettings(kind="eagle", taps="final", batch_tokens=512)
    data = TrainingData(stored, taps, (FINAL,), settings)
    unsorted = TrainingData(stored, taps, (FINAL,), replace(settings, sort_window=1))

    def padding(groups):
        padded = sum(len(g) * max(data.lengths[i] for i in g) for g in groups)
        return 1 - sum(data.lengths[i] for g in groups for i in g) / padded

    for epoch in (0, 1):
        groups = data.epoch(epoch)
        assert sorted(i for g in groups for i in g) == sorted(data.train)
        assert all(len(g) == 1 or len(g) * max(data.lengths[i] for i in g) <= 512 for g in groups)
        assert groups == data.epoch(epoch)
        assert padding(groups) < 0.5 * padding(unsorted.epoch(epoch))
    assert data.epoch(0) != data.epoch(1)


def _dense_loss(head, batch, rows, settings):
    """The loss over every row of the padded batch, masked afterwards: (loss, correct, counted)."""
    p = torch.softmax(batch.final @ rows.T, -1)  # [B, T, N]
    scored = batch.scored & batch.valid
    if settings.kind == "eagle":
        steps = eagle_steps(head, batch.ids, head.fuse(batch.features), settings.unroll)
    else:
        logits = head(batch.features)  # [B, T, K, N]
        steps = [(logits[:, :, i], None) for i in range(logits.shape[2])]
    losses, correct, counted = [], [], []
    for by, (logits, predicted) in enumerate(steps, start=1):
        mask = shifted(scored, by, False)
        weight = mask.float() / mask.sum().clamp(min=1)
        loss = (-(shifted(p, by) * torch.log_softmax(logits, -1)).sum(-1) * weight).sum()
        if predicted is not None:
            regression = torch.nn.functional.smooth_l1_loss(predicted, shifted(batch.final, by), reduction="none").mean(-1)
            loss = loss + settings.feature_weight * (regression * weight).sum()
        losses.append(loss)
        correct.append(int(((head.d2t[logits.argmax(-1)] == shifted(batch.argmax, by)) & mask).sum()))
        counted.append(int(mask.sum()))
    return torch.stack(losses).mean(), correct, counted


@pytest.mark.parametrize("kind", ["eagle", "medusa"])
@pytest.mark.parametrize("positions", ["answers", "turns"])
def test_loss_over_scored_rows_equals_the_loss_over_the_padded_batch(tiny, tiny_data, kind, positions):
    """Fitting computes the output layer and the cross-entropy on the scored rows only; loss,
    gradients and agreement counts equal those of the whole padded batch masked afterwards."""
    model, _ = tiny
    _, _, stored, taps = tiny_data
    lm = HFCausalLM(model)
    settings = TrainSettings(kind=kind, taps="final", vocab_size=96, bf16=False)
    data = TrainingData(stored, taps, settings.head_taps(lm.num_layers), settings, turn_start=3)
    d2t = choose_vocab(stored["tokens"], settings.vocab_size, (END,))
    torch.manual_seed(0)
    head = build_head(kind, settings, lm, model.config, "tiny", d2t)
    rows = lm.output_embeddings()[d2t].float()
    batch = data.batch(data.train[:8], positions)
    assert batch.valid.sum() > (batch.scored & batch.valid).sum() > 0 and not batch.valid.all()  # padding and an unscored prompt
    result = head_loss(head, batch, rows, settings)
    fast = torch.autograd.grad(result.loss, [q for q in head.parameters() if q.requires_grad])
    loss, correct, counted = _dense_loss(head, batch, rows, settings)
    dense = torch.autograd.grad(loss, [q for q in head.parameters() if q.requires_grad])
    assert torch.allclose(result.loss, loss, rtol=1e-5, atol=1e-6)
    assert all(torch.allclose(a, b, rtol=1e-4, atol=1e-6) for a, b in zip(fast, dense))
    assert (result.correct, result.counted) == (correct, counted) and min(counted) > 0


def _trained(tiny, tiny_data, steps: int, kind: str = "eagle", work=None, resume=False):
    model, _ = tiny
    _, _, stored, taps = tiny_data
    lm = HFCausalLM(model)
    settings = TrainSettings(kind=kind, taps="final", vocab_size=96, batch_tokens=2048, lr=3e-3, warmup_steps=5)
    data = TrainingData(stored, taps, settings.head_taps(lm.num_layers), settings)
    d2t = choose_vocab(stored["tokens"], settings.vocab_size, (END,))
    head = build_head(kind, settings, lm, model.config, "tiny", d2t)
    rows = lm.output_embeddings()[d2t].float()
    if steps:
        fit(head, data, rows, settings, time.monotonic() + 600, work / f"{kind}.pt", resume, max_steps=steps)
    return head.eval(), lm, data, rows, settings


def _engine_acceptance(head, lm, conversations, data) -> float:
    """Mean accepted drafts per round, greedy, k = 4, continuing held-back conversations."""
    accepted = rounds = 0
    for i in data.heldout:
        c = conversations[i]
        prompt = c.prompt_ids + c.answer_ids[:4]
        result = generate(lm, EagleProposer(head, lm), prompt, max_new_tokens=24, sampling=GREEDY, k=4)
        accepted += sum(result.stats.accepted)
        rounds += len(result.stats.accepted)
    return accepted / rounds


def test_training_raises_acceptance_on_held_back_sequences(tiny, tiny_data, tmp_path):
    """The engine's mean accepted drafts per round (greedy, k = 4) on held-back conversations
    with a trained head must exceed the untrained head's by 1.5 tokens; measured: ~0.1 before,
    ~3 after 60 steps. It fails if the loss, the unroll or the head's features were wrong."""
    _, conversations, _, _ = tiny_data
    untrained, lm, data, rows, settings = _trained(tiny, tiny_data, 0)
    trained, *_ = _trained(tiny, tiny_data, 60, work=tmp_path)
    before = _engine_acceptance(untrained, lm, conversations, data)
    after = _engine_acceptance(trained, lm, conversations, data)
    assert after > before + 1.5, (before, after)
    assert min(evaluate(trained, data, rows, settings)) > 0.6


def test_turns_scores_the_users_words_and_answers_but_never_the_template(tiny, tiny_data):
    """`score="turns"` adds the positions whose next token is the user's (from `turn_start`)
    to the answer positions; the template before the user's words is never scored, and the
    held-back evaluation stays on answers."""
    model, tokenizer = tiny
    _, conversations, stored, taps = tiny_data
    settings = TrainSettings(kind="eagle", taps="final", vocab_size=96, score="turns")
    turn_start = len(user_turn_prefix(tokenizer))
    data = TrainingData(stored, taps, settings.head_taps(model.config.num_hidden_layers), settings, turn_start)
    indices = [0, 1, 2]
    answers, turns = data.batch(indices), data.batch(indices, "turns")
    assert torch.equal(answers.valid, turns.valid)
    for row, i in enumerate(indices):
        n, prompt = data.lengths[i], len(conversations[i].prompt_ids)
        assert turns.scored[row, :n].tolist() == [u + 1 >= turn_start for u in range(n)]
        assert answers.scored[row, :n].tolist() == [u + 1 >= prompt for u in range(n)]
        assert turn_start < prompt and not turns.scored[row, n:].any()


def test_medusa_training_raises_held_back_agreement(tiny, tiny_data, tmp_path):
    untrained, _, data, rows, settings = _trained(tiny, tiny_data, 0, kind="medusa")
    trained, *_ = _trained(tiny, tiny_data, 40, kind="medusa", work=tmp_path)
    before, after = evaluate(untrained, data, rows, settings), evaluate(trained, data, rows, settings)
    assert all(a > b + 0.3 for a, b in zip(after, before)), (before, after)


def test_fitting_is_deterministic_and_resumes_exactly(tiny, tiny_data, tmp_path):
    straight, *_ = _trained(tiny, tiny_data, 6, work=tmp_path / "a")
    again, *_ = _trained(tiny, tiny_data, 6, work=tmp_path / "b")
    (tmp_path / "c").mkdir()
    _trained(tiny, tiny_data, 4, work=tmp_path / "c")
    resumed, *_ = _trained(tiny, tiny_data, 6, work=tmp_path / "c", resume=True)
    for name, tensor in straight.state_dict().items():
        assert torch.equal(tensor, again.state_dict()[name]), name
        assert torch.equal(tensor, resumed.state_dict()[name]), name


def test_a_checkpoint_from_before_a_new_setting_resumes_as_its_default(tiny, tiny_data, tmp_path):
    straight, *_ = _trained(tiny, tiny_data, 6, work=tmp_path / "a")
    (tmp_path / "b").mkdir()
    _trained(tiny, tiny_data, 4, work=tmp_path / "b")
    state = torch.load(tmp_path / "b" / "eagle.pt", weights_only=True)
    del state["settings"]["steps"], state["settings"]["decay"]  # written before those settings existed
    torch.save(state, tmp_path / "b" / "eagle.pt")
    resumed, *_ = _trained(tiny, tiny_data, 6, work=tmp_path / "b", resume=True)
    for name, tensor in straight.state_dict().items():
        assert torch.equal(tensor, resumed.state_dict()[name]), name


def test_learning_rate_warms_up_holds_and_decays_to_zero_over_the_planned_steps():
    constant = TrainSettings(kind="eagle", lr=1.0, warmup_steps=4)
    decayed = TrainSettings(kind="eagle", lr=1.0, warmup_steps=4, steps=100, decay=0.2)
    assert [learning_rate(s, constant) for s in (0, 3, 50, 99, 500)] == [0.25, 1.0, 1.0, 1.0, 1.0]
    assert [learning_rate(s, decayed) for s in (0, 3, 80, 90, 99, 100, 130)] == [0.25, 1.0, 1.0, 0.5, 0.05, 0.0, 0.0]
    with pytest.raises(ValueError, match="planned steps"):
        TrainSettings(kind="eagle", decay=0.2)


def test_each_data_directory_holds_back_its_own_sequences_whatever_is_fitted_beside_it():
    """So a head continued with `--init` on more data, with any seed, is never scored on a
    sequence it fitted: each directory's split follows the seed that made its data."""
    alone, _ = heldout_split(200, 3, 0.05)
    heldout, train = heldout_split_by_part([(200, 3), (57, 2), (1, 4)], 0.05)
    assert heldout[:len(alone)] == alone and heldout[len(alone):] == [200 + i for i in heldout_split(57, 2, 0.05)[0]]
    assert heldout_split(57, 2, 0.05) != heldout_split(57, 3, 0.05)  # so the line above tells the seeds apart
    assert sorted(heldout + train) == list(range(258)) and 257 in train  # a one-sequence part holds nothing back
    assert heldout_split_by_part([(200, 3)], 0.05) == heldout_split(200, 3, 0.05)
    assert heldout_split_by_part([(57, 4), (200, 3)], 0.05)[0][-len(alone):] == [57 + i for i in alone]


@pytest.fixture()
def tiny_model_dir(tiny, tmp_path):
    model, tokenizer = tiny
    path = tmp_path / "tiny-model"
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def test_cli_trains_a_head_that_the_proposer_loads(tiny_model_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(data_module, "InstructionRecipe", lambda: TINY_INSTRUCTIONS)
    monkeypatch.setattr(data_module, "ResponseRecipe", lambda: TINY_RESPONSES)
    out, work = tmp_path / "head", tmp_path / "work"
    args = ["train", "--model", str(tiny_model_dir), "--head", "eagle", "--minutes", "5", "--out", str(out),
            "--work", str(work), "--max-sequences", "30", "--steps", "5", "--vocab", "64", "--taps", "final",
            "--threads", "1", "--dtype", "float32", "--decay", "0.4"]
    assert main(args) == 0
    config = read_config(out)
    assert config.training["steps"] == 5 and config.training["data"]["sequences"] >= 30
    assert config.training["settings"]["steps"] == 5 and config.training["settings"]["decay"] == 0.4
    assert config.training["tokens_seen"] > 0 and config.training["settings"]["seed"] == 0
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]
    head = load_head(out, HFCausalLM(tiny_llama(len(tiny_tokenizer()))))
    assert head.config.feature_layers == (FINAL,)
    capsys.readouterr()
    assert main(args) == 2  # a head is already there
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "--force" in err[0]


def test_cli_data_conversations_rebuilds_the_same_data_directory(tiny_model_dir, tmp_path, monkeypatch, capsys):
    """`--data-only --data-conversations N` grows exactly N conversations, whatever the clock;
    two work directories of the same seed and count hold the same sequences.jsonl; a directory
    holding more than N is refused with one error line."""
    monkeypatch.setattr(data_module, "InstructionRecipe", lambda: TINY_INSTRUCTIONS)
    monkeypatch.setattr(data_module, "ResponseRecipe", lambda: TINY_RESPONSES)
    common = ["train", "--model", str(tiny_model_dir), "--head", "eagle", "--minutes", "0.001", "--threads", "1",
              "--dtype", "float32", "--out", str(tmp_path / "unused"), "--data-only", "--seed", "5"]
    files = []
    for name in ("a", "b"):
        assert main([*common, "--work", str(tmp_path / name), "--data-conversations", "29"]) == 0
        assert "data: 29 sequences" in capsys.readouterr().out
        files.append((tmp_path / name / "data" / "sequences.jsonl").read_bytes())
    assert files[0] == files[1] and len(files[0].splitlines()) == 29
    assert main([*common, "--work", str(tmp_path / "a"), "--data-conversations", "29"]) == 0  # already there: nothing grows
    assert (tmp_path / "a" / "data" / "sequences.jsonl").read_bytes() == files[0]
    capsys.readouterr()
    assert main([*common, "--work", str(tmp_path / "a"), "--data-conversations", "10"]) == 2
    assert "already holds 29 conversations, more than --data-conversations 10" in _one_error(capsys)


def test_cli_init_continues_a_head_on_more_data(tiny_model_dir, tmp_path, monkeypatch, capsys):
    """`--init DIR` starts from DIR's weights and vocabulary: on the union of DIR's data and
    more, the held-back score before fitting is DIR's own (its data holds back the same
    sequences), the vocabulary stays DIR's, and the new head records where it started. A head
    of other settings (a deeper one included), or `--init` with `--data-only`, gets one error
    line. `--depth 2` from a one-layer head starts where that head stands (its held-back score)."""
    monkeypatch.setattr(data_module, "InstructionRecipe", lambda: TINY_INSTRUCTIONS)
    monkeypatch.setattr(data_module, "ResponseRecipe", lambda: TINY_RESPONSES)
    monkeypatch.setattr(documents_module, "DocumentRecipe", lambda: _documents_tree(tmp_path / "doc"))
    common = ["--model", str(tiny_model_dir), "--head", "eagle", "--minutes", "5", "--threads", "1", "--dtype", "float32",
              "--vocab", "64", "--taps", "final"]
    first, documents, work = tmp_path / "first", tmp_path / "documents", tmp_path / "magpie"
    assert main(["train", *common, "--out", str(first), "--work", str(work), "--max-sequences", "40", "--steps", "8"]) == 0
    assert main(["train", *common, "--out", str(tmp_path / "unused"), "--work", str(documents), "--prompts", "documents", "--data-only"]) == 0
    out = tmp_path / "continued"
    assert main(["train", *common, "--out", str(out), "--work", str(work), "--also", str(documents), "--steps", "3",
                 "--init", str(first), "--lr", "1e-9", "--data-minutes", "0"]) == 0
    alone = tmp_path / "alone"
    assert main(["train", *common, "--out", str(alone), "--work", str(work), "--steps", "1", "--init", str(first), "--data-minutes", "0"]) == 0
    made, continued = read_config(first).training, read_config(out).training
    assert read_config(alone).training["heldout_top1_by_step_init"] == made["heldout_top1_by_step"]  # same weights, same held-back
    lm = HFCausalLM(tiny_llama(len(tiny_tokenizer())))
    start, head = load_head(first, lm), load_head(out, lm)
    assert torch.equal(head.d2t, start.d2t)
    union = concatenate_features([load_file(w / "data" / "features.safetensors") for w in (work, documents)])
    assert not torch.equal(head.d2t, choose_vocab(union["tokens"], 64, (END,)))  # a fresh head's would differ
    for name, tensor in start.state_dict().items():  # 3 steps at a vanishing rate: the weights barely move
        assert torch.allclose(tensor, head.state_dict()[name], atol=1e-6), name
    held = continued["data"]["heldout_sequences"] - round(0.05 * continued["data"]["also"][0]["sequences"])
    assert held == made["data"]["heldout_sequences"]
    assert continued["settings"]["init"] == str(first.resolve())
    assert continued["init"]["steps"] == 8 and continued["init"]["command"] == made["command"]
    deeper = tmp_path / "deeper"  # --depth 2 from the one-layer head: layer 2 starts as the identity
    assert main(["train", *common, "--out", str(deeper), "--work", str(work), "--steps", "1", "--depth", "2",
                 "--init", str(first), "--data-minutes", "0"]) == 0
    assert read_config(deeper).depth == 2
    assert read_config(deeper).training["heldout_top1_by_step_init"] == made["heldout_top1_by_step"]
    assert main(["train", *common, "--out", str(tmp_path / "deepest"), "--work", str(work), "--steps", "1", "--depth", "3",
                 "--init", str(deeper), "--data-minutes", "0"]) == 0
    capsys.readouterr()
    for extra, message in ((["--vocab", "32"], "vocabulary N (--vocab) 64 where this run has 32"),
                           (["--head", "medusa"], "kind (--head) eagle where this run has medusa"),
                           (["--taps", "eagle3"], "taps (--taps)"),
                           (["--init", str(deeper)], "depth (--depth) 2 where this run has 1, fewer")):
        args = ["train", *common, "--out", str(tmp_path / "bad"), "--work", str(work), "--steps", "1", "--data-minutes", "0",
                "--init", str(first), *extra]
        assert main(args) == 2
        assert message in _one_error(capsys)


def _documents_tree(root):
    for p in PASSAGES:
        (root / p.source.replace("python:", "")).mkdir(parents=True)
        (root / p.source.replace("python:", "") / "README").write_text(p.text + "\n")
    return replace(TINY_DOCUMENTS, doc_roots=(str(root),), min_chars=60)


def _one_error(capsys) -> str:
    """The one `error:` line, last on stderr after progress lines, without a traceback."""
    err = capsys.readouterr().err.strip().splitlines()
    assert [line for line in err if line.startswith("error: ")] == err[-1:] and "Traceback" not in "".join(err), err
    return err[-1]


def test_cli_fits_on_the_union_of_data_directories(tiny_model_dir, tmp_path, monkeypatch, capsys):
    """`--prompts documents --data-only` makes its own data directory; `--also` fits on it
    and the work directory's magpie data together, recording both; data made for another
    model or other taps is refused."""
    monkeypatch.setattr(data_module, "InstructionRecipe", lambda: TINY_INSTRUCTIONS)
    monkeypatch.setattr(data_module, "ResponseRecipe", lambda: TINY_RESPONSES)
    monkeypatch.setattr(documents_module, "DocumentRecipe", lambda: _documents_tree(tmp_path / "doc"))
    common = ["--model", str(tiny_model_dir), "--head", "eagle", "--minutes", "5", "--threads", "1", "--dtype", "float32"]
    magpie, documents = tmp_path / "magpie", tmp_path / "documents"
    assert main(["train", *common, "--out", str(tmp_path / "unused"), "--work", str(documents), "--prompts", "documents", "--data-only"]) == 0
    recipe = json.loads((documents / "data" / "recipe.json").read_text())
    assert recipe["instructions"]["method"].startswith("documents:") and recipe["instructions"]["passages"] == len(PASSAGES)
    out = tmp_path / "head"
    fit_args = ["train", *common, "--out", str(out), "--work", str(magpie), "--max-sequences", "24", "--steps", "2",
                "--vocab", "64", "--taps", "final"]
    assert main([*fit_args, "--also", str(documents)]) == 0
    data = read_config(out).training["data"]
    [also] = data["also"]
    magpie_sequences = len(DataCache(magpie / "data").conversations())
    assert data["instructions"]["method"].startswith("magpie") and data["sequences"] == magpie_sequences
    assert also["instructions"] == recipe["instructions"] and also["sequences"] == len(PASSAGES) * len(TINY_DOCUMENTS.templates)
    assert data["total_sequences"] == data["sequences"] + also["sequences"] and data["total_tokens"] == data["tokens"] + also["tokens"]
    assert data["heldout_sequences"] == round(0.05 * data["sequences"]) + round(0.05 * also["sequences"])  # each its own share
    union = concatenate_features([load_file(w / "data" / "features.safetensors") for w in (magpie, documents)])
    head = load_head(out, HFCausalLM(tiny_llama(len(tiny_tokenizer()))))
    assert torch.equal(head.d2t, choose_vocab(union["tokens"], 64, (END,)))
    alone = load_file(magpie / "data" / "features.safetensors")["tokens"]
    assert not torch.equal(head.d2t, choose_vocab(alone, 64, (END,)))  # the documents' tokens count
    capsys.readouterr()

    assert main([*fit_args, "--force", "--also", str(documents), "--also", str(documents / "data")]) == 2
    assert "twice" in _one_error(capsys)
    other = tmp_path / "other-model" / "data"
    other.mkdir(parents=True)
    (other / "recipe.json").write_text(json.dumps({**recipe, "model": "another-model"}))
    assert main([*fit_args, "--force", "--also", str(other.parent)]) == 2
    assert "another-model" in _one_error(capsys)
    stored = load_file(documents / "data" / "features.safetensors")
    save_file(stored, str(documents / "data" / "features.safetensors"), metadata={"taps": json.dumps(["final", 1])})
    assert main([*fit_args, "--force", "--also", str(documents / "data")]) == 2
    assert "taps" in _one_error(capsys)


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--prompts", "wiki"], "--prompts must be magpie, openers, documents or texts"),
        (["--also", "/nonexistent/verispec-data"], "no such directory"),
        (["--also", ".", "--data-only"], "--also adds data to the fitting"),
        (["--head", "lstm"], "--head must be eagle, eagle3 or medusa"),
        (["--minutes", "0"], "--minutes must be a finite number > 0"),
        (["--data-minutes", "9"], "--data-minutes must lie in"),
        (["--taps", "low"], "--taps must be eagle3 or final"),
        (["--vocab", "0"], "--vocab must be an integer >= 1"),
        (["--score", "all"], "--score must be answers or turns"),
        (["--decay", "0.2"], "--decay plans the learning rate over --steps"),
        (["--decay", "1.5", "--steps", "10"], "--decay must lie in [0, 1]"),
        (["--init", ".", "--data-only"], "--init starts the fitting from a head"),
        (["--depth", "0"], "--depth must be an integer >= 1"),
        (["--head", "medusa", "--depth", "2"], "--depth stacks an EAGLE head's decoder layers"),
        (["--head", "eagle3", "--taps", "final"], "an eagle3 head reads the low, middle and high layers"),
        (["--data-conversations", "0"], "--data-conversations must be an integer >= 1"),
        (["--data-conversations", "10", "--data-minutes", "0"], "give one of them"),
        (["--data-conversations", "10", "--max-sequences", "5"], "--data-conversations sets the data's size exactly"),
        (["--lr", "-1"], "--lr must be a finite number in (0, 1], got -1.0"),
        (["--lr", "nan"], "--lr must be a finite number in (0, 1], got nan"),
        (["--minutes", "inf"], "--minutes must be a finite number > 0, got inf"),
        (["--dtype", "q4"], "--dtype must be auto, float32 or bfloat16, got 'q4'; the data's features are computed in a float dtype"),
        (["--resume"], "--resume: no checkpoint at"),
        (["--init", "/nonexistent/verispec-head"], "--init /nonexistent/verispec-head is not a directory"),
        (["--init", "MEDUSA"], "--init MEDUSA holds a head of another kind (--head) medusa where this run has eagle"),
        (["--out", "FILE/h"], "is a file, not a directory"),
        (["--work", "FILE/w"], "--work FILE/w: FILE is a file, not a directory; choose another path"),
    ],
)
def test_cli_refuses_bad_input_with_one_error_line(extra, message, tmp_path, capsys, monkeypatch):
    """Every value is checked when the run's config is made: before any model loads."""
    from verispec.heads import save_head
    from verispec.heads.untrained import tiny_head
    from verispec.models.loading import load
    from verispec.models.tables import random_table

    def refuse(*args, **kwargs):
        raise AssertionError("the command loaded a model before checking its input")

    monkeypatch.setattr(load, "load_model", refuse)
    medusa = tmp_path / "medusa"
    save_head(tiny_head("medusa", random_table(8, 1, seed=0)), medusa)
    (tmp_path / "file").write_text("x")
    extra = [word.replace("MEDUSA", str(medusa)).replace("FILE", str(tmp_path / "file")) for word in extra]
    message = message.replace("MEDUSA", str(medusa)).replace("FILE", str(tmp_path / "file"))
    args = ["train", "--head", "eagle", "--minutes", "1", "--out", str(tmp_path / "h"), "--work", str(tmp_path / "w"), *extra]
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0]


def test_cli_refuses_a_vocabulary_it_cannot_fill_and_writes_nothing_when_nothing_was_fitted(tiny_model_dir, tmp_path, monkeypatch, capsys):
    """--vocab above the model's vocabulary is refused before any data grows; above the data's
    distinct tokens, before fitting; a budget the data and features used up fits no step, and
    then nothing is written to --out (the data stays for the next run)."""
    monkeypatch.setattr(data_module, "InstructionRecipe", lambda: TINY_INSTRUCTIONS)
    monkeypatch.setattr(data_module, "ResponseRecipe", lambda: TINY_RESPONSES)
    out, work = tmp_path / "head", tmp_path / "work"
    common = ["train", "--model", str(tiny_model_dir), "--head", "eagle", "--taps", "final", "--threads", "1",
              "--dtype", "float32", "--out", str(out), "--work", str(work), "--data-conversations", "5"]
    assert main([*common, "--minutes", "1", "--vocab", "10000000"]) == 2
    line = _one_error(capsys)
    assert "--vocab 10000000 exceeds" in line and "vocabulary of 259 tokens" in line and not work.exists()
    assert main([*common, "--minutes", "1", "--vocab", "259", "--steps", "1"]) == 2
    line = _one_error(capsys)
    assert "distinct tokens, fewer than --vocab 259" in line and not out.exists()
    assert main([*common, "--minutes", "0.000001"]) == 2
    line = _one_error(capsys)
    assert "no time was left to fit a step" in line and f"nothing was written to {out}" in line
    assert not out.exists() and len(DataCache(work / "data").conversations()) == 5


def test_a_training_run_is_callable_from_python_in_named_stages(tiny_model_dir, tmp_path, monkeypatch):
    from verispec.train.config import TrainConfig
    from verispec.train.run import run

    monkeypatch.setattr(data_module, "InstructionRecipe", lambda: TINY_INSTRUCTIONS)
    monkeypatch.setattr(data_module, "ResponseRecipe", lambda: TINY_RESPONSES)
    config = TrainConfig(head="medusa", out=tmp_path / "head", minutes=5, model=str(tiny_model_dir), work=tmp_path / "w",
                         data_conversations=6, steps=2, vocab=16, threads=1, dtype="float32", unroll=2)
    assert config.head is HeadKind.MEDUSA
    result = run(config)
    assert result.out == tmp_path / "head" and result.record["steps"] == 2 and result.conversations == 6
    assert read_config(result.out).kind is HeadKind.MEDUSA
    with pytest.raises(ValueError, match="already holds a head"):
        TrainConfig(head="medusa", out=tmp_path / "head", minutes=5, model=str(tiny_model_dir))
