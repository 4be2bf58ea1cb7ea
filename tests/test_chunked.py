"""The chunk level of long reductions (issue 8, part 2): MATMUL/SUM/MEAN elements of more than
MAX_DIRECT_TERMS terms are ruled from the trainer's per-chunk partial sums (DisputeGame
postPartials / disputeChunk / acceptPartials / settlePartials, ChunkAdjudicator, ChunkedSum),
mirrored by vtrain.numerics.exact. Games run on eth-tester with the real contracts and real Merkle proofs;
the long ops compute their real semantics (tests/game_harness.py ``simulate_real``)."""

from __future__ import annotations

import logging
from dataclasses import replace as dc_replace

import game_harness as H
import numpy as np
import pytest

from vtrain.graph.step_graph import OpKind
from vtrain.numerics import exact as X

log = logging.getLogger(__name__)

#: Per-transaction cap (2^24 gas).
TX_CAP = 16_777_216
#: Terms of the long reductions of the default run: three chunks (2048, 2048, 905 with the bias).
K = 5000


# ---------------------------------------------------------------------------------------------
# The Python mirror


def _wide(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Values spanning ~2^-60 .. 2^60, so terms fall below the quantum (inexact partials)."""
    return (rng.standard_normal(shape) * 2.0 ** rng.integers(-60, 60, shape)).astype(np.float32)


@pytest.mark.parametrize("kind", [OpKind.MATMUL, OpKind.SUM, OpKind.MEAN])
def test_partials_add_up_to_the_one_transaction_accumulation(kind: OpKind) -> None:
    rng = np.random.default_rng(int(kind))
    a, b, bias = _wide(rng, (2, K)), _wide(rng, (3, K)), _wide(rng, (3,))
    if kind == OpKind.MATMUL:
        desc, ins, n_out = X.OpDesc(kind, (0, 1, 2), (2, 3), ((2, K), (3, K), (3,)), ()), [a, b, bias], 6
    else:
        desc, ins, n_out = X.OpDesc(kind, (0,), (2, 1), ((2, K),), ()), [a], 2
    assert X.reduction_terms(desc) == K + (kind == OpKind.MATMUL) and X.is_chunked(desc)
    inexact = 0
    for i in range(n_out):
        p = X.element_partials(desc, ins, i)
        assert len(p) == X.chunk_count(X.reduction_terms(desc)) == 3
        assert X.partials_enclosure(desc, p) == X.enclosure(desc, ins, i)
        assert X.first_wrong_chunk(desc, ins, i, p) is None
        inexact += sum(q.inexact for q in p)
        claimed = X.rn32(X.exact_value(desc, ins, i))
        assert X.judge_partials(desc, p, i, claimed, None) == X.judge_element(desc, ins, i, claimed, None)
        assert not X.judge_partials(desc, p, i, X.neighbour(claimed, True), None)
        # One chunk off (any field) is found; a raised scale puts every chunk at the wrong scale.
        top = X.partials_scale(p)
        for field, value in (("sum", p[1].sum + 1), ("abs_sum", p[1].abs_sum + 1), ("max_exp", top + 1)):
            bad = list(p)
            bad[1] = dc_replace(bad[1], **{field: value})
            assert X.first_wrong_chunk(desc, ins, i, bad) == (0 if field == "max_exp" else 1), field
    assert inexact > 0  # the wide inputs exercise the floored terms


def test_chunk_reads_cover_the_terms_once() -> None:
    desc = X.OpDesc(OpKind.MATMUL, (0, 1, 2), (2, 3), ((2, 4096), (3, 4096), (3,)), ())
    ins = [np.ones((2, 4096), np.float32), np.ones((3, 4096), np.float32), np.ones(3, np.float32)]
    # 4097 terms: chunks of 2048, 2048 and the bias alone.
    assert [X.chunk_reads(desc, ins, 5, c) for c in range(3)] == [
        [X.Read(0, 4096, 2048), X.Read(1, 2 * 4096, 2048)],
        [X.Read(0, 4096 + 2048, 2048), X.Read(1, 2 * 4096 + 2048, 2048)],
        [X.Read(2, 2, 1)],
    ]


def test_models_with_long_reductions_are_disputable() -> None:
    """A model whose weight gradients sum over more than MAX_DIRECT_TERMS batch rows: every
    reduction fits the accumulator and the long ones go through the chunk level."""
    from vtrain.commit.trace import op_descriptors
    from vtrain.training.spec import TrainSpec, build_job

    g = build_job(TrainSpec(model="mlp", batch_size=5000)).graph
    descs = [d for op, d in zip(g.ops, op_descriptors(g), strict=True) if op.kind in (30, 31, 32)]
    terms = [X.reduction_terms(d) for d in descs]
    assert all(0 < n <= X.MAX_TERMS for n in terms), terms
    long_ones = [d for d, n in zip(descs, terms, strict=True) if n > X.MAX_DIRECT_TERMS]
    assert long_ones, terms
    # The honest claim of such an element (the shortest) stands when ruled from its partials.
    d = X.OpDesc.of(min(long_ones, key=X.reduction_terms))
    rng = np.random.default_rng(3)
    ins = [rng.uniform(-1, 1, s).astype(np.float32) for s in d.in_shapes]
    enc = X.enclosure(d, ins, 0)
    assert enc is not None and enc.lo == enc.hi  # uniform inputs: exact
    claimed = X.rn32(enc.value(enc.lo))
    p = X.element_partials(d, ins, 0)
    assert X.judge_partials(d, p, 0, claimed, None)
    assert not X.judge_partials(d, p, 0, X.neighbour(claimed, False), None)


# ---------------------------------------------------------------------------------------------
# Games on eth-tester


@pytest.fixture(scope="module")
def runs() -> dict[str, H.Run]:
    cfg = H.JobConfig(n_steps=1, interval_length=1)
    graph = H.long_graph(K)
    honest = H.simulate_real(cfg, graph)
    return {"cfg": cfg, "graph": graph, "honest": honest}  # type: ignore[dict-item]


def _cheat_run(runs: dict, op: str, index: int) -> H.Run:
    return H.simulate_real(runs["cfg"], runs["graph"], H.Cheat("element", 1, op=op, index=index))


def _max_gas(dep: H.Deployment) -> int:
    return max(g for _, g in dep.gas_log)


def _game(dep: H.Deployment, run: H.Run) -> int:
    job = H.active_job(dep, run)
    return H.challenge(dep, job, 0)


SLOW = pytest.mark.slow


@pytest.mark.parametrize(
    ("op", "element", "chunk"),
    [
        ("mm", 5, 2),  # the last chunk: 904 products and the bias
        pytest.param("mm", 4, 0, marks=SLOW),  # a full chunk of 2048 products
        pytest.param("mm", 1, None, marks=SLOW),
        pytest.param("sm", 1, 1, marks=SLOW),
        pytest.param("mean", 0, None, marks=SLOW),
    ],
)
def test_honest_trainer_never_loses_the_chunk_level(dep, runs, op: str, element: int, chunk: int | None) -> None:
    """A false challenger disputes a chunk (including the bias-only last chunk of ``mm``) or
    accepts the partials of an honest element: the trainer wins by the ruling."""
    run = runs["honest"]
    gid = _game(dep, run)
    j = run.graph.index[op]
    res = H.play(dep, gid, H.ChunkTrainer(dep, run), H.FalseChunkChallenger(dep, op=j, element=element, chunk=chunk))
    assert (res.status, res.ruling) == (H.GameStatus.TRAINER_WON, H.Ruling.ADJUDICATED), res
    want = H.Phase.CHUNK_CHECK if chunk is not None else H.Phase.PARTIALS_RULE
    assert res.phases[-3:] == [H.Phase.ONE_STEP, H.Phase.PARTIALS, want]
    assert _max_gas(dep) < TX_CAP


@pytest.mark.parametrize("op", ["mm", pytest.param("sm", marks=SLOW)])
def test_wrong_element_with_honest_partials_loses(dep, runs, op: str) -> None:
    """A full game down to a wrong element of a long MATMUL/SUM: the challenger accepts the
    (right) partials and the element is ruled from them."""
    cheat = _cheat_run(runs, op, 1)
    gid = _game(dep, cheat)
    res = H.play(dep, gid, H.ChunkTrainer(dep, cheat), H.ChunkChallenger(dep, runs["honest"]))
    assert (res.status, res.ruling) == (H.GameStatus.CHALLENGER_WON, H.Ruling.ADJUDICATED), res
    assert res.phases[-2:] == [H.Phase.PARTIALS, H.Phase.PARTIALS_RULE]
    v = dep.view(gid)
    assert (v["op"], v["index"]) == (runs["graph"].index[op], 1)
    log.info("full game through the chunk level (%s, %d terms): max gas per tx %d", op, K, _max_gas(dep))
    assert _max_gas(dep) < TX_CAP


def _off(field: str, chunk: int, delta: int):
    def tamper(p: list[X.Partial]) -> list[X.Partial]:
        p = list(p)
        p[chunk] = dc_replace(p[chunk], **{field: getattr(p[chunk], field) + delta})
        return p

    return tamper


@pytest.mark.parametrize(
    ("field", "chunk", "delta"),
    [
        ("abs_sum", 2, 1 << 100),  # the last (short) chunk: a fast check
        pytest.param("sum", 1, 1 << 90, marks=SLOW),
        pytest.param("inexact", 0, 1, marks=SLOW),
        pytest.param("max_exp", 2, 1, marks=SLOW),
    ],
)
def test_wrong_partial_loses_the_chunk_check(dep, runs, field: str, chunk: int, delta: int) -> None:
    """A trainer whose wrong element is propped up by a wrong partial (its sum, its |terms| sum
    for the bound, its inexact count, its scale) loses when the challenger disputes that chunk."""
    cheat = _cheat_run(runs, "mm", 2)
    gid = _game(dep, cheat)
    trainer = H.ChunkTrainer(dep, cheat, tamper=_off(field, chunk, delta))
    res = H.play(dep, gid, trainer, H.ChunkChallenger(dep, runs["honest"]))
    assert (res.status, res.ruling) == (H.GameStatus.CHALLENGER_WON, H.Ruling.ADJUDICATED), res
    assert res.phases[-1] == H.Phase.CHUNK_CHECK
    # A raised scale (max_exp above every chunk's) puts every chunk at the wrong scale: chunk 0 differs first.
    raised = field == "max_exp" and X.partials_scale(H.posted_partials(dep, gid)) > chunk_scale(runs, 2)
    assert dep.view(gid)["chunk"] == (0 if raised else chunk)


def chunk_scale(runs: dict, index: int) -> int:
    """The honest scale of element ``index`` of ``mm``."""
    run = runs["honest"]
    j = run.graph.index["mm"]
    ins = [run.steps[1].outputs[i] for i in run.graph.ops[j].inputs]
    return X.partials_scale(X.element_partials(run.graph.descriptors[j], ins, index))


def _to_partials(dep: H.Deployment, runs: dict, trainer: H.Trainer, j: int, chunk: int | None = 0) -> int:
    gid = _game(dep, runs["honest"])
    ch = H.FalseChunkChallenger(dep, op=j, element=0, chunk=chunk)
    res = H.play(dep, gid, trainer, ch, until=lambda v: v["phase"] == H.Phase.PARTIALS)
    assert res.status == H.GameStatus.IN_PROGRESS, res
    return gid


def test_timeouts_at_the_chunk_level(dep, runs) -> None:
    run = runs["honest"]
    j = run.graph.index["mm"]
    snap = dep.snapshot()
    # The challenger does not answer the partials: the trainer wins on the challenger's clock.
    gid = _to_partials(dep, runs, H.ChunkTrainer(dep, run), j)
    v = dep.view(gid)
    assert v["toMove"] == H.Party.CHALLENGER
    with H.reverts("ClockNotExpired"):
        dep.tx(dep.game.functions.claimTimeout(gid), dep.trainer)
    at_partials = dep.snapshot()
    dep.at(v["deadline"])  # the deadline second is still the challenger's
    dep.tx(dep.game.functions.acceptPartials(gid), dep.challenger)
    assert dep.view(gid)["phase"] == H.Phase.PARTIALS_RULE
    dep.revert(at_partials)
    dep.at(v["deadline"] + 1)
    with H.reverts("ClockExpired"):
        dep.dry(dep.game.functions.acceptPartials(gid), dep.challenger)
    dep.tx(dep.game.functions.claimTimeout(gid), dep.trainer)
    assert dep.view(gid)["status"] == H.GameStatus.TRAINER_WON
    # The trainer does not get the chunk ruled (nor does anyone): the challenger wins on time.
    dep.revert(snap)
    trainer = H.ChunkTrainer(dep, run, settles=False)
    gid = _to_partials(dep, runs, trainer, j)
    res = H.play(dep, gid, trainer, H.FalseChunkChallenger(dep, op=j, chunk=1))
    assert (res.status, res.ruling) == (H.GameStatus.CHALLENGER_WON, H.Ruling.TIMEOUT), res
    assert res.phases[-1] == H.Phase.CHUNK_CHECK
    # A trainer that cannot post partials (or calls oneStep instead) loses on time too.
    dep.revert(snap)
    gid = _game(dep, run)
    ch = H.FalseChunkChallenger(dep, op=j)
    res = H.play(dep, gid, H.Trainer(dep, run), ch)
    assert (res.status, res.ruling) == (H.GameStatus.CHALLENGER_WON, H.Ruling.TIMEOUT), res
    assert res.phases[-1] == H.Phase.ONE_STEP


def test_chunk_level_moves_are_checked(dep, runs) -> None:
    run = runs["honest"]
    j = run.graph.index["mm"]
    trainer = H.ChunkTrainer(dep, run)
    gid = _game(dep, run)
    ch = H.FalseChunkChallenger(dep, op=j)
    H.play(dep, gid, trainer, ch, until=lambda v: v["phase"] == H.Phase.ONE_STEP)
    g = dep.game.functions
    v = dep.view(gid)
    desc, roots = trainer.op_inputs(1, j)
    good = [p.as_tuple() for p in trainer.partials(v)]
    with H.reverts("ChunkedElement", K + 1, X.MAX_DIRECT_TERMS):
        dep.dry(g.oneStep(gid, desc, roots, b""), dep.trainer)
    with H.reverts("ChunkCount", 2, 3):
        dep.dry(g.postPartials(gid, desc, good[:2]), dep.trainer)
    huge = list(good)
    huge[0] = (good[0][0], 1 << 200, *good[0][2:])
    with H.reverts("PartialOutOfBounds", 0):
        dep.dry(g.postPartials(gid, desc, huge), dep.trainer)
    for tail in ([good[0][3] + 1, 0, 0, 0], [-1, 0, 0, 0], [0, 2048 << 238, 0, 0], [0, 0, 0, -(2048 << 238)]):
        with H.reverts("PartialOutOfBounds", 0):  # the tail's count and limbs are bounded too
            dep.dry(g.postPartials(gid, desc, [(*good[0][:4], tail), *good[1:]]), dep.trainer)
    with H.reverts("NotYourTurn"):
        dep.dry(g.postPartials(gid, desc, good), dep.challenger)
    dep.tx(g.postPartials(gid, desc, good), dep.trainer)
    assert dep.view(gid)["phase"] == H.Phase.PARTIALS
    other = list(good)
    other[1] = (good[1][0], good[1][1] + 1, *good[1][2:])
    with H.reverts("OpeningMismatch"):
        dep.dry(g.disputeChunk(gid, other, 1), dep.challenger)
    with H.reverts("ChunkOutOfRange", 3, 3):
        dep.dry(g.disputeChunk(gid, good, 3), dep.challenger)
    with H.reverts("WrongPhase"):
        dep.dry(g.settlePartials(gid, desc, roots, good, b""), dep.trainer)
    dep.tx(g.disputeChunk(gid, good, 2), dep.challenger)
    # A proof of another chunk's rows reverts (the game stays as it was); the right one rules.
    from protocol.proofs import build_chunk_proof

    ins = [run.steps[1].outputs[i] for i in run.graph.ops[j].inputs]
    with H.reverts("OpeningLength"):
        dep.dry(g.settlePartials(gid, desc, roots, good, build_chunk_proof(desc, ins, 0, 1)), dep.challenger)
    with H.reverts("OpeningMismatch"):
        dep.dry(g.settlePartials(gid, desc, roots, other, build_chunk_proof(desc, ins, 0, 2)), dep.challenger)
    with H.reverts("Unauthorized"):
        dep.dry(g.settlePartials(gid, desc, roots, good, build_chunk_proof(desc, ins, 0, 2)), dep.anyone)
    dep.tx(g.settlePartials(gid, desc, roots, good, build_chunk_proof(desc, ins, 0, 2)), dep.challenger)
    assert dep.view(gid)["status"] == H.GameStatus.TRAINER_WON


def test_short_reductions_stay_one_step(dep) -> None:
    """The 130-term SUM of the base graph: postPartials is refused, oneStep rules."""
    run = H.simulate(H.JobConfig(n_steps=1, interval_length=1))
    gid = _game(dep, run)
    j = run.graph.index["sum"]
    trainer = H.ChunkTrainer(dep, run)
    H.play(dep, gid, trainer, H.FalseChallenger(dep, op=j), until=lambda v: v["phase"] == H.Phase.ONE_STEP)
    desc, _ = trainer.op_inputs(1, j)
    with H.reverts("NotChunked", 130, X.MAX_DIRECT_TERMS):
        dep.dry(dep.game.functions.postPartials(gid, desc, [X.Partial(0, 0, 0, 0).as_tuple()]), dep.trainer)


# ---------------------------------------------------------------------------------------------
# Gas: the longest reductions the accumulator allows


@pytest.mark.slow
@pytest.mark.parametrize("op", ["mm", "sm"])
def test_65536_term_reduction_fits_every_transaction(op: str) -> None:
    gas = H.chunk_level_gas(X.MAX_TERMS, op=op)
    log.info("chunk level, %s of %d terms: %s", op, X.MAX_TERMS, gas)
    print(f"chunk level, {op} of {X.MAX_TERMS} terms:", gas)
    assert 0 < gas["max"] < TX_CAP, gas
    assert gas["settlePartials (chunk check)"] > gas["settlePartials (rule)"]


# ---------------------------------------------------------------------------------------------
# The agents (protocol/game.py strategies) play the chunk level on their own


@pytest.mark.slow
def test_agents_play_the_chunk_level_on_a_long_weight_gradient() -> None:
    """An MLP whose weight gradients sum over 4,200 batch rows; the trainer moves one element of
    such a MATMUL up by an ulp. The auditor's game descends to it, the trainer posts the
    (honest) partials, the auditor accepts them and the element is ruled from them."""
    import tempfile
    from dataclasses import dataclass

    import torch

    from protocol.auditor import AuditorAgent
    from protocol.chain import Chain
    from protocol.demo import create_job
    from protocol.deploy import deploy
    from protocol.game import PHASE_PARTIALS_RULE, STATUS_CHALLENGER_WON, STATUS_IN_PROGRESS
    from protocol.jobs import JobContext, Terms
    from protocol.store import ArtifactStore
    from protocol.trainer import TrainerAgent
    from vtrain.training.loop import Cheat
    from vtrain.training.spec import TrainSpec

    @dataclass
    class NudgeLongMatmul(Cheat):
        step: int
        fired: bool = False

        def op_hook(self, step: int):
            if step != self.step:
                return None
            done: list[int] = []  # per run: the trainer regenerates its trace with the same cheat

            def hook(op, ins, out: torch.Tensor, log) -> torch.Tensor:
                if done or op.kind != OpKind.MATMUL or ins[0].shape[-1] <= X.MAX_DIRECT_TERMS:
                    return out
                done.append(op.id)
                self.fired = True
                flat = out.reshape(-1).clone()
                flat[0] = torch.nextafter(flat[0], torch.tensor(np.inf, dtype=torch.float32))
                return flat.reshape(out.shape)

            return hook

    terms = Terms()
    chain = Chain.connect(None)
    a = chain.accounts()
    proto = deploy(chain, a[0])
    ctx = JobContext.of(TrainSpec(model="mlp", batch_size=4200, steps=1, interval=1))
    with tempfile.TemporaryDirectory() as d:
        store = ArtifactStore(d)
        job = create_job(proto, a[1], a[2], ctx, terms)
        cheat = NudgeLongMatmul(1)
        trainer = TrainerAgent(proto, a[2], ctx, store, job, cheat=cheat)
        trainer.accept(terms)
        assert trainer.run_interval() == 0 and cheat.fired
        auditor = AuditorAgent(proto, a[3], ctx, store, job)
        bad = auditor.audit()
        assert bad == 0
        gid = auditor.challenge(bad, terms)
        phases = []
        for _ in range(120):
            sent = trainer.play() + auditor.play()
            v = auditor.player.view(gid)
            phases.append(v.phase)
            if v.status != STATUS_IN_PROGRESS or not sent:
                break
        assert v.status == STATUS_CHALLENGER_WON, v
        assert PHASE_PARTIALS_RULE in phases  # the trainer posted, the auditor accepted in the same round
        ev = proto.game.events
        assert ev.PartialsPosted.get_logs(from_block=0, argument_filters={"game": gid})
        assert ev.PartialsAccepted.get_logs(from_block=0, argument_filters={"game": gid})
        op = ctx.job.graph.ops[v.op]
        assert op.kind == OpKind.MATMUL and v.index == 0
        max_gas = max(trainer.player.stats.max_gas.get(gid, 0), auditor.player.stats.max_gas.get(gid, 0))
        log.info("agents' game through the chunk level: largest tx %d gas", max_gas)
        assert max_gas < TX_CAP
