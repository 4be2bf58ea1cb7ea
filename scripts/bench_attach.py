"""Cost of attaching to a deployment: ``Protocol.attach`` (every address's code compared with this
build's, bindings read from the verified immutables) against the check it replaced (code exists at
the four addresses, five binding getters called), back to back on one chain.

    PYTHONPATH=$PWD .venv/bin/python scripts/bench_attach.py [--rpc URL] [--repeat 20]

Prints the median milliseconds of one attach and the requests it made (chain id lookups aside).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import Counter
from collections.abc import Callable

from protocol.chain import Chain, Deployment
from protocol.deploy import Protocol, deploy


def codes_exist_and_getters(chain: Chain, d: Deployment) -> None:
    """The check before: code exists at each address, the bindings read by calling the getters."""
    contracts = {}
    for name, address in (("JobRegistry", d.registry), ("DisputeGame", d.game), ("Adjudicator", d.adjudicator),
                          ("DataAvailability", d.availability)):
        assert len(chain._retry("eth_getCode", lambda a=address: chain.w3.eth.get_code(a))) > 0
        contracts[name] = chain.w3.eth.contract(address=address, abi=_abi(name))
    r, g, a = contracts["JobRegistry"], contracts["DisputeGame"], contracts["DataAvailability"]
    assert chain.call(r.functions.disputeGame()) == d.game
    assert chain.call(g.functions.registry()) == d.registry
    assert chain.call(g.functions.adjudicator()) == d.adjudicator
    assert chain.call(r.functions.availability()) == d.availability
    assert chain.call(a.functions.registry()) == d.registry


def _abi(name: str) -> list:
    from protocol.build import load_artifact

    return load_artifact(name).abi


def measure(chain: Chain, fn: Callable[[], object], repeat: int) -> tuple[float, Counter]:
    """Median milliseconds of ``fn`` and the requests of its last run (counted at ``Chain._retry``,
    which every request of the chain client goes through)."""
    calls: Counter = Counter()
    inner = chain._retry

    def counting(what, f, before_retry=None):  # type: ignore[no-untyped-def]
        calls[what] += 1
        return inner(what, f, before_retry)

    times = []
    for k in range(repeat):
        if k == repeat - 1:
            chain._retry = counting  # type: ignore[method-assign]
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    del chain._retry  # the method again
    return statistics.median(times) * 1e3, calls


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rpc", default=None, help="JSON-RPC URL (default: the embedded eth-tester chain)")
    ap.add_argument("--repeat", type=int, default=20)
    args = ap.parse_args()
    chain = Chain.connect(args.rpc)
    d = deploy(chain, chain.accounts()[0]).deployment
    Protocol.attach(chain, d)  # warm: the build's expected codes are made once per process
    for label, fn in (("before: code exists + 5 getters", lambda: codes_exist_and_getters(chain, d)),
                      ("after: Protocol.attach (6 codes verified)", lambda: Protocol.attach(chain, d))):
        ms, calls = measure(chain, fn, args.repeat)
        shown = ", ".join(f"{m} {n}" for m, n in sorted(calls.items()))
        print(f"{chain.name}: {label}: {ms:.1f} ms median of {args.repeat}; requests: {sum(calls.values())} ({shown})")


if __name__ == "__main__":
    main()
