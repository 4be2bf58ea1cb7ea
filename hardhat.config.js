// Hardhat 2 (CommonJS). Offline: compiles with npm `solc` (solcjs, wasm) instead of downloading a
// compiler. Keep SOLIDITY_SETTINGS identical to protocol/build.py (tests/test_build.py compares
// the bytecode of both pipelines).
const { subtask } = require("hardhat/config");
const { TASK_COMPILE_SOLIDITY_GET_SOLC_BUILD } = require("hardhat/builtin-tasks/task-names");

const SOLC_VERSION = "0.8.28";
const SOLIDITY_SETTINGS = {
  optimizer: { enabled: true, runs: 200 },
  viaIR: true,
  evmVersion: "cancun",
};

subtask(TASK_COMPILE_SOLIDITY_GET_SOLC_BUILD, async (args, hre, runSuper) => {
  if (args.solcVersion !== SOLC_VERSION) return runSuper();
  const solc = require("solc");
  if (solc.version().split("+")[0] !== SOLC_VERSION) {
    throw new Error(`npm solc is ${solc.version()}, expected ${SOLC_VERSION} (run npm ci)`);
  }
  return {
    compilerPath: require.resolve("solc/soljson.js"),
    isSolcJs: true,
    version: SOLC_VERSION,
    longVersion: solc.version(),
  };
});

/** @type import('hardhat/config').HardhatUserConfig */
module.exports = {
  solidity: { version: SOLC_VERSION, settings: SOLIDITY_SETTINGS },
  paths: { sources: "./contracts" },
};
