// SPDX-License-Identifier: MIT
pragma solidity 0.8.28;

/// @title ContractActor
/// @notice Base of the test actors that are contracts: they play any role (client, trainer,
///         challenger) by forwarding calls through `exec`.
abstract contract ContractActor {
    /// @notice Calls `target` with `data` and the value sent, bubbling up a revert.
    /// @param target Contract to call.
    /// @param data Calldata.
    /// @return result The call's return data.
    function exec(address target, bytes calldata data) external payable returns (bytes memory result) {
        bool ok;
        (ok, result) = target.call{value: msg.value}(data);
        if (!ok) {
            assembly {
                revert(add(result, 32), mload(result))
            }
        }
    }
}
