"""Answer extraction, micro/macro/K-hop metrics and the GRPO rewards on worked examples."""

from __future__ import annotations

import math

import pytest

from tokenswap.crossmath import (
    REWARDS,
    aggregate_runs,
    chain_of_thought,
    extract_answer,
    format_metrics_table,
    format_reward,
    generate_puzzle,
    get_hop_weighted_reward,
    gold_answer,
    gold_hops,
    hop_weighted_reward,
    hop_weights,
    khop_accuracy,
    macro_accuracy,
    micro_accuracy,
    micro_accuracy_reward,
    score_run,
)
from tokenswap.crossmath.rewards import validate_hop_weighting

GOLD = ["12", "5", "30", "7"]
HOPS = [1, 2, 3, 5]


def test_extract_answer_last_tag_case_and_separators():
    assert extract_answer("<answer>1 2</answer> then <Answer>\n3,4|5\t6\n</ANSWER>") == ["3", "4", "5", "6"]
    assert extract_answer("<answer></answer>") == []
    assert extract_answer("answer: 3 4") is None
    assert extract_answer("<answer>3 4") is None  # unclosed tag: no answer


@pytest.mark.parametrize(
    "pred, micro, macro",
    [
        (["12", "5", "30", "7"], 1.0, 1.0),
        (["12", "5", "30"], 0.75, 0.0),  # missing position is wrong
        (["12", "5", "30", "7", "9"], 1.0, 0.0),  # extra tokens: every gold position right, but not an exact match
        (["12.0", "5", "30", "7"], 0.75, 0.0),  # exact string match: "12.0" != "12"
        (["5", "30", "7"], 0.0, 0.0),  # a shifted answer is misaligned everywhere
        (None, 0.0, 0.0),  # no <answer> tag
    ],
)
def test_micro_macro_single_puzzle(pred, micro, macro):
    assert micro_accuracy([pred], [GOLD]) == micro
    assert macro_accuracy([pred], [GOLD]) == macro


def test_micro_is_an_instance_mean_and_khop_is_pooled():
    preds = [["1", "2"], ["1", "9", "9", "9"]]
    golds = [["1", "2"], ["1", "2", "3", "4"]]
    hops = [[1, 2], [1, 2, 4, 6]]
    # Instance mean (1 + 1/4) / 2, not the pooled 3/6.
    assert micro_accuracy(preds, golds) == pytest.approx(0.625)
    assert macro_accuracy(preds, golds) == 0.5
    khop = khop_accuracy(preds, golds, hops)
    assert khop["step1"] == 1.0 and khop["step2"] == 0.5 and khop["step4+"] == 0.0
    run = score_run(preds, golds, hops)
    assert set(run) == {"micro", "macro", "step1", "step2", "step3", "step4+"}
    with pytest.raises(ValueError, match="must align"):
        khop_accuracy(preds, golds, [[1], [1, 2, 3, 4]])


# The official calc_metric.py scores these inputs; each expectation is what it computes for them.
def test_a_partial_run_is_scored_on_the_puzzles_it_covers():
    golds = [["1", "2"], ["3"], ["4", "5"]]
    hops = [[1, 2], [1], [3, 1]]
    partial = score_run([["1", "9"], ["3"]], golds, hops)  # the run stopped after two puzzles
    assert partial == score_run([["1", "9"], ["3"]], golds[:2], hops[:2])
    assert partial["micro"] == pytest.approx(0.75) and partial["macro"] == 0.5
    # Predictions past the last puzzle are ignored.
    assert score_run([["1", "2"], ["3"], ["4", "5"], ["6"]], golds, hops)["macro"] == 1.0
    with pytest.raises(ValueError, match="no puzzles to score"):
        micro_accuracy([], golds)


def test_an_empty_hop_bucket_scores_zero_not_nan():
    khop = khop_accuracy([["1", "2"]], [["1", "2"]], [[1, 1]])
    assert khop == {"step1": 1.0, "step2": 0.0, "step3": 0.0, "step4+": 0.0}
    assert not any(math.isnan(v) for v in aggregate_runs([khop]).values() for v in v)


