"""Test helper: decode a contract's custom-error revert, whichever way the provider reports it
(web3's ContractCustomError on JSON-RPC nodes, eth-tester's TransactionFailed in process)."""

from __future__ import annotations

import ast
from collections.abc import Callable
from typing import Any

import pytest
from eth_abi import decode
from eth_utils import function_signature_to_4byte_selector


def _type(item: dict) -> str:
    if not item["type"].startswith("tuple"):
        return item["type"]
    inner = ",".join(_type(c) for c in item["components"])
    return f"({inner}){item['type'][5:]}"


def error_table(*abis: list[dict]) -> dict[bytes, tuple[str, list[str]]]:
    """Selector -> (name, argument types) for every custom error in the ABIs."""
    table = {}
    for abi in abis:
        for item in abi:
            if item.get("type") == "error":
                types = [_type(i) for i in item["inputs"]]
                table[function_signature_to_4byte_selector(f"{item['name']}({','.join(types)})")] = (
                    item["name"],
                    types,
                )
    return table


def revert_data(exc: BaseException) -> bytes:
    """The raw revert data carried by a failed call."""
    data = getattr(exc, "data", None)
    if isinstance(data, dict):
        data = data.get("data")
    if isinstance(data, str) and data.startswith("0x"):
        return bytes.fromhex(data[2:])
    msg = str(exc.args[0]) if exc.args else str(exc)
    marker = "execution reverted: "
    if marker in msg:
        try:
            value = ast.literal_eval(msg.split(marker, 1)[1])
        except (ValueError, SyntaxError):
            value = None
        if isinstance(value, bytes):
            return value
    raise AssertionError(f"no revert data in {exc!r}")


def expect_revert(call: Callable[[], Any], table: dict, name: str) -> tuple:
    """Run ``call``, assert it reverts with custom error ``name``; return the error's arguments."""
    with pytest.raises(Exception) as info:  # noqa: B017 - providers raise different types
        call()
    data = revert_data(info.value)
    got = table.get(data[:4])
    assert got is not None, f"expected {name}, got unknown revert data {data.hex()}"
    assert got[0] == name, f"expected {name}, got {got[0]}"
    return tuple(decode(got[1], data[4:]))
