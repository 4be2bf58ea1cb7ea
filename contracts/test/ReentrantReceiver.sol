// SPDX-License-Identifier: MIT
pragma solidity 0.8.28;

import {IJobRegistry} from "contracts/interfaces/IJobRegistry.sol";
import {ContractActor} from "contracts/test/ContractActor.sol";

/// @title ReentrantReceiver
/// @notice Test actor that plays any role (client, trainer, challenger) through `exec` and, when
///         paid, tries to re-enter `JobRegistry.withdraw` once, recording what happened.
contract ReentrantReceiver is ContractActor {
    /// @notice Thrown by `receive` while `rejectPayments` is set.
    error PaymentRejected();

    /// @notice The registry to re-enter.
    IJobRegistry public immutable registry;
    /// @notice Wei received so far.
    uint256 public received;
    /// @notice Number of re-entry attempts made (at most one per payment).
    uint256 public reentryAttempts;
    /// @notice True if a re-entrant withdraw ever succeeded (must stay false).
    bool public reentrySucceeded;
    /// @notice Revert data of the last failed re-entry.
    bytes public lastReentryError;
    /// @notice When true, `receive` reverts (a receiver that refuses payments).
    bool public rejectPayments;

    constructor(IJobRegistry registry_) {
        registry = registry_;
    }

    /// @notice Makes this contract refuse (true) or accept (false) payments.
    function setRejectPayments(bool reject) external {
        rejectPayments = reject;
    }

    /// @notice Records the payment and tries to re-enter `registry.withdraw()` once.
    receive() external payable {
        if (rejectPayments) revert PaymentRejected();
        received += msg.value;
        reentryAttempts += 1;
        try registry.withdraw() {
            reentrySucceeded = true;
        } catch (bytes memory err) {
            lastReentryError = err;
        }
    }
}