def test_a_single_run_has_zero_std():
    single = aggregate_runs([{"micro": 0.5, "step3": 0.0}])
    assert single == {"micro": (50.0, 0.0), "step3": (0.0, 0.0)}
    assert "| text | 100.00 ± 0.00 |" in format_metrics_table(
        {"text": aggregate_runs([score_run([GOLD], [GOLD], [HOPS])])}
    )


@pytest.mark.parametrize(
    "label, bucket",
    [
        ("step2", "step2"),
        ("Step 2", "step2"),
        ("2", "step2"),
        ("second", "step2"),
        ("step7", "step4+"),
        ("step0", "step4+"),
    ],
)
def test_step_labels_are_read_as_the_official_script_reads_them(label, bucket):
    record = {"markdown_answer": "| 5 | 6 |", "markdown_answer_step": f"| step1 | {label} |"}
    khop = khop_accuracy([["5", "6"]], [gold_answer(record)], [gold_hops(record)])
    assert khop[bucket] == 1.0 and khop["step1"] == 1.0


def test_aggregate_runs_uses_sample_std_times_100():
    summary = aggregate_runs(
        [{"micro": 0.2, "macro": 0.0}, {"micro": 0.4, "macro": 0.0}, {"micro": 0.6, "macro": 0.0}]
    )
    assert summary["micro"] == pytest.approx((40.0, 20.0))  # sample std (n - 1), not population (16.33)
    assert summary["macro"] == (0.0, 0.0)
    table = format_metrics_table(
        {"text": aggregate_runs([score_run([GOLD], [GOLD], [HOPS]), score_run([None], [GOLD], [HOPS])])}
    )
    assert table.splitlines()[0] == "| setting | micro | macro | step1 | step2 | step3 | step4+ |"
    assert "| text | 50.00 ± 70.71 | 50.00 ± 70.71 |" in table


def test_gold_from_record_matches_the_puzzle():
    puzzle = generate_puzzle(2, difficulty="hard")
    record = puzzle.to_record()
    assert gold_answer(record) == puzzle.answer
    assert gold_hops(record) == puzzle.hops
    with pytest.raises(ValueError, match="step<k>"):
        gold_hops({"markdown_answer_step": "| step |"})


def test_hop_weighted_reward_worked_example():
    completions = [
        "<answer>12 5 30 7</answer>",
        "<answer>12 5 99 7</answer>",  # misses the hop-3 blank: 1 - 3/11
        "<answer>0 5 30 7</answer>",  # misses the hop-1 blank: 1 - 1/11
        "<answer>12 5</answer>",  # missing positions are wrong: 3/11
        "I think 12 5 30 7",  # unparsable
        [{"role": "assistant", "content": "<answer>12.0 5 30 7</answer>"}],
        [{"role": "assistant", "content": [{"type": "text", "text": "<answer>12 5 30 7 1</answer>"}]}],
    ]
    rewards = hop_weighted_reward(completions, answer=[GOLD] * 7, answer_hops=[HOPS] * 7, prompts=["p"] * 7)
    assert rewards == pytest.approx([1.0, 8 / 11, 10 / 11, 3 / 11, 0.0, 10 / 11, 1.0])


def test_weightings_and_their_relation_to_micro():
    completions = ["<answer>12 5 99 7</answer>", "<answer>0 5 30 7</answer>", "no answer"]
    kwargs = dict(answer=[" ".join(GOLD)] * 3, answer_hops=[HOPS] * 3)
    uniform = get_hop_weighted_reward("uniform")(completions, **kwargs)
    assert uniform == micro_accuracy_reward(completions, answer=[GOLD] * 3) == [0.75, 0.75, 0.0]
    power = get_hop_weighted_reward("power", p=2.0)(completions, **kwargs)
    assert power == pytest.approx([1 - 9 / 39, 1 - 1 / 39, 0.0])
    affine = get_hop_weighted_reward("affine", alpha=0.5)(completions, **kwargs)
    assert affine == pytest.approx([1 - 2 / 7.5, 1 - 1 / 7.5, 0.0])  # weights 1, 1.5, 2, 3
    assert get_hop_weighted_reward("linear")(completions, **kwargs) == hop_weighted_reward(completions, **kwargs)
    with pytest.raises(ValueError, match="weighting must be one of"):
        get_hop_weighted_reward("cubic")
    with pytest.raises(ValueError, match="must align"):
        hop_weighted_reward(["<answer>1</answer>"], answer=[["1", "2"]], answer_hops=[[1]])


