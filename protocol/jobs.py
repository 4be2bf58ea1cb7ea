"""A job as both agents see it: the spec made concrete plus every commitment the chain holds."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

from vtrain.commit.merkle import MerkleTree
from vtrain.commit.roots import dataset_root, dataset_tree, spec_hash
from vtrain.commit.trace import GraphCommitment
from vtrain.training.loop import initial_commitment
from vtrain.training.spec import Job, TrainSpec, build_job


@dataclass(frozen=True)
class Terms:
    """The economic terms of a job (wei and seconds)."""

    payment: int = 10**18
    trainer_stake: int = 2 * 10**18
    challenger_bond: int = 5 * 10**17
    challenge_window: int = 3600
    clock: int = 1800
    posting_period: int = 86_400
    """Seconds the trainer has per interval after accepting (interval i is due by
    acceptedAt + (i + 1) * posting_period); once one is overdue the client may reclaim the job."""
    accept_period: int = 86_400
    """Seconds from createJob during which the offer is firm (1..MAX_ACCEPT_PERIOD): the trainer
    may accept until createdAt + accept_period (it trains the whole job first), the client may
    cancel only after."""


#: Longest acceptPeriod the registry takes (contracts/lib/GameTypes.sol MAX_ACCEPT_PERIOD: 365 days).
MAX_ACCEPT_PERIOD = 365 * 86_400


@dataclass
class JobContext:
    """Spec, dataset, graph and the commitments derived from them (computed once).

    The job is built on first use of :attr:`job`, never before: building a file model's job runs
    its factory code and loads its checkpoint. An agent calls :meth:`check_onchain` first, which
    checks the spec (and so the pinned bytes) against the chain's ``specHash`` before building;
    :meth:`for_job` does both for a library user."""

    spec: TrainSpec
    built: Job | None = field(default=None, repr=False)
    """The job, once built (by :attr:`job`)."""

    @staticmethod
    def of(spec: TrainSpec) -> JobContext:
        """The context of ``spec``; builds nothing yet (see :attr:`job`)."""
        return JobContext(spec)

    @staticmethod
    def for_job(spec: TrainSpec, params: tuple) -> JobContext:
        """The context of ``spec`` for the on-chain job whose ``jobParams`` are ``params``, checked
        against them (:meth:`check_onchain`: the spec before any model code runs, then the rest)."""
        ctx = JobContext(spec)
        ctx.check_onchain(params)
        return ctx

    @property
    def job(self) -> Job:
        """Dataset, graph and initial state of the spec, built on first use (a file model's code runs
        here: for a counterparty's job, only after :meth:`check_onchain`'s spec check)."""
        if self.built is None:
            self.built = build_job(self.spec)
        return self.built

    @cached_property
    def graph(self) -> GraphCommitment:
        return GraphCommitment.of(self.job.graph)

    @cached_property
    def data_tree(self) -> MerkleTree:
        return dataset_tree(self.job.dataset.samples)

    @cached_property
    def data_root(self) -> bytes:
        return dataset_root(self.job.dataset.samples)

    @cached_property
    def initial(self) -> tuple[list[bytes], bytes]:
        return initial_commitment(self.job)

    @cached_property
    def spec_hash(self) -> bytes:
        return spec_hash(self.spec.commitment())

    @property
    def n_intervals(self) -> int:
        return -(-self.spec.steps // self.spec.interval)

    def interval_span(self, i: int) -> tuple[int, int]:
        """(first step, number of steps) of interval ``i``."""
        first = i * self.spec.interval + 1
        return first, min(self.spec.interval, self.spec.steps - first + 1)

    def params(self, trainer: str, terms: Terms) -> tuple:
        """The on-chain JobParams struct, in field order."""
        return (
            trainer,
            self.spec_hash,
            self.data_root,
            self.spec.data_seed,
            self.job.dataset.n,
            self.graph.root,
            self.job.graph.n_ops,
            len(self.job.graph.slots),
            self.initial[1],
            self.spec.steps,
            self.spec.interval,
            terms.trainer_stake,
            terms.challenger_bond,
            terms.challenge_window,
            terms.clock,
            terms.posting_period,
            terms.accept_period,
        )

    def check_onchain(self, params: tuple) -> None:
        """Raise ChainError when the chain's job does not commit to this spec (wrong spec file or job
        id, a served model source or checkpoint other than the committed one). The one check every
        agent and the CLI run: first :func:`check_spec_hash` (no model is built, no served byte is
        read), then the job is built (the pinned files are hashed before they are executed or
        loaded) and every other committed parameter compared with it."""
        from protocol.chain import ChainError

        check_spec_hash(self.spec, params)
        mine = self.params(params[0], Terms(0, *params[11:17]))
        names = [
            "trainer",
            "specHash",
            "dataRoot",
            "dataSeed",
            "nSamples",
            "graphRoot",
            "nOps",
            "nSlots",
            "initialStateRoot",
            "nSteps",
            "intervalLength",
        ]
        for name, a, b in zip(names, mine, params, strict=False):
            if a == b:
                continue
            if name == "graphRoot":
                raise ChainError(f"the step graph rebuilt from {self._model_source()} has graph root {_show(a)}, "
                                 f"the job commits to graph root {_show(b)}: refusing to train or replay it")
            if name == "specHash":
                raise ChainError(f"job commits to a different specHash: chain has {_show(b)}, this spec gives "
                                 f"{_show(a)} (the spec's settings{self._pins()} differ from the job's)")
            if name == "initialStateRoot" and self.spec.model not in ("mlp", "gpt") and self.spec.checkpoint is None:
                from vtrain.frontend.job import RANDOM_INIT_CAUSE

                raise ChainError(
                    f"job commits to a different initialStateRoot: chain has {_show(b)}, this spec gives {_show(a)}. "
                    f"Likely cause: the spec pins no initial weights (no checkpoint), so {RANDOM_INIT_CAUSE}: the "
                    "job was probably created on a machine whose CPU has other vector instructions than this one. "
                    "Fix: create the job from a spec that pins them (`vtrain train --out RUN --spec SPEC --pin-only` "
                    "writes RUN/model/initial.safetensors and pins it in RUN/spec.json); refusing to train or replay "
                    "this one")
            raise ChainError(f"job commits to a different {name}: chain has {_show(b)}, this spec gives {_show(a)}")

    def _model_source(self) -> str:
        if self.spec.model in ("mlp", "gpt"):
            return f"the built-in {self.spec.model!r} model"
        pin = f" (sha256 {self.spec.model_sha256})" if self.spec.model_sha256 else " (not pinned)"
        return f"the model source {self.spec.model.rpartition(':')[0]!r}{pin}"

    def _pins(self) -> str:
        if self.spec.model in ("mlp", "gpt"):
            return ""
        return ", model_args, model source sha256 or checkpoint sha256"


def check_spec_hash(spec: TrainSpec, params: tuple) -> None:
    """Raise ChainError unless ``spec`` is the one the job's ``specHash`` commits to. Cheap: no model
    is built and no file is read, so it runs before a file model's code (part of
    :meth:`JobContext.check_onchain`). A file model must be pinned (``model_sha256``, and
    ``checkpoint_sha256`` with a checkpoint): the spec hash then commits to the bytes, which
    :func:`vtrain.frontend.job.pinned_bytes` checks before executing or loading them; an unpinned one
    commits only to a file name, so its bytes could be anything and are never run for a job."""
    from protocol.chain import ChainError

    mine = spec_hash(spec.commitment())
    if mine != bytes(params[1]):
        extra = ""
        if spec.model not in ("mlp", "gpt"):
            pins = f"model source sha256 {spec.model_sha256}" if spec.model_sha256 else "an unpinned model source"
            if spec.checkpoint is not None:
                pins += f", checkpoint sha256 {spec.checkpoint_sha256}" if spec.checkpoint_sha256 else \
                    ", an unpinned checkpoint"
            extra = f" (this spec has {pins}; its model_args, model source or checkpoint differ from the job's)"
        raise ChainError(f"job commits to a different specHash: chain has {_show(params[1])}, this spec gives "
                         f"{_show(mine)}{extra}; nothing of its model was run")
    if spec.model not in ("mlp", "gpt") and not spec.pinned:
        what = "model source" if spec.model_sha256 is None else "checkpoint"
        raise ChainError(f"job commits to the {what} of {spec.model!r} by file name only (the spec has no "
                         f"{'model' if what == 'model source' else 'checkpoint'}_sha256): its bytes cannot be "
                         "checked against the chain, refusing to run them (use a pinned spec: a run folder's "
                         "spec.json, or vtrain.frontend.job.pin_files)")


def _show(x) -> str:
    return "0x" + bytes(x).hex() if isinstance(x, (bytes, bytearray)) else str(x)
