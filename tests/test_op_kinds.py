"""The op kind codes are one list: contracts/lib/OpKinds.sol equals vtrain's OpKind, and every kind
is either ruled by the deployed Adjudicator (and by its Python mirror vtrain.numerics.exact) or a
bind kind that the game rules at openOp (INPUT, CONST)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from revert_helpers import revert_data
from test_adjudicator import adjudicator_errors, deploy_adjudicator

from protocol.proofs import encode_proof, log_opening
from vtrain.commit.roots import encode_op_descriptor, op_log_root
from vtrain.graph.step_graph import OpKind
from vtrain.numerics import exact

ROOT = Path(__file__).resolve().parent.parent
BIND_KINDS = frozenset({OpKind.INPUT, OpKind.CONST})
"""Ruled by DisputeGame.openOp against the state and constant roots, never by the Adjudicator."""


def solidity_op_kinds() -> dict[str, int]:
    text = (ROOT / "contracts" / "lib" / "OpKinds.sol").read_text(encoding="utf-8")
    return {m[1]: int(m[2]) for m in re.finditer(r"uint8 internal constant (\w+) = (\d+);", text)}


def test_solidity_and_python_op_kinds_are_the_same_list() -> None:
    assert solidity_op_kinds() == {k.name: int(k) for k in OpKind}


@pytest.fixture(scope="module")
def adj():
    return deploy_adjudicator()


def _ruling_error(adj, errors, kind: int) -> str | None:
    """The custom error the Adjudicator reverts with for a bare descriptor of ``kind`` (no
    inputs, shape [1]), or None when it rules."""
    desc = encode_op_descriptor(kind, [], [1], [], [])
    claim = (desc, [], 0, 0, op_log_root([]), 1, b"\0" * 32, b"\0" * 32, 0)
    try:
        adj.functions.adjudicate(claim, encode_proof([], log_opening([], 0))).call({"gas": 16_000_000})
    except Exception as e:  # noqa: BLE001 - providers raise different types
        return errors[revert_data(e)[:4]][0]
    return None


def test_every_op_kind_is_ruled_by_the_adjudicator_or_is_a_bind_kind(adj) -> None:
    errors = adjudicator_errors(adj)
    for kind in OpKind:
        got = _ruling_error(adj, errors, int(kind))
        if kind in BIND_KINDS:
            assert got == "UnsupportedOp", kind
        else:  # ruled: a bare descriptor is refused as malformed (or ruled), never as unsupported
            assert got != "UnsupportedOp", kind
    assert _ruling_error(adj, errors, 99) == "UnsupportedOp"


def test_every_op_kind_is_ruled_by_the_python_mirror_or_is_a_bind_kind() -> None:
    ctx = exact.DataContext(np.zeros((1, 1), np.float32), b"\0" * 32, 1)
    for kind in OpKind:
        desc = exact.OpDesc(int(kind), (), (1,), (), ())
        if kind in BIND_KINDS:
            with pytest.raises(exact.UnsupportedOp):
                exact.judge_element(desc, (), 0, 0, None, ctx)
            continue
        try:
            exact.judge_element(desc, (), 0, 0, None, ctx)
        except exact.MalformedOp:
            pass
