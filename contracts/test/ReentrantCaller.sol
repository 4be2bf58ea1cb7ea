// SPDX-License-Identifier: MIT
pragma solidity 0.8.28;

import {ContractActor} from "contracts/test/ContractActor.sol";

/// @title ReentrantCaller
/// @notice Test actor that plays any role (client, trainer, challenger) through `exec` and, when
///         paid, re-enters any contract with a configured call (withdraw, finalize, claimTimeout,
///         challenge, ...) once per payment, recording what happened.
contract ReentrantCaller is ContractActor {
    /// @notice Contract re-entered on payment (zero: no re-entry).
    address public reentryTarget;
    /// @notice Calldata of the re-entry.
    bytes public reentryData;
    /// @notice Wei received so far.
    uint256 public received;
    /// @notice Number of re-entry attempts made.
    uint256 public reentryAttempts;
    /// @notice Number of re-entries that succeeded.
    uint256 public reentrySuccesses;
    /// @notice Revert data of the last failed re-entry.
    bytes public lastReentryError;

    /// @notice Emitted after each re-entry attempt.
    event Reentered(address target, bool ok, bytes result);

    /// @notice Sets the call made when this contract is paid.
    /// @param target Contract to call (zero disables re-entry).
    /// @param data Calldata to send it.
    function setReentry(address target, bytes calldata data) external {
        reentryTarget = target;
        reentryData = data;
    }

    /// @notice Takes a payout and, when armed, re-enters the target with the stored call.
    receive() external payable {
        received += msg.value;
        address target = reentryTarget;
        if (target == address(0)) return;
        reentryAttempts += 1;
        (bool ok, bytes memory result) = target.call(reentryData);
        if (ok) {
            reentrySuccesses += 1;
        } else {
            lastReentryError = result;
        }
        emit Reentered(target, ok, result);
    }
}
