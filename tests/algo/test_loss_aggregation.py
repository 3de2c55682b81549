"""--loss-agg global-token-mean: the loss of an optimiser step cut into micro-batches (accumulation steps) and
ranks, as DeepSpeed combines them (mean over accumulation steps, mean over ranks), equals the token mean of the
whole step computed at once; the counts come from the super-batch before the micro-batches, summed over ranks."""
import multiprocessing as mp

import pytest
import torch

from async_rl.algo import LossInputs, Objective
from async_rl.algo.functional import StepCounts, aggregate, loss_aggregation, optimiser_step_counts

F64 = torch.float64
LENGTHS = [1, 9, 2, 10, 3, 12, 1, 8]  # very different response lengths: the modes disagree
T = 12


def _batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    rows = len(LENGTHS)
    mask = torch.arange(T).expand(rows, T) < torch.tensor(LENGTHS).unsqueeze(1)
    logp_old = -torch.rand(rows, T, generator=g, dtype=F64) * 3
    logp = (logp_old + 0.3 * torch.randn(rows, T, generator=g, dtype=F64)).requires_grad_(True)
    advantage = torch.randn(rows, generator=g, dtype=F64)
    entropy = torch.rand(rows, T, generator=g, dtype=F64)
    return logp, logp_old, advantage, entropy, mask


def _inputs(logp, logp_old, advantage, entropy, mask, rows, counts=None):
    zeros = torch.zeros(len(rows), dtype=F64)
    return LossInputs(logp[rows], logp_old[rows], entropy[rows], zeros, zeros, None, advantage[rows],
                      logp_ref=logp_old[rows] - 0.2, mask=mask[rows], step_counts=counts)


def _objective(mode):
    return Objective("clip", {"clip_eps": 0.2}, entropy_coef=0.01, kl_ref_coef=0.1, kl_coef=0.05, loss_agg=mode)


def _accumulated(mode, micro_batch, ranks):
    """(loss, gradient) of one optimiser step over all rows: rank r holds rows r::ranks; each rank's micro-batches
    are its accumulation steps; the loss of each is divided by (accumulation steps x ranks), as DeepSpeed's
    gradient accumulation and rank average do."""
    logp, logp_old, advantage, entropy, mask = _batch()
    rank_rows = [list(range(len(LENGTHS)))[r::ranks] for r in range(ranks)]
    accumulation = len(rank_rows[0]) // micro_batch
    counts = None
    if mode == "global-token-mean":  # what each rank's trainer computes, the all-reduce done by hand
        totals = [optimiser_step_counts(mask[rows], torch.arange(len(rows)), micro_batch, accumulation, ranks)[0]
                  for rows in rank_rows]
        counts = StepCounts(sum(c.tokens for c in totals), sum(c.actions for c in totals))
    objective, total = _objective(mode), 0.0
    for rows in rank_rows:
        for k in range(accumulation):
            part = rows[k * micro_batch:(k + 1) * micro_batch]
            loss = objective(_inputs(logp, logp_old, advantage, entropy, mask, part, counts)).loss
            (loss / (accumulation * ranks)).backward()
            total += float(loss.detach()) / (accumulation * ranks)
    return total, logp.grad.clone()


def _one_batch_token_mean():
    """The token mean of the whole step, all rows in one micro-batch (the definition)."""
    logp, logp_old, advantage, entropy, mask = _batch()
    loss = _objective("minibatch-token-mean")(_inputs(logp, logp_old, advantage, entropy, mask, list(range(len(LENGTHS))))).loss
    loss.backward()
    return float(loss.detach()), logp.grad.clone()


@pytest.mark.parametrize("micro_batch, ranks", [(1, 1), (2, 1), (2, 2), (1, 4), (4, 2)])
def test_global_token_mean_over_accumulation_steps_and_ranks_equals_the_one_batch_value(micro_batch, ranks):
    want_loss, want_grad = _one_batch_token_mean()
    loss, grad = _accumulated("global-token-mean", micro_batch, ranks)
    assert loss == pytest.approx(want_loss, rel=1e-10)
    torch.testing.assert_close(grad, want_grad, rtol=1e-9, atol=1e-12)


def test_the_per_micro_batch_token_mean_is_not_the_global_one():
    """What ``token-mean`` did (and ``minibatch-token-mean`` still does): a token's weight depends on its
    micro-batch; the test above would catch a global mode that fell back to it."""
    want_loss, want_grad = _one_batch_token_mean()
    loss, grad = _accumulated("minibatch-token-mean", 2, 2)
    assert abs(loss - want_loss) > 1e-3 and (grad - want_grad).abs().max() > 1e-3


def test_mode_names_and_their_aliases():
    assert loss_aggregation("token-mean") == "minibatch-token-mean"
    assert Objective("clip", loss_agg="token-mean").loss_agg == "minibatch-token-mean"
    with pytest.raises(ValueError, match="valid global-token-mean, minibatch-token-mean"):
        loss_aggregation("token-sum")
    x, mask = torch.ones(2, 3), torch.tensor([[1, 1, 0], [1, 0, 0]], dtype=torch.bool)
    with pytest.raises(ValueError, match="needs the optimiser step's token count"):
        aggregate(x, mask, "global-token-mean")
    assert aggregate(x, None, "global-token-mean").item() == 1.0  # fixed-size actions: every micro-batch alike
    assert aggregate(x * 2, mask, "global-token-mean", divisor=6.0).item() == pytest.approx(1.0)


def test_step_counts_cut_a_pass_into_optimiser_steps_in_its_row_order():
    mask = torch.arange(T).expand(len(LENGTHS), T) < torch.tensor(LENGTHS).unsqueeze(1)
    order = torch.tensor([7, 0, 1, 6, 2, 5, 3, 4])
    counts = optimiser_step_counts(mask, order, micro_batch=2, accumulation_steps=2, ranks=1)
    first, second = order[:4].tolist(), order[4:].tolist()
    assert [c.tokens for c in counts] == [sum(LENGTHS[i] for i in first) / 2, sum(LENGTHS[i] for i in second) / 2]
    assert [c.actions for c in counts] == [2.0, 2.0]
    segments = mask.reshape(4, 2, T)  # [N, T, A] segments of steps (V-trace's items): their steps' tokens
    counts = optimiser_step_counts(segments, torch.arange(4), micro_batch=1, accumulation_steps=4, ranks=1)
    assert counts[0].tokens == sum(LENGTHS) / 4 and counts[0].actions == len(LENGTHS) / 4


def _rank_counts(rank, path, queue):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{path}", rank=rank, world_size=2)
    mask = torch.arange(T).expand(len(LENGTHS), T) < torch.tensor(LENGTHS).unsqueeze(1)
    mine = mask[rank::2]
    counts = optimiser_step_counts(mine, torch.arange(len(mine)), micro_batch=2, accumulation_steps=2, ranks=2)
    queue.put((rank, [(c.tokens, c.actions) for c in counts]))
    dist.destroy_process_group()


def test_step_counts_are_summed_over_the_training_group(tmp_path):
    """Two real gloo ranks: each counts its own rows and the all-reduce gives both the whole step's count."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_rank_counts, args=(r, tmp_path / "store", queue)) for r in range(2)]
    for proc in procs:
        proc.start()
    results = dict(queue.get(timeout=120) for _ in procs)
    for proc in procs:
        proc.join(timeout=60)
        assert proc.exitcode == 0
    whole = (sum(LENGTHS) / 4, len(LENGTHS) / 4)
    assert results[0] == results[1] == [whole]