def test_rewards_skip_samples_without_gold_and_check_format():
    out = hop_weighted_reward(
        ["<answer>3</answer>", "<answer>3</answer>"], answer=[None, ["3"]], answer_hops=[None, [2]]
    )
    assert out == [None, 1.0]
    assert micro_accuracy_reward(["<answer>3</answer>"], answer=[None]) == [None]
    assert format_reward(
        ["<answer>3 14</answer>\n", "<answer></answer>", "<answer>3 ١٤</answer>", "<answer>3 14</answer> done"]
    ) == [1.0, 0.0, 0.0, 0.0]
    assert format_reward(["<answer>3 14</answer>"] * 2, answer=[["3", "14"], "3 14 15"]) == [1.0, 0.0]
    assert set(REWARDS) == {"hop_weighted", "micro_accuracy", "format"}
    assert REWARDS["hop_weighted"] is hop_weighted_reward


def test_solver_chain_of_thought_earns_full_reward():
    puzzle = generate_puzzle(8, difficulty="hard")
    cot = chain_of_thought(puzzle.grid)
    assert hop_weighted_reward([cot], answer=[puzzle.answer], answer_hops=[puzzle.hops]) == [1.0]
    assert format_reward([cot], answer=[puzzle.answer]) == [1.0]


@pytest.mark.parametrize(
    "weighting, p, alpha, field",
    [
        ("power", -1.0, 1.0, "reward.p"),
        ("power", float("nan"), 1.0, "reward.p"),
        ("affine", 1.0, -1.0, "reward.alpha"),
    ],
)
def test_weightings_that_fall_with_hop_are_rejected_when_built(weighting, p, alpha, field):
    with pytest.raises(ValueError, match=f"{field} must be >= 0"):
        validate_hop_weighting(weighting, p, alpha)
    with pytest.raises(ValueError, match=f"{field} must be >= 0"):
        get_hop_weighted_reward(weighting, p=p, alpha=alpha)
    # Never a ZeroDivisionError at reward time: alpha = -1 would weigh hop-2 blanks 0.
    with pytest.raises(ValueError, match=field):
        hop_weights([2, 2], weighting, p, alpha)


def test_flat_and_growing_weightings_stay_allowed():
    for weighting, p, alpha in (
        ("power", 0.0, 1.0),
        ("affine", 1.0, 0.0),
        ("uniform", -3.0, -3.0),
        ("linear", -1, -1),
    ):
        validate_hop_weighting(weighting, p, alpha)
    assert get_hop_weighted_reward("affine", alpha=0.0)(
        ["<answer>1 2</answer>"], answer=[["1", "3"]], answer_hops=[[2, 2]]
    ) == [0.5]
    with pytest.raises(ValueError, match="reward.weighting must be one of"):
        validate_hop_weighting("cubic")


def test_grpo_recipe_config_rejects_falling_weights_at_config_time():
    import importlib.util
    import sys
    from pathlib import Path

    path = Path(__file__).parents[3] / "recipes" / "grpo.py"
    spec = importlib.util.spec_from_file_location("recipe_grpo_crossmath_weights", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve string annotations through sys.modules
    spec.loader.exec_module(module)
    with pytest.raises(ValueError, match="reward.alpha must be >= 0"):
        module.RewardConfig(weighting="affine", alpha=-1.0)
    with pytest.raises(ValueError, match="reward.p must be >= 0"):
        module.RewardConfig(weighting="power", p=-2.0)
    assert module.RewardConfig(weighting="affine", alpha=0.5).alpha == 0.5
