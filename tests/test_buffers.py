"""The executor's buffer pool (vtrain/graph/buffers.py): a buffer anyone still holds is never handed
out again, a free one is, and a certified step's bits do not depend on it."""

from __future__ import annotations

import pytest
import torch

from vtrain.graph.buffers import BufferPool
from vtrain.graph.executor import StepExecutor, concat_flat, state_tensors
from vtrain.numerics.logfile import encode_step_log
from vtrain.training.loop import batch_for

BIG = (1 << 21,)  # 8 MiB of FP32: above the pool's threshold


def test_a_free_buffer_is_handed_out_again_and_a_held_one_never() -> None:
    pool = BufferPool()
    a = pool.empty(BIG, torch.float32)
    a.fill_(1.0)
    b = pool.empty(BIG, torch.float32)  # a is held: a new buffer
    assert b.data_ptr() != a.data_ptr()
    b.fill_(2.0)
    assert bool((a == 1.0).all())
    view = a[10:20]  # a view holds the buffer too
    ptr = a.data_ptr()
    del a
    c = pool.empty(BIG, torch.float32)
    assert c.data_ptr() != ptr and c.data_ptr() != b.data_ptr()
    c.fill_(3.0)
    assert bool((view == 1.0).all())
    del view
    d = pool.empty((1 << 20,), torch.float64)  # the same bytes, another dtype and shape: the freed buffer
    assert d.data_ptr() == ptr and d.dtype == torch.float64 and d.shape == (1 << 20,)
    assert len(pool._buffers) == 3


def test_small_and_far_larger_requests_do_not_take_a_buffer() -> None:
    pool = BufferPool()
    a = pool.empty(BIG, torch.float32)
    ptr = a.data_ptr()
    del a
    small = pool.empty((1000,), torch.float32)  # below the threshold: plain torch.empty
    assert small.data_ptr() != ptr and pool._buffers[0].owner is not None
    half = pool.empty((BIG[0] * 3 // 4,), torch.float32)  # a buffer serves requests of at least 1/1.25 of it
    assert half.data_ptr() != ptr
    del half
    assert pool.empty((BIG[0] * 9 // 10,), torch.float32).data_ptr() == ptr


def test_retire_releases_what_a_step_did_not_take() -> None:
    pool = BufferPool()
    kept = pool.empty(BIG, torch.float32)
    pool.empty(BIG, torch.float32)  # freed at once
    assert pool.retire() == 0  # both taken in this "step"
    assert pool.held_bytes == 2 * BIG[0] * 4
    assert pool.retire() == BIG[0] * 4  # the free one was not taken again: released; the held one stays
    assert pool.held_bytes == BIG[0] * 4
    del kept
    pool.retire()
    assert pool.held_bytes == 0


def test_a_disabled_pool_is_torch_empty() -> None:
    pool = BufferPool(enabled=False)
    a = pool.empty(BIG, torch.float32)
    assert a.shape == BIG and not pool._buffers


def test_concat_flat_copies_into_the_given_buffer() -> None:
    pool = BufferPool(min_bytes=0)
    parts = [torch.arange(5, dtype=torch.float32), torch.arange(3, dtype=torch.float32) + 10]
    got = concat_flat(parts, pool.empty)
    assert torch.equal(got, torch.cat(parts))
    assert got.untyped_storage().data_ptr() == pool._buffers[0].owner.data_ptr()


@pytest.fixture(scope="module")
def wide_job():
    """A GPT whose output head and flat AdamW state are above the pool's threshold."""
    from vtrain.models.nn import GPTConfig
    from vtrain.models.optim import AdamWConfig
    from vtrain.training.spec import TrainSpec, build_job

    spec = TrainSpec(model="gpt", optimizer=AdamWConfig(), batch_size=2, steps=4, mode="certified",
                     gpt=GPTConfig(vocab=4096, n_layer=1, d_model=256, n_head=4, context=64))
    return build_job(spec)


def test_steps_recycle_their_buffers_and_keep_the_bits(wide_job, monkeypatch) -> None:
    """Four chained steps with the pool: the same states, losses and logs as without it; from the
    third step on no new buffer (the old state's buffers come back once the caller drops them); the
    states handed on are never overwritten by later steps."""
    job = wide_job

    def run(ex: StepExecutor) -> tuple[list, list[list[torch.Tensor]]]:
        state, results, states = state_tensors(job.initial_state), [], []
        for s in range(1, 5):
            res = ex.run(state, batch_for(job, s), step=s)
            results.append((res.loss, encode_step_log(res.log, s, job.graph)))
            state = res.state
            states.append([t.clone() for t in state])
            if s == 2:
                sizes = len(ex.buffers._buffers)
            if s >= 2:
                assert len(ex.buffers._buffers) <= sizes
        return results, states, state

    pooled = StepExecutor(job.graph, "certified", seed=job.spec.data_seed)
    res_p, states_p, last = run(pooled)
    assert pooled.buffers.held_bytes > 0
    monkeypatch.setenv("VTRAIN_BUFFER_POOL", "0")
    plain = StepExecutor(job.graph, "certified", seed=job.spec.data_seed)
    assert not plain.buffers.enabled
    res_n, states_n, _ = run(plain)
    assert res_p == res_n
    for a, b in zip(states_p, states_n, strict=True):
        assert all(torch.equal(x.view(torch.int32), y.view(torch.int32)) for x, y in zip(a, b, strict=True))
    # the handed-on state is intact after another step from it (its buffers are held, never reused)
    copy = [t.clone() for t in last]
    pooled.run(last, batch_for(job, 5), step=5)
    pooled.run(last, batch_for(job, 5), step=5)
    assert all(torch.equal(x, y) for x, y in zip(last, copy, strict=True))
