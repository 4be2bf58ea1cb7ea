"""Training steps an honest trainer computes to defend concurrent false games (one bond each),
each disputing a different step of one MLP interval of K steps (tests/test_game_load.py's
scenario), and the wall time of the trainer's passes.

    PYTHONPATH=$PWD .venv/bin/python scripts/bench_game_load.py [--games 6] [--interval 8]

Run it on an older trainer (``git show <rev>:protocol/trainer.py > protocol/trainer.py``) for
the before figure: the step count comes from a spy on ``protocol.trainer.train_steps``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--games", type=int, default=6)
    ap.add_argument("--interval", type=int, default=8)
    args = ap.parse_args()

    import pytest

    import tests.test_game_load as T
    from protocol.chain import Chain
    from protocol.demo import create_job
    from protocol.deploy import deploy
    from protocol.jobs import JobContext
    from protocol.store import ArtifactStore
    from protocol.trainer import TrainerAgent
    from vtrain.training.spec import TrainSpec

    T.GAMES, T.K = args.games, args.interval
    chain = Chain.connect(None)
    a = chain.accounts()
    if args.games > len(a) - 3:
        raise SystemExit(f"--games: expected at most {len(a) - 3} (one account each), got {args.games}")
    proto = deploy(chain, a[0])
    ctx = JobContext.of(TrainSpec(model="mlp", batch_size=16, steps=args.interval, interval=args.interval))
    job = create_job(proto, a[1], a[2], ctx, T.TERMS)
    with tempfile.TemporaryDirectory() as d, pytest.MonkeyPatch.context() as mp:
        store = ArtifactStore(d)
        trainer = TrainerAgent(proto, a[2], ctx, store, job)
        trainer.accept(T.TERMS)
        trainer.run_interval()
        spy = T.StepCounter(mp)
        griefers = T._griefers(proto, ctx, job, store, a)
        spent = 0.0
        play = trainer.play

        def timed() -> int:
            nonlocal spent
            t0 = time.perf_counter()
            try:
                return play()
            finally:
                spent += time.perf_counter() - t0

        trainer.play = timed  # type: ignore[method-assign]
        T._play(trainer, griefers)
        won = sum(s == T.STATUS_TRAINER_WON for s in T._won(griefers))
    print(f"games {args.games}  K {args.interval}  trainer won {won}/{args.games}  "
          f"training steps computed {spy.steps}  trainer play() time {spent:.2f} s")


if __name__ == "__main__":
    main()
