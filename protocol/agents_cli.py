"""The agents as commands, one OS process each, against any JSON-RPC node.

``vtrain client create-job``  the client: posts a job for a spec and pays for it.
``vtrain trainer``            trains the whole job into its store first (``--pretrain``, the
                              default: a job whose training reaches a value with no finite value is
                              refused, never staked on), accepts, posts interval by interval,
                              publishes its artifacts (and serves them read-only over HTTP once it
                              has accepted), defends every game, finalizes once the challenge window
                              has passed, withdraws, exits.
``vtrain auditor``            replays every posted interval from the trainer's published artifacts
                              (over HTTP only), challenges the first one that differs (or, as a
                              false challenger, interval 0 once), plays its game, withdraws, exits.

Both agents read their progress back from the chain (next interval, games, whose move it is) and
from disk: the trainer from its artifact store (damaged artifacts are regenerated at start-up and
checked against the posted roots), the auditor from ``--state-dir`` (its replayed records and
states; without it, it replays from the initial state again). Either can be killed and started
again with the same arguments at any point. Neither sends a move twice in one game state: a move
the contract reverted (a cheater cannot open what it committed to) waits for the game to change,
or for its clock to run out; a transaction whose reply was lost is found by its nonce, not resent.

The node: each request is retried with exponential backoff and jitter (``--rpc-retries``, at
most 5 s between tries, ``--rpc-deadline`` in all); a node that is not there at start-up is an
error within 10 s; an outage mid-run is waited out until ``--timeout``. Artifacts read over HTTP
are verified; a corrupt one is reported (named, with its expected sha256) and never used.

Progress goes to stderr (rich); stdout carries one JSON line, the result, at the end. With
``--events`` stdout is a JSON-lines stream (``{"event": ...}``), the last line still the result;
an orchestrator (``protocol.multiproc``) reads it, in particular the ``idle`` events: an agent
reports ``{"event": "idle", "block": B}`` once it has seen the chain at block ``B`` or later and
has nothing to do. The agents never move the node's clock.

Before it takes part, each agent checks the job (``protocol.rulability``, ``protocol.policy``): an op
the chain cannot rule on, or terms shorter than it can safely answer within (``--move-seconds``,
``--interval-seconds``/``--replay-seconds``, ``--term-margin``; the trainer also ``--max-stake-ratio``
and ``--min-bond``) make it refuse: it says why, sends nothing, and exits with status 4. An agent
already in the job (a restart) carries on whatever the terms.

Exit status: 0 done, 1 error (a clear message), 3 ``--timeout`` reached (the result says so),
4 the agent refused the job (the result's ``refused`` lists why; a trainer also refuses a job whose
training it found to reach a step with no finite value, and one whose accept deadline leaves less
than ``--term-margin`` x its steps left x ``--step-seconds`` or passed while it pre-trained), 5 the
trainer accepted a job (with ``--no-pretrain``) whose training reaches a step with no finite
value: it can never be finished; the result names the step and op. The divergence is recorded
in the store: started again, the trainer says so at once (exit 5) instead of training again.

Run without the main CLI: ``python -m protocol.agents_cli trainer ...``.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

import click
from rich.console import Console

log = logging.getLogger(__name__)

EXIT_TIMEOUT = 3
EXIT_REFUSED = 4
EXIT_DIVERGED = 5
#: Seconds between the trainer's checks, while it pre-trains, that the job is still open.
PRETRAIN_STATUS_EVERY = 5.0
JOB_STATUS = ["none", "open", "active", "cancelled", "finalized", "fraudulent"]
_DONE = ("finalized", "fraudulent", "cancelled")
#: protocol.cheats.CHEATS' names (not imported here: that pulls in torch, and `--help` stays quick).
CHEAT_NAMES = (
    "abuse-log",
    "forge-explicit",
    "poison-sample",
    "shift-explicit",
    "skip-step",
    "tamper-attention",
    "tamper-softmax",
    "tamper-weight",
    "wrong-lr",
    "wrong-side",
)


# -- shared plumbing --------------------------------------------------------------------------------


class Wei(click.ParamType):
    """An amount of wei: ``1000``, ``1e18``, ``0.5eth``, ``2 ether``."""

    name = "wei"

    def convert(self, value: Any, param: Any, ctx: Any) -> int:
        if isinstance(value, int):
            return value
        s = str(value).strip().lower().replace("_", "")
        scale = Decimal(1)
        for unit in ("ether", "eth"):
            if s.endswith(unit):
                s, scale = s[: -len(unit)].strip(), Decimal(10**18)
                break
        try:
            d = Decimal(s) * scale
        except InvalidOperation:
            self.fail(f"{value!r} is not an amount of wei (e.g. 1000000, 1e18, 0.5eth)", param, ctx)
        if not d.is_finite() or d != d.to_integral_value() or d < 0:
            self.fail(f"{value!r} is not a whole, non-negative number of wei", param, ctx)
        return int(d)


WEI = Wei()


@dataclass
class Out:
    """Progress to stderr; JSON lines to stdout (events only with ``--events``)."""

    role: str
    job: int | None
    events: bool
    console: Console

    @staticmethod
    def make(role: str, job: int | None, events: bool) -> Out:
        return Out(role, job, events, Console(stderr=True, highlight=False))

    def say(self, msg: str) -> None:
        """One progress line; ``msg`` may hold rich markup. Text from someone else (a server's
        reason phrase, a served value in an error) must be escaped by the caller; should any reach
        here unescaped and not parse as markup, the line is printed as plain text (a MarkupError
        would stop the agent: an auditor that stops never challenges)."""
        from rich.errors import MarkupError

        who = f"{self.role}" + (f" job {self.job}" if self.job is not None else "")
        line = f"[dim]{time.strftime('%H:%M:%S')}[/] [bold]{who}[/]: {msg}"
        try:
            self.console.print(line)
        except MarkupError:
            self.console.print(f"{time.strftime('%H:%M:%S')} {who}: {msg}", markup=False)

    def event(self, name: str, **fields: Any) -> None:
        if self.events:
            self._line({"event": name, "role": self.role, **fields})

    def result(self, **fields: Any) -> None:
        self._line({"event": "result", "role": self.role, "job": self.job, **fields})

    @staticmethod
    def _line(obj: dict) -> None:
        sys.stdout.write(json.dumps(obj, sort_keys=True) + "\n")
        sys.stdout.flush()


def clean_errors(f):
    """Turn the project's errors (and file-system errors) escaping a command into a one-line
    ClickException: exit status 1 and a message, never a traceback."""
    import functools

    @functools.wraps(f)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from vtrain.errors import VtrainError

        try:
            return f(*args, **kwargs)
        except VtrainError as e:
            raise click.ClickException(str(e)) from None
        except OSError as e:
            where = f" {e.filename}" if getattr(e, "filename", None) else ""
            raise click.ClickException(f"{e.strerror or e}{where}") from None

    return wrapper


def rpc_options(f):
    f = click.option(
        "--rpc-deadline",
        type=click.FloatRange(0.1, 3600),
        default=60.0,
        show_default=True,
        help="Seconds one request may spend retrying an unreachable node before giving up.",
    )(f)
    f = click.option(
        "--rpc-retries",
        type=click.IntRange(0, 50),
        default=8,
        show_default=True,
        help="Retries (exponential backoff with jitter, at most 5 s apart) of a request that could not reach the node.",
    )(f)
    f = click.option(
        "--deployment",
        "deployment_path",
        required=True,
        type=click.Path(dir_okay=False, path_type=Path),
        help="deployment.json written by `vtrain deploy` (contract addresses, chain id).",
    )(f)
    f = click.option("--rpc", required=True, metavar="URL", help="JSON-RPC endpoint of the node.")(f)
    return f


def key_option(f):
    return click.option(
        "--key-file",
        type=click.Path(dir_okay=False, path_type=Path),
        default=None,
        help="This party's key: a file of 64 hex digits (0x optional), or an encrypted JSON keystore "
        "(password from $VTRAIN_KEY_PASSWORD_FILE, $VTRAIN_KEY_PASSWORD, or a prompt on a terminal). "
        "Transactions are then signed locally instead of by an unlocked account of the node.",
    )(f)


#: Order of secp256k1: a private key is an integer in [1, N-1].
SECP256K1_N = 0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEBAAEDCE6AF48A03BBFD25E8CD0364141


def read_key_file(path: Path):
    """The account of the private key in ``path``; ClickException naming the problem (never the key)."""
    import string

    from eth_account import Account

    from vtrain.errors import CorruptArtifact
    from vtrain.training.untrusted import read_regular

    try:
        # a regular file of at most MAX_KEY_FILE_BYTES: a FIFO or /dev/zero is refused unread
        raw = read_regular(path, MAX_KEY_FILE_BYTES, "--key-file")
    except CorruptArtifact as e:
        raise click.ClickException(str(e)) from None
    except OSError as e:
        raise click.ClickException(f"--key-file {path}: {e.strerror or e}") from None
    if raw.lstrip()[:1] == b"{":
        return _read_keystore(path, raw)
    try:
        text = raw.decode("ascii").strip()
    except UnicodeDecodeError:
        raise click.ClickException(
            f"--key-file {path}: not a private key (expected 64 hex digits, got binary data)"
        ) from None
    digits = text[2:] if text[:2].lower() == "0x" else text
    if not digits or any(c not in string.hexdigits for c in digits):
        raise click.ClickException(
            f"--key-file {path}: not a private key (expected 64 hex digits, 0x optional; found non-hex characters)"
        )
    if len(digits) != 64:
        raise click.ClickException(
            f"--key-file {path}: a private key is 32 bytes (64 hex digits), got {len(digits)} hex digits"
        )
    if not 0 < int(digits, 16) < SECP256K1_N:
        raise click.ClickException(f"--key-file {path}: not a valid secp256k1 private key (zero or out of range)")
    return Account.from_key(bytes.fromhex(digits))


def _keystore_password(path: Path) -> str:
    """The keystore's password: $VTRAIN_KEY_PASSWORD_FILE's first line, $VTRAIN_KEY_PASSWORD, or a
    prompt when stdin is a terminal; never a command-line argument (it would show in `ps`)."""
    import os

    pw_file = os.environ.get("VTRAIN_KEY_PASSWORD_FILE")
    if pw_file:
        try:
            lines = Path(pw_file).read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as e:
            why = getattr(e, "strerror", None) or e
            raise click.ClickException(f"$VTRAIN_KEY_PASSWORD_FILE {pw_file}: {why}") from None
        return lines[0] if lines else ""
    if "VTRAIN_KEY_PASSWORD" in os.environ:
        return os.environ["VTRAIN_KEY_PASSWORD"]
    if sys.stdin is not None and sys.stdin.isatty():
        return click.prompt(f"password of keystore {path}", hide_input=True)
    raise click.ClickException(
        f"--key-file {path} is an encrypted keystore: set $VTRAIN_KEY_PASSWORD_FILE or $VTRAIN_KEY_PASSWORD "
        "(no terminal to prompt on)"
    )


def _read_keystore(path: Path, raw: bytes):
    """The account of an encrypted JSON keystore (eth-account's V3 format, as geth and clef write)."""
    from eth_account import Account

    from vtrain.training.untrusted import loads_json

    try:
        keystore = loads_json(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise click.ClickException(f"--key-file {path}: looks like a JSON keystore but is not JSON ({e})") from None
    if not isinstance(keystore, dict) or not ({"crypto", "Crypto"} & keystore.keys()):
        raise click.ClickException(f"--key-file {path}: a JSON keystore needs a 'crypto' section")
    _check_kdf(path, keystore)
    password = _keystore_password(path)
    try:
        key = Account.decrypt(keystore, password)
    except ValueError as e:
        text = str(e)
        if "MAC mismatch" in text:
            raise click.ClickException(f"--key-file {path}: wrong keystore password") from None
        raise click.ClickException(f"--key-file {path}: unreadable keystore ({text})") from None
    except (KeyError, TypeError) as e:
        raise click.ClickException(f"--key-file {path}: malformed keystore (missing or bad field {e})") from None
    return Account.from_key(key)


#: Most bytes of a --key-file (a V3 keystore is ~500 bytes).
MAX_KEY_FILE_BYTES = 1 << 20
#: Most work a keystore's KDF may ask for: PBKDF2 iterations (geth writes 262,144) and scrypt memory
#: 128·r·n·p bytes (geth's standard n = 2^18, r = 8, p = 1 is 256 MiB).
MAX_PBKDF2_ITERATIONS = 10_000_000
MAX_SCRYPT_BYTES = 1 << 30


def _check_kdf(path: Path, keystore: dict) -> None:
    """ClickException unless the keystore's KDF parameters are integers within the bounds above: a
    keystore from someone else could ask for 10^12 PBKDF2 iterations (hours, or an OverflowError)
    or terabytes of scrypt memory before the password is even checked."""
    crypto = keystore.get("crypto", keystore.get("Crypto"))
    params = crypto.get("kdfparams") if isinstance(crypto, dict) else None
    kdf = crypto.get("kdf") if isinstance(crypto, dict) else None
    if not isinstance(params, dict):
        raise click.ClickException(f"--key-file {path}: malformed keystore (no kdfparams)")

    def num(name: str) -> int:
        v = params.get(name)
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise click.ClickException(f"--key-file {path}: malformed keystore (kdfparams.{name}: expected a "
                                       f"positive integer, got {str(v)[:40]!r})")
        return v

    if num("dklen") != 32:
        raise click.ClickException(f"--key-file {path}: malformed keystore (kdfparams.dklen: expected 32, got "
                                   f"{params['dklen']})")
    if kdf == "pbkdf2" and num("c") > MAX_PBKDF2_ITERATIONS:
        raise click.ClickException(f"--key-file {path}: keystore asks for {params['c']} PBKDF2 iterations, more than "
                                   f"{MAX_PBKDF2_ITERATIONS} (refused: it would take hours)")
    if kdf == "scrypt" and 128 * num("n") * num("r") * num("p") > MAX_SCRYPT_BYTES:
        raise click.ClickException(f"--key-file {path}: keystore asks for scrypt n={params['n']} r={params['r']} "
                                   f"p={params['p']}, more than {MAX_SCRYPT_BYTES} bytes of memory (refused)")


def use_key(chain, key_file: Path | None, index: int, what: str) -> str:
    """This party's address: the key file's account (its transactions then signed locally; it must
    hold funds) or the node's unlocked account ``index``."""
    if key_file is None:
        return account(chain, index, what)
    from web3.middleware import SignAndSendRawMiddlewareBuilder

    acct = read_key_file(key_file)
    chain.w3.middleware_onion.inject(SignAndSendRawMiddlewareBuilder.build(acct), layer=0)
    bal = int(chain._retry("eth_getBalance", lambda: chain.w3.eth.get_balance(acct.address)))
    if bal == 0:
        raise click.ClickException(f"--key-file {key_file}: account {acct.address} has no funds on {chain.name}")
    return str(acct.address)


def spec_option(f):
    return click.option(
        "--spec",
        "spec_path",
        required=True,
        type=click.Path(dir_okay=False, path_type=Path),
        help="The training spec (JSON, or TOML if named *.toml) the job commits to.",
    )(f)


def _apply_threads(ctx: click.Context, param: click.Parameter, value: int | None) -> None:
    from vtrain.cli import _apply_threads as apply  # lazy: torch is not needed for --help

    apply(ctx, param, value)


def _check_device(ctx: click.Context, param: click.Parameter, value: str) -> str:
    from vtrain.cli import _check_device as check  # lazy: torch is not needed for --help

    return check(ctx, param, value)


def device_option(f):
    """``--device cpu|cuda[:N]`` for an agent's steps (training or replay): FP64 on either, and the
    logs, roots and rulings do not depend on it."""
    return click.option(
        "--device",
        default="cpu",
        show_default=True,
        callback=_check_device,
        help="cpu or cuda[:N]: where the steps compute (FP64 on either; a log from one replays on the other).",
    )(f)


def agent_options(f):
    f = click.option(
        "--threads",
        type=click.IntRange(min=1),
        default=None,
        expose_value=False,
        callback=_apply_threads,
        help="Compute threads for training/replay (default: $OMP_NUM_THREADS, else physical cores).",
    )(f)
    f = click.option("--events", is_flag=True, help="Stream JSON-line events on stdout (for an orchestrator).")(f)
    f = click.option(
        "--poll",
        type=click.FloatRange(0.05, 60),
        default=0.5,
        show_default=True,
        help="Seconds between passes when there is nothing to do.",
    )(f)
    f = click.option(
        "--timeout",
        type=click.FloatRange(min=0),
        default=3600.0,
        show_default=True,
        help="Give up after this many seconds (0: never); exit status 3.",
    )(f)
    return f


def policy_options(role: str):
    """The options of what this agent requires of a job's terms (``protocol.policy.TermsPolicy``)."""

    def wrap(f):
        f = click.option(
            "--term-margin",
            type=click.FloatRange(min=1),
            default=2.0,
            show_default=True,
            help="Refuse a job whose clock, window or posting period gives less than this many times what "
            "this agent needs.",
        )(f)
        f = click.option(
            "--move-seconds",
            type=click.FloatRange(min=0),
            default=15.0,
            show_default=True,
            help="Seconds one of this agent's game moves may take (computing it and getting it mined); the "
            "clock must cover every move of a game.",
        )(f)
        if role == "trainer":
            f = click.option(
                "--min-bond", type=WEI, default=0, show_default=True,
                help="Refuse a job whose challenger bond is below this (a false challenge costs the trainer gas).",
            )(f)
            f = click.option(
                "--max-stake-ratio", type=click.FloatRange(min=0), default=10.0, show_default=True,
                help="Refuse a job asking a stake of more than this many times its payment.",
            )(f)
            f = click.option(
                "--interval-seconds", type=click.FloatRange(min=0), default=600.0, show_default=True,
                help="Seconds this trainer needs to train and post one interval (the posting period must cover it).",
            )(f)
            f = click.option(
                "--step-seconds", type=click.FloatRange(min=0), default=None,
                help="Seconds one training step of this job takes (measured or declared): the clock must then "
                "also cover the K + 1 steps a game makes the trainer regenerate. [default: not counted]",
            )(f)
        else:
            f = click.option(
                "--replay-seconds", type=click.FloatRange(min=0), default=600.0, show_default=True,
                help="Seconds this auditor needs to fetch and replay one interval and challenge it (the "
                "challenge window and the posting period must cover it, times --term-margin: windows follow "
                "the posting schedule, so replaying one interval per posting period keeps up). Count the "
                "fetch at the slowest rate accepted (--min-read-rate): the trainer chooses how fast it serves.",
            )(f)
        return f

    return wrap


def refuse(out: Out, job: int, reasons: list[str]) -> None:
    """Report a refused job (never a traceback) and exit with EXIT_REFUSED."""
    for r in reasons:
        out.say(f"[red]refusing job {job}[/]: {r}")
    log.warning("job %d refused: %s", job, "; ".join(reasons))
    out.event("refused", reasons=reasons)
    out.result(ok=False, refused=reasons, status="refused")
    sys.exit(EXIT_REFUSED)


def job_refusals(proto, job: int, ctx, policy) -> list[str]:
    """Why an agent with ``policy`` declines ``job``: an op the chain cannot rule on, then its terms."""
    from protocol.rulability import UnrulableJob, check_rulable

    reasons = []
    try:
        check_rulable(ctx.job.graph)
    except UnrulableJob as e:
        reasons.append(str(e))
    j = proto.chain.call(proto.registry.functions.getJob(job))
    return reasons + policy.refusals(tuple(j[0]), int(j[2]), ctx.job.graph, ctx.spec.interval)


def load_spec(path: Path):
    """The spec file (JSON, or TOML for ``*.toml``), or a ClickException naming the problem. A run
    folder's ``spec.json`` is read as the run's spec (pinned files resolved inside the folder and
    checked against their sha256), so it works from any directory."""
    from vtrain.errors import VtrainError
    from vtrain.training.rundir import read_spec_file

    try:
        return read_spec_file(path)
    except VtrainError as e:
        raise click.ClickException(str(e)) from None


def connect(rpc: str, deployment_path: Path, retries: int, deadline: float = 60.0):
    """Chain and attached protocol, or a ClickException saying what is wrong."""
    from protocol.build import BuildError
    from protocol.chain import Chain, ChainError, Deployment
    from protocol.deploy import Protocol

    if not rpc.startswith(("http://", "https://")):
        raise click.ClickException(f"--rpc: expected an http(s):// URL, got {rpc!r}")
    try:
        chain = Chain.http(rpc, 30, retries=retries, deadline=deadline)
    except ChainError as e:
        raise click.ClickException(f"--rpc: {e}") from None
    try:  # the file first: a bad one is reported without waiting for the node
        d = Deployment.load(deployment_path)
        abis = Deployment.read(deployment_path).get("abis")  # bounded, like the load above
    except ChainError as e:
        raise click.ClickException(str(e)) from None
    try:
        chain.first_contact()
    except ChainError as e:
        raise click.ClickException(f"cannot use the JSON-RPC node at {rpc}: {e}") from None
    try:  # the code at every address is this build's, bound to the others (Protocol.attach)
        proto = Protocol.attach(chain, d)
    except (ChainError, BuildError) as e:
        raise click.ClickException(f"deployment {deployment_path}: {e}") from None
    ignore_served_abis(deployment_path, abis)
    return chain, proto


def ignore_served_abis(deployment_path: Path, abis: object) -> None:
    """A deployment file's ``abis`` are served data: the contracts are decoded with the ABIs of the
    code they were verified to be (this build's). Say so when the file's differ from them."""
    from protocol.build import load_artifact

    if not isinstance(abis, dict):
        return
    differ = sorted(name for name, abi in abis.items()
                    if name in _DEPLOYED and abi != load_artifact(name).abi)
    if differ:
        log.warning("deployment %s: its ABIs of %s differ from the verified code's; they are not used",
                    deployment_path, ", ".join(differ))


_DEPLOYED = ("JobRegistry", "DisputeGame", "Adjudicator", "DataAvailability")


def last_window_end(proto, job: int, n: int) -> int:
    """The latest challenge-window end over the job's ``n`` intervals: finalize waits for it. Not
    only the last interval's: an answered availability demand may have extended an earlier
    interval's window past the last one's."""
    return max(int(proto.chain.call(proto.registry.functions.windowEnd(job, i))) for i in range(n))


def save_deployment(proto, path: Path) -> None:
    """The deployment file: the addresses, and the deployed contracts' ABIs for other tools (vtrain's
    agents decode with the ABIs of the code they verified, never these: ``ignore_served_abis``)."""
    from vtrain.training.rundir import atomic_write

    d = {
        **proto.deployment.__dict__,
        "abis": {n: c.abi for n, c in zip(_DEPLOYED[:3], (proto.registry, proto.game, proto.adjudicator), strict=True)},
    }
    if proto.availability is not None:
        d["abis"]["DataAvailability"] = proto.availability.abi
    atomic_write(Path(path), json.dumps(d).encode())


def account(chain, index: int, what: str) -> str:
    accts = chain.accounts()
    if not 0 <= index < len(accts):
        raise click.ClickException(f"{what}: the node has {len(accts)} unlocked accounts, no index {index}")
    return accts[index]


def job_status(proto, job: int) -> str:
    return JOB_STATUS[int(proto.chain.call(proto.registry.functions.jobStatus(job)))]


def check_job_exists(proto, job: int) -> None:
    if job_status(proto, job) == "none":
        count = int(proto.chain.call(proto.registry.functions.jobCount()))
        has = f"it has jobs 1..{count}" if count else "it has no jobs"
        raise click.ClickException(f"job {job} does not exist on the registry {proto.registry.address} ({has})")


def check_job(proto, job: int, ctx) -> tuple:
    """The job's on-chain params; ClickException if it does not exist or commits to another spec
    (``JobContext.check_onchain``, as the agents run it: the spec before its model is built)."""
    from protocol.chain import ChainError

    check_job_exists(proto, job)
    params = tuple(proto.chain.call(proto.registry.functions.jobParams(job)))
    try:
        ctx.check_onchain(params)
    except ChainError as e:
        raise click.ClickException(f"job {job} does not match the spec: {e}") from None
    return params


def block_number(chain) -> int:
    return int(chain._retry("eth_blockNumber", lambda: chain.w3.eth.block_number))


def games_json(stats) -> dict[str, dict[str, Any]]:
    return {str(g): {"moves": stats.moves[g], "gas": stats.gas.get(g, 0)} for g in sorted(stats.moves)}


class Idle:
    """Reports ``idle`` once per block seen with nothing to do."""

    def __init__(self, out: Out) -> None:
        self.out = out
        self.last: int | None = None

    def __call__(self, block: int) -> None:
        if block != self.last:
            self.last = block
            self.out.event("idle", block=block)


def guard_moves(agent) -> None:
    """Make ``agent`` send a move at most once per game state: a move the contract reverted (a
    cheater that cannot open what it committed to) is not sent again until the game moves on.
    Every retry would be a mined, failed transaction (gas, and a new block, so the agent would
    never look idle and nobody's clock would ever run out)."""
    import dataclasses

    from protocol.agent import Player

    class GuardedPlayer(Player):
        reverted: set  # (game, its view without the running clocks) where our move reverted
        _key: Any = None

        def step(self, gid: int, strategy_move) -> bool:
            v = self.view(gid)
            key = (gid, dataclasses.replace(v, trainer_time=0, challenger_time=0))
            if key in self.reverted:
                return False
            self._key = key
            try:
                return super().step(gid, strategy_move)
            finally:
                self._key = None

        def send(self, gid: int, move, value: int = 0) -> dict:
            from protocol.chain import Reverted

            try:
                return super().send(gid, move, value)
            except Reverted:
                # a timeout claim only fails early: it is worth sending again later
                if self._key is not None and self._key[0] == gid and move.fn != "claimTimeout":
                    self.reverted.add(self._key)
                    log.warning("game %d: %s reverted; not sending it again in this state", gid, move.fn)
                raise

    old = agent.player
    new = GuardedPlayer(old.proto, old.account, old.party, old.stats)
    new.reverted = set()
    agent.player = new


def through_outages(loop, out: Out, deadline: float) -> dict:
    """Run an agent's loop; when the node stays unreachable past one request's retry deadline,
    report it and start the loop again (it reads everything back from the chain) until the agent's
    own ``--timeout``. A node that is down at start-up is an error at once (``connect``)."""
    from protocol.chain import RpcUnavailable

    while True:
        try:
            return loop()
        except RpcUnavailable as e:
            if time.monotonic() > deadline:
                raise
            out.say(f"[red]{e}[/]; trying again until --timeout")
            out.event("rpc_unavailable", error=str(e))


def _deadline(timeout: float) -> float:
    return time.monotonic() + timeout if timeout > 0 else float("inf")


# -- client -----------------------------------------------------------------------------------------


@click.group()
def client() -> None:
    """The client's side of a job."""


@client.command("create-job")
@rpc_options
@spec_option
@key_option
@click.option("--account-index", type=int, default=1, show_default=True, help="The client's unlocked account.")
@click.option("--trainer-index", type=int, default=2, show_default=True, help="The trainer's unlocked account.")
@click.option(
    "--trainer",
    "trainer_addr",
    default=None,
    metavar="ADDRESS",
    help="The trainer's address (instead of --trainer-index).",
)
@click.option("--payment", type=WEI, default=None, help="Payment in wei (e.g. 1e18 or 1eth). [default: 1 ETH]")
@click.option("--trainer-stake", type=WEI, default=None, help="Trainer's stake in wei. [default: 2 ETH]")
@click.option("--challenger-bond", type=WEI, default=None, help="Challenger's bond in wei. [default: 0.5 ETH]")
@click.option(
    "--challenge-window", type=click.IntRange(min=1), default=None, help="Seconds per interval. [default: 3600]"
)
@click.option(
    "--clock", type=click.IntRange(min=1), default=None, help="Chess clock per party, seconds. [default: 1800]"
)
@click.option(
    "--posting-period",
    type=click.IntRange(min=1),
    default=None,
    help="Seconds the trainer has per interval after accepting; then the client may reclaim. [default: 86400]",
)
@click.option(
    "--accept-period",
    type=click.IntRange(min=1),
    default=None,
    help="Seconds from creation during which the offer is firm: the trainer may accept (it trains the whole "
    "job first) and the job cannot be cancelled; after it, the trainer can no longer accept and cancel-job "
    "refunds the payment. At most 365 days. [default: 86400]",
)
@clean_errors
def create_job_cmd(
    rpc: str,
    deployment_path: Path,
    rpc_retries: int,
    rpc_deadline: float,
    spec_path: Path,
    key_file: Path | None,
    account_index: int,
    trainer_index: int,
    trainer_addr: str | None,
    **terms_opts: int | None,
) -> None:
    """Create (and pay for) a job training SPEC; prints {"job": ID, ...}."""
    from web3 import Web3

    from protocol.demo import create_job
    from protocol.jobs import JobContext, Terms
    from protocol.rulability import UnrulableJob, check_rulable
    from vtrain.errors import DatasetError, VtrainError
    from vtrain.frontend.job import RANDOM_INIT_CAUSE, draws_initial_weights
    from vtrain.training.spec import check_batch_fits

    spec = load_spec(spec_path)
    if spec.model not in ("mlp", "gpt") and not spec.pinned:  # the agents would refuse the job
        raise click.ClickException(
            f"--spec {spec_path}: the file model {spec.model!r} is not pinned (no model_sha256"
            f"{' or checkpoint_sha256' if spec.checkpoint else ''}): a job would commit to its file name, not its "
            "bytes, and no trainer or auditor runs it; use the run folder's spec.json (vtrain train --out); "
            "nothing was sent")
    if draws_initial_weights(spec):  # a trainer or auditor on another CPU would build another initial state
        raise click.ClickException(
            f"--spec {spec_path}: the file model {spec.model!r} has no checkpoint: {RANDOM_INIT_CAUSE}, so a "
            "trainer or auditor on another machine would build another initial state and refuse the job. Pin the "
            f"initial weights once: `vtrain train --out RUN --spec {spec_path} --pin-only` writes "
            "RUN/model/initial.safetensors and pins it in RUN/spec.json (no step is trained; `vtrain train --resume "
            "RUN` trains it); create the job with --spec RUN/spec.json and "
            "hand the run folder (spec.json, inputs.json, model/) to the trainer and auditors; nothing was sent")
    if key_file is not None:
        read_key_file(key_file)  # a malformed key fails before anything is contacted
    chain, proto = connect(rpc, deployment_path, rpc_retries, rpc_deadline)
    client_acct = use_key(chain, key_file, account_index, "--account-index")
    if trainer_addr is not None:
        if not Web3.is_address(trainer_addr):
            raise click.ClickException(f"--trainer: {trainer_addr!r} is not an address")
        trainer: str = Web3.to_checksum_address(trainer_addr)
    else:
        trainer = account(chain, trainer_index, "--trainer-index")
    terms = Terms(**{k: v for k, v in terms_opts.items() if v is not None})
    check_floors(proto, terms)
    try:
        ctx = JobContext.of(spec)
        check_rulable(ctx.job.graph)  # before paying: no game on this job could be ruled
        try:
            check_batch_fits(spec, ctx.job.dataset.n)
        except DatasetError as e:
            raise click.ClickException(f"--spec {spec_path}: {e}; nothing was sent") from None
        job = create_job(proto, client_acct, trainer, ctx, terms)
    except UnrulableJob as e:
        raise click.ClickException(f"--spec {spec_path}: {e}; nothing was sent") from None
    except VtrainError as e:
        raise click.ClickException(f"createJob: {e}") from None
    Out.make("client", job, False).say(
        f"created job {job} for trainer {trainer} ({spec.steps} steps, "
        f"{ctx.n_intervals} intervals, payment {terms.payment / 1e18:g} ETH)"
    )
    Out._line(
        {
            "job": job,
            "client": client_acct,
            "trainer": trainer,
            "registry": proto.registry.address,
            "payment": terms.payment,
            "trainer_stake": terms.trainer_stake,
            "challenger_bond": terms.challenger_bond,
            "challenge_window": terms.challenge_window,
            "clock": terms.clock,
            "posting_period": terms.posting_period,
            "accept_period": terms.accept_period,
            "accept_deadline": int(chain.call(proto.registry.functions.acceptDeadline(job))),
        }
    )


def check_floors(proto, terms) -> None:
    """ClickException naming the first term below the registry's floor (what createJob would revert
    with), before anything is sent."""
    from protocol.deploy import Floors
    from protocol.jobs import MAX_ACCEPT_PERIOD

    if not 1 <= terms.accept_period <= MAX_ACCEPT_PERIOD:
        raise click.ClickException(f"--accept-period {terms.accept_period} is not in 1..{MAX_ACCEPT_PERIOD} "
                                   "(365 days; createJob would revert); nothing was sent")
    floors = Floors.of(proto.registry, proto.chain.call)
    for option, value, floor in (
        ("--challenge-window", terms.challenge_window, floors.min_challenge_window),
        ("--clock", terms.clock, floors.min_clock),
        ("--posting-period", terms.posting_period, floors.min_posting_period),
        ("--challenger-bond", terms.challenger_bond, floors.min_challenger_bond),
    ):
        if value < floor:
            raise click.ClickException(
                f"{option} {value} is below the floor of the registry {proto.registry.address} ({floor}); "
                "nothing was sent"
            )


@client.command("reclaim-job")
@rpc_options
@key_option
@click.option("--job", "job_id", type=click.IntRange(min=1), required=True)
@click.option("--account-index", type=int, default=1, show_default=True, help="The client's unlocked account.")
@clean_errors
def reclaim_job_cmd(
    rpc: str,
    deployment_path: Path,
    rpc_retries: int,
    rpc_deadline: float,
    key_file: Path | None,
    job_id: int,
    account_index: int,
) -> None:
    """Reclaim JOB whose trainer is late posting an interval (and that has no game open): the payment
    and the bounty (part of the trainer's stake; the rest is burned) are credited to the client, then
    withdrawn. Prints {"job": ID, "reclaimed": WEI, ...}."""
    client_acct, refund, withdrawn = client_refund(
        rpc, deployment_path, rpc_retries, rpc_deadline, key_file, account_index, job_id,
        "reclaimJob", "JobReclaimed", "reclaimed",
    )
    Out.make("client", job_id, False).say(f"reclaimed job {job_id}: {refund / 1e18:g} ETH credited, withdrawn")
    Out._line({"job": job_id, "client": client_acct, "reclaimed": refund, "withdrawn": withdrawn})


def client_refund(
    rpc: str, deployment_path: Path, rpc_retries: int, rpc_deadline: float, key_file: Path | None,
    account_index: int, job_id: int, fn: str, event: str, verb: str,
) -> tuple[str, int, int]:
    """The client calls registry ``fn(job_id)`` (cancelJob, reclaimJob), reads the refund from its
    ``event`` and withdraws everything owed: ``(client, refund, withdrawn)``. A revert is a one-line
    error ("job N cannot be <verb>: ...")."""
    from web3.logs import DISCARD

    from protocol.chain import Reverted

    if key_file is not None:
        read_key_file(key_file)  # a malformed key fails before anything is contacted
    chain, proto = connect(rpc, deployment_path, rpc_retries, rpc_deadline)
    me = use_key(chain, key_file, account_index, "--account-index")
    try:
        r = chain.send(getattr(proto.registry.functions, fn)(job_id), me, what=f"{fn}({job_id})")
    except Reverted as e:
        raise click.ClickException(f"job {job_id} cannot be {verb}: {e}") from None
    ev = getattr(proto.registry.events, event)().process_receipt(r, errors=DISCARD)
    refund = int(ev[0]["args"]["refund"]) if ev else 0
    return me, refund, _withdraw(chain, proto, me)


@client.command("withdraw")
@rpc_options
@key_option
@click.option("--account-index", type=int, default=1, show_default=True, help="The client's unlocked account.")
@clean_errors
def withdraw_cmd(
    rpc: str, deployment_path: Path, rpc_retries: int, rpc_deadline: float, key_file: Path | None, account_index: int
) -> None:
    """Withdraw everything the registry owes this account (refunds of cancelled, fraudulent or
    reclaimed jobs). Prints {"account": ADDRESS, "withdrawn": WEI}."""
    if key_file is not None:
        read_key_file(key_file)
    chain, proto = connect(rpc, deployment_path, rpc_retries, rpc_deadline)
    acct = use_key(chain, key_file, account_index, "--account-index")
    Out._line({"account": acct, "withdrawn": _withdraw(chain, proto, acct)})


def _withdraw(chain, proto, acct: str) -> int:
    owed = int(chain.call(proto.registry.functions.owed(acct)))
    if owed:
        chain.send(proto.registry.functions.withdraw(), acct, what="withdraw")
    return owed


# -- trainer ----------------------------------------------------------------------------------------


@click.command("trainer")
@rpc_options
@click.option("--job", "job_id", type=click.IntRange(min=1), required=True)
@spec_option
@key_option
@click.option(
    "--store",
    "store_dir",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Folder of the trainer's artifact store (created if missing).",
)
@click.option("--cheat", type=click.Choice(CHEAT_NAMES), default=None, help="Cheat once (demo and tests).")
@click.option("--cheat-step", type=click.IntRange(min=1), default=None, help="Step of the cheat. [default: K+2]")
@click.option("--account-index", type=int, default=2, show_default=True, help="The trainer's unlocked account.")
@click.option("--nproc", type=click.IntRange(min=1), default=1, show_default=True,
              help="Train each interval on this many data-parallel ranks (same artifacts and roots).")
@click.option(
    "--pretrain/--no-pretrain",
    default=True,
    show_default=True,
    help="Train the whole job into the store before accepting it (the stake is at risk from acceptance "
    "on): a job whose training reaches a step with no finite value is refused by name, never staked on; "
    "a restart resumes the pre-training; once accepted, every interval is posted from the store. "
    "--no-pretrain: accept first, train interval by interval (a job that diverges then costs the stake).",
)
@device_option
@policy_options("trainer")
@click.option(
    "--serve-store",
    "serve_port",
    type=click.IntRange(0, 65535),
    default=None,
    help="Serve the store read-only over HTTP on 127.0.0.1:PORT (0: any free port).",
)
@agent_options
@clean_errors
def trainer_cmd(
    rpc: str,
    deployment_path: Path,
    rpc_retries: int,
    rpc_deadline: float,
    job_id: int,
    spec_path: Path,
    key_file: Path | None,
    store_dir: Path,
    cheat: str | None,
    cheat_step: int | None,
    account_index: int,
    term_margin: float,
    move_seconds: float,
    interval_seconds: float,
    step_seconds: float | None,
    max_stake_ratio: float,
    min_bond: int,
    serve_port: int | None,
    timeout: float,
    poll: float,
    events: bool,
    nproc: int = 1,
    device: str = "cpu",
    pretrain: bool = True,
) -> None:
    """Train JOB (before accepting it, with --pretrain) and post its intervals, defend every game,
    finalize and withdraw."""
    from protocol.cheats import CHEATS
    from protocol.jobs import JobContext
    from protocol.policy import TermsPolicy
    from protocol.store import ArtifactStore, serve_store
    from protocol.trainer import TrainerAgent
    from vtrain.errors import VtrainError

    out = Out.make("trainer", job_id, events)
    deadline = _deadline(timeout)
    spec = load_spec(spec_path)
    if key_file is not None:
        read_key_file(key_file)  # a malformed key fails before anything is contacted
    policy = TermsPolicy("trainer", move_seconds, interval_seconds, margin=term_margin,
                         max_stake_ratio=max_stake_ratio, min_bond=min_bond, step_seconds=step_seconds)
    chain, proto = connect(rpc, deployment_path, rpc_retries, rpc_deadline)
    me = use_key(chain, key_file, account_index, "--account-index")
    check_job_exists(proto, job_id)  # before the spec's graph and dataset are built (seconds)
    trainer = proto.chain.call(proto.registry.functions.jobParams(job_id))[0]
    if trainer.lower() != me.lower():
        who = f"--key-file {key_file}'s account" if key_file else f"account #{account_index}"
        raise click.ClickException(f"{who} {me} is not the trainer of job {job_id} ({trainer})")
    ctx = JobContext.of(spec)  # built only once check_job has checked the spec against the job
    params = check_job(proto, job_id, ctx)
    if cheat_step is not None and cheat is None:
        raise click.ClickException("--cheat-step needs --cheat")
    cheat_obj = CHEATS[cheat](spec, cheat_step or spec.interval + 2) if cheat else None
    try:
        store = ArtifactStore(store_dir)
    except (OSError, VtrainError) as e:
        raise click.ClickException(f"--store {store_dir}: {e}") from None
    if nproc > 1 and cheat_obj is not None:
        raise click.ClickException("--cheat runs in one process: drop --nproc")
    agent = TrainerAgent(proto, me, ctx, store, job_id, cheat=cheat_obj, policy=policy, nproc=nproc,
                         device=device, pretrain=pretrain)
    if agent.status() == "open":  # not staked yet: the job's terms decide whether to take it
        reasons = agent.refusals()
        if reasons:
            refuse(out, job_id, reasons)
    guard_moves(agent)
    repaired = agent.repair()  # a restart after a crash or disk damage: never serve a bad artifact
    if repaired:
        out.say(f"[yellow]regenerated damaged artifacts of interval(s) {repaired}[/]")
        out.event("repaired", intervals=repaired)
    servers: list = []

    def serve() -> None:
        """Serve the store, once the job is accepted: before, it may hold the whole pre-trained job,
        which a client could take and then cancel."""
        if serve_port is None or servers:
            return
        try:
            server, url = serve_store(store_dir, port=serve_port)
        except OSError as e:
            raise click.ClickException(f"--serve-store {serve_port}: {e.strerror or e}") from None
        servers.append(server)
        out.say(f"serving the artifact store {store_dir} at {url}")
        out.event("serving", url=url)

    out.event("started", account=me, pid=_pid(), block=block_number(chain))
    try:
        res = through_outages(lambda: _trainer_loop(agent, params, out, deadline, poll, serve=serve), out, deadline)
    except VtrainError as e:
        raise click.ClickException(str(e)) from None
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()
    out.result(**res)
    if not res["ok"]:
        sys.exit(EXIT_DIVERGED if res.get("error") == "diverged" else EXIT_TIMEOUT)


def _trainer_loop(agent, params: tuple, out: Out, deadline: float, poll: float,
                  serve: Callable[[], None] | None = None, status_every: float = PRETRAIN_STATUS_EVERY) -> dict:
    """The trainer's passes until the job is over. While the job is open it pre-trains (with
    ``agent.pretrain``; every ``status_every`` s it checks the job is still open and stops if the
    client cancelled it), then accepts; ``serve()`` is called once the job is active."""
    from protocol.chain import Reverted
    from protocol.jobs import Terms
    from protocol.policy import JobRefused
    from protocol.trainer import JobDiverges

    proto, chain, job = agent.proto, agent.proto.chain, agent.job_id
    n = agent.ctx.n_intervals
    idle = Idle(out)
    posted = 0
    checked = [time.monotonic()]
    offer: list[int] = []  # the job's accept deadline, read once

    def stop_pretraining() -> bool:
        """True once --timeout is reached or the job is no longer open (checked every status_every s)."""
        now = time.monotonic()
        if now > deadline:
            return True
        if now - checked[0] < status_every:
            return False
        checked[0] = now
        status = agent.status()
        if status != "open":
            out.say(f"job {status} while pre-training: stopping")
            return True
        if not offer:
            offer.append(agent.accept_deadline())
        if chain.now() >= offer[0]:  # acceptJob would revert: the pre-training outlasted the offer
            out.say(f"the accept deadline ({offer[0]}) passed while pre-training: stopping")
            return True
        return False

    def pretrained(step: int, _loss: float) -> None:
        i = (step - 1) // agent.ctx.spec.interval
        if step == agent.ctx.interval_span(i)[0] + agent.ctx.interval_span(i)[1] - 1:
            out.say(f"trained interval {i} of {n} before accepting")
            out.event("pretrained", interval=i)

    def diverged(e: JobDiverges) -> dict:
        i = agent.next_interval()
        due = int(chain.call(proto.registry.functions.postingDeadline(job, i)))
        bps = int(chain.call(proto.registry.functions.bountyBps()))
        out.say(f"[red]{e.site}: no finite value[/]: job {job} can never be finished: interval {i} cannot be "
                f"posted (due in {max(0, due - chain.now())} s); then the client can reclaim its payment and "
                f"{bps / 100:g}% of the stake, the rest is burned. Not training it again (recorded in the "
                f"store); exit status {EXIT_DIVERGED}")
        out.event("diverged", step=e.step, op=e.op, kind=e.kind, detail=e.detail)
        return {"ok": False, "error": "diverged", "step": e.step, "op": e.op, "kind": e.kind,
                "message": str(e), "status": agent.status(), "posted": posted,
                "games": games_json(agent.player.stats), "withdrawn": 0}

    while True:
        if time.monotonic() > deadline:
            out.say("[red]timed out[/]")
            return {
                "ok": False,
                "error": "timeout",
                "status": agent.status(),
                "posted": posted,
                "games": games_json(agent.player.stats),
                "withdrawn": 0,
            }
        block = block_number(chain)
        status = agent.status()
        sent = False
        if status == "open":
            try:
                accepted = agent.accept(Terms(trainer_stake=int(params[11])), on_step=pretrained,
                                        stop=stop_pretraining)
            except JobRefused as e:
                refuse(out, job, [str(e)])
            if accepted:
                out.say(f"accepted the job (staked {int(params[11]) / 1e18:g} ETH)")
                out.event("accepted", stake=int(params[11]))
            sent = True  # (not accepted: the next pass sees the timeout or the cancelled job)
        elif status == "active":
            if serve is not None:
                serve()
            j = chain.call(proto.registry.functions.getJob(job))
            nxt, open_games = int(j[4]), int(j[5])
            if nxt < n:
                # SAFETY: an interval may take longer to train than a game's clock: the games of the
                # intervals already posted (and demands) are played between its steps, so a griefer
                # challenging as soon as an interval is posted cannot win on time. Pre-trained
                # intervals are posted one a pass, the games played between them.
                try:
                    i = agent.run_interval(on_step=lambda _s, _loss: agent.play())
                except JobDiverges as e:
                    return diverged(e)
                if i is not None:
                    posted += 1
                    out.say(f"posted interval {i} of {n}")
                    out.event("posted", interval=i)
                    sent = True
            if agent.play():
                sent = True
            if not sent and nxt == n and open_games == 0:
                end = last_window_end(proto, job, n)
                if chain.now() > end:
                    try:
                        agent.finalize()
                    except Reverted as e:
                        log.warning("finalize: %s", e)
                    else:
                        out.say("challenge window passed: finalized")
                        out.event("finalized")
                        sent = True
        else:  # finalized, fraudulent or cancelled: collect what is owed and stop
            owed = agent.withdraw()
            out.say(f"job {status}; withdrew {owed / 1e18:g} ETH")
            return {
                "ok": True,
                "status": status,
                "posted": posted,
                "games": games_json(agent.player.stats),
                "withdrawn": owed,
            }
        if not sent:
            idle(block)
            time.sleep(poll)


# -- auditor ----------------------------------------------------------------------------------------


@click.command("auditor")
@rpc_options
@click.option("--job", "job_id", type=click.IntRange(min=1), required=True)
@spec_option
@key_option
@click.option("--store-url", required=True, metavar="URL", help="The trainer's artifact store, served over HTTP.")
@click.option(
    "--state-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Folder for the auditor's own progress (replayed records and states): a restart resumes "
    "there instead of replaying the whole job again.",
)
@click.option(
    "--false-challenger", is_flag=True, help="Challenge interval 0 without cause, once, and play blindly (demo)."
)
@click.option("--account-index", type=int, default=3, show_default=True, help="The auditor's unlocked account.")
@click.option(
    "--min-read-rate",
    type=click.FloatRange(min=1024),
    default=float(1 << 20),
    show_default=True,
    help="Bytes per second the trainer's server must keep up, on average, past the socket timeout: a read "
    "of N bytes may take up to timeout + N / rate seconds, then it is cut off (the artifact counts as "
    "unavailable). Lower it for a slow honest server sending big checkpoints.",
)
@policy_options("auditor")
@device_option
@agent_options
@clean_errors
def auditor_cmd(
    rpc: str,
    deployment_path: Path,
    rpc_retries: int,
    rpc_deadline: float,
    job_id: int,
    spec_path: Path,
    key_file: Path | None,
    store_url: str,
    state_dir: Path | None,
    false_challenger: bool,
    account_index: int,
    min_read_rate: float,
    term_margin: float,
    move_seconds: float,
    replay_seconds: float,
    timeout: float,
    poll: float,
    events: bool,
    device: str = "cpu",
) -> None:
    """Audit JOB: replay each posted interval, challenge a mismatch, play the game, withdraw."""
    from protocol.auditor import AuditorAgent
    from protocol.jobs import JobContext
    from protocol.store import HttpArtifactReader
    from vtrain.errors import VtrainError

    out = Out.make("false challenger" if false_challenger else "auditor", job_id, events)
    deadline = _deadline(timeout)
    spec = load_spec(spec_path)
    if key_file is not None:
        read_key_file(key_file)  # a malformed key fails before anything is contacted
    try:
        reader = caching_reader(HttpArtifactReader(store_url, min_rate=min_read_rate))
    except ValueError as e:
        raise click.ClickException(f"--store-url: {e}") from None
    chain, proto = connect(rpc, deployment_path, rpc_retries, rpc_deadline)
    me = use_key(chain, key_file, account_index, "--account-index")
    check_job_exists(proto, job_id)
    ctx = JobContext.of(spec)  # built only once check_job has checked the spec against the job
    check_job(proto, job_id, ctx)
    state = None
    if state_dir is not None:
        from protocol.store import ArtifactStore

        try:
            state = ArtifactStore(state_dir)
        except (OSError, VtrainError) as e:
            raise click.ClickException(f"--state-dir {state_dir}: {e}") from None
    agent = AuditorAgent(proto, me, ctx, reader, job_id, honest=not false_challenger, state=state, device=device)
    if agent.verified:
        out.say(f"resuming: intervals 0..{agent.verified - 1} audited before the restart ({state_dir})")
    guard_moves(agent)
    agent.disputed = my_games(proto, job_id, me)
    if agent.disputed:
        out.say(f"resuming: already challenging in game(s) {agent.disputed}")
    elif job_status(proto, job_id) in ("open", "active"):  # not in a game yet: may it take part?
        from protocol.policy import TermsPolicy

        policy = TermsPolicy("auditor", move_seconds, replay_seconds=replay_seconds, margin=term_margin)
        reasons = job_refusals(proto, job_id, ctx, policy)
        if reasons:
            refuse(out, job_id, reasons)
    out.event("started", account=me, pid=_pid(), block=block_number(chain), games=agent.disputed)
    try:
        res = through_outages(lambda: _auditor_loop(agent, out, deadline, poll), out, deadline)
    except VtrainError as e:
        raise click.ClickException(str(e)) from None
    out.result(**res)
    if not res["ok"]:
        sys.exit(EXIT_TIMEOUT)


def my_games(proto, job: int, who: str) -> list[int]:
    """Games on ``job`` this account opened (read back from GameCreated events)."""
    from protocol.agent import job_first_block

    logs = proto.game.events.GameCreated.get_logs(from_block=job_first_block(proto, job), argument_filters={"job": job})
    return sorted(int(e["args"]["game"]) for e in logs if e["args"]["challenger"].lower() == who.lower())


def _auditor_loop(agent, out: Out, deadline: float, poll: float) -> dict:
    from protocol.chain import Reverted
    from protocol.game import STATUS_CHALLENGER_WON, STATUS_CLOSED, STATUS_IN_PROGRESS, STATUS_TRAINER_WON, Move
    from protocol.jobs import Terms
    from protocol.store import ArtifactUnavailable
    from vtrain.errors import CorruptArtifact, MissingArtifact

    proto, chain, job = agent.proto, agent.proto.chain, agent.job_id
    bond = int(chain.call(proto.registry.functions.jobParams(job))[12])
    terms = Terms(challenger_bond=bond)
    idle = Idle(out)
    gave_up: str | None = None
    reported: dict[int, str] = {}
    outcome = {STATUS_TRAINER_WON: "trainer won", STATUS_CHALLENGER_WON: "challenger won", STATUS_CLOSED: "closed"}

    def result(ok: bool, status: str, withdrawn: int, **extra: Any) -> dict:
        games = games_json(agent.player.stats)
        for g in agent.disputed:
            games.setdefault(str(g), {"moves": 0, "gas": 0})
            games[str(g)]["outcome"] = outcome.get(agent.player.view(g).status, "in progress")
        return {
            "ok": ok,
            "status": status,
            "verified": agent.verified,
            "games": games,
            "withdrawn": withdrawn,
            "missed": gave_up,
            **extra,
        }

    while True:
        if time.monotonic() > deadline:
            out.say("[red]timed out[/]")
            return result(False, job_status(proto, job), 0, error="timeout")
        block = block_number(chain)
        status = job_status(proto, job)
        sent = blocked = False
        try:
            if status == "active":
                bad = None
                if agent.honest and _audit_needed(agent):
                    # Replay every posted interval, also after a restart mid-game: the game's
                    # moves need the replayed states and step records of the disputed interval.
                    before = agent.verified
                    bad = agent.audit()
                    blocked = _report_blocked(agent, out, reported) and not agent.disputed
                    if agent.verified > before:
                        ok_upto = agent.verified if bad is None else agent.verified - 1
                        if ok_upto > before:
                            out.say(f"replayed interval(s) {before}..{ok_upto - 1}: roots match")
                        out.event("audited", verified=agent.verified, bad=bad)
                elif not agent.disputed and int(chain.call(proto.registry.functions.getJob(job))[4]) >= 1:
                    bad = 0  # a false challenger disputes an interval that replays fine
                if bad is not None and not agent.disputed and gave_up is None:
                    why = _why(agent, bad)
                    try:
                        gid = agent.challenge(bad, terms)
                    except Reverted as e:
                        gave_up = f"interval {bad}: {e}"
                        out.say(f"[red]could not challenge interval {bad}[/]: {e}")
                    else:
                        out.say(f"challenged interval {bad} ({why}): game {gid}")
                        out.event("challenged", game=gid, interval=bad)
                    sent = True
                elif bad is not None:
                    out.say(f"interval {bad} does not replay; in game(s) {agent.disputed} already")
        except (ArtifactUnavailable, MissingArtifact, CorruptArtifact) as e:
            _unreadable(out, e)
            # Not idle while deciding whether to challenge; once in a game, the game decides.
            blocked = not agent.disputed
        if agent.disputed:
            try:
                moved, waiting = _play(agent)
                sent = moved or sent
                blocked = blocked or waiting
            except (ArtifactUnavailable, MissingArtifact, CorruptArtifact) as e:
                _unreadable(out, e)
                blocked = True
        if status == "fraudulent":  # proven in another game: close ours to get the bond back
            for g in agent.disputed:
                if agent.player.view(g).status == STATUS_IN_PROGRESS:
                    agent.player.send(g, Move("closeGame", ()))
                    sent = True
        if agent.disputed:
            views = {g: agent.player.view(g) for g in agent.disputed}
            if all(v.status != STATUS_IN_PROGRESS for v in views.values()):
                status = job_status(proto, job)  # our last move may have changed it
                owed = agent.withdraw()
                for g, v in views.items():
                    out.say(f"game {g}: {outcome.get(v.status, '?')}")
                out.say(f"job {status}; withdrew {owed / 1e18:g} ETH")
                return result(True, status, owed)
        elif status in _DONE:
            owed = agent.withdraw()
            out.say(f"job {status} with no dispute of ours; withdrew {owed / 1e18:g} ETH")
            return result(True, status, owed)
        if not sent and not blocked:
            idle(block)
        if not sent:
            time.sleep(poll)


def _audit_needed(agent) -> bool:
    """False while a game of the auditor runs and every interval it disputes is replayed: one
    conviction ends the job, and reading the trainer's artifacts of a later interval (served as
    slowly as the trainer likes) would only hold the auditor while its game clock runs."""
    from protocol.game import STATUS_IN_PROGRESS

    live = [v.interval for v in (agent.player.view(g) for g in agent.disputed) if v.status == STATUS_IN_PROGRESS]
    return not live or agent.verified <= max(live)


def _report_blocked(agent, out: Out, reported: dict[int, str]) -> bool:
    """Say once per new reason which intervals cannot be audited (artifacts that do not verify, a
    malformed committed log); True while any is left (no sign-off, retried each pass)."""
    from rich.markup import escape

    blocked = {**{i: str(u) for i, u in agent.unavailable.items()}, **{i: str(m) for i, m in agent.malformed.items()}}
    for i, why in blocked.items():
        if reported.get(i) != why:
            reported[i] = why
            if i in agent.malformed:
                out.say(f"[red]malformed committed log[/] (not signing off): {escape(why)}")
                m = agent.malformed[i]
                out.event("malformed_committed_log", interval=i, step=m.step, op=m.op, error=m.error, reason=m.reason,
                          sha256=m.sha256)
            else:
                u = agent.unavailable[i]
                out.say(f"[yellow]trainer's artifacts unavailable[/] (not used; no sign-off): {escape(why)}")
                out.event("unavailable", interval=i, artifact=u.artifact, key=u.key, op=u.op, error=u.error,
                          reason=u.reason, sha256=u.sha256)
    for i in [i for i in reported if i not in blocked]:
        del reported[i]
    return bool(blocked)


def _unreadable(out: Out, e: Exception) -> None:
    """Report an artifact the auditor cannot use: it neither challenges nor signs off on it, and
    asks again on the next pass (a correct copy is then accepted)."""
    from rich.markup import escape

    from vtrain.errors import CorruptArtifact

    if isinstance(e, CorruptArtifact):
        log.warning("rejected a corrupt artifact of the trainer: %s", e)
        out.say(f"[red]trainer's artifact rejected as corrupt[/] (not used; will fetch it again): {escape(str(e))}")
        out.event("corrupt_artifact", error=str(e))
    else:
        out.say(f"[yellow]trainer's artifacts not readable[/]: {escape(str(e))}")


def _play(agent) -> tuple[bool, bool]:
    """One pass over the auditor's games: (a move was sent, it is our move but we cannot make it
    yet). A game whose interval is not replayed yet (restarted, and the trainer's store is down)
    gets only its timeout claimed."""
    from protocol.game import PARTY_CHALLENGER, PARTY_TRAINER, STATUS_IN_PROGRESS, Move

    views = {g: agent.player.view(g) for g in agent.disputed}
    ready = [g for g, v in views.items() if not agent.honest or agent.verified > v.interval]
    sent, waiting = False, False
    everything = agent.disputed
    agent.disputed = ready
    try:
        sent = agent.play() > 0
    finally:
        agent.disputed = everything
    for g, v in views.items():
        if g in ready or v.status != STATUS_IN_PROGRESS:
            continue
        if v.to_move == PARTY_CHALLENGER:
            waiting = True
        elif v.to_move == PARTY_TRAINER and agent.proto.chain.now() > v.deadline:
            agent.player.send(g, Move("claimTimeout", ()))
            sent = True
    return sent, waiting


def caching_reader(inner):
    """``inner`` (an ArtifactReader) keeping every artifact it has read and verified: the auditor
    plays on with what it audited when the trainer's store goes away. Only verified artifacts are
    kept: a corrupt or truncated one raises CorruptArtifact (naming it and its expected hash) and
    is fetched again on the next use, so a correct copy, once served, is accepted. (The class is
    made here so that importing this module stays light.)"""
    from protocol.store import ArtifactReader

    class CachingReader(ArtifactReader):
        def __init__(self, inner: ArtifactReader) -> None:
            self.inner = inner
            self.cache: dict[tuple[str, str, Any], Any] = {}

        def __repr__(self) -> str:
            return f"CachingReader({self.inner!r})"

        def _where(self, job: str, rel: str) -> str:
            return self.inner._where(job, rel)

        def _read(self, job: str, rel: str) -> bytes:
            return self.inner._read(job, rel)

        def _kept(self, kind: str, job: Any, key: Any, read) -> Any:
            k = (kind, str(job), key)
            if k not in self.cache:
                self.cache[k] = read()  # verified by ``inner``; nothing is kept when it raises
            return self.cache[k]

        def get_blob(self, job: Any, digest: bytes) -> bytes:
            return self._kept("blob", job, bytes(digest), lambda: self.inner.get_blob(job, digest))

        def get_step(self, job: Any, s: int) -> Any:
            return self._kept("step", job, s, lambda: self.inner.get_step(job, s))

        def get_log(self, job: Any, s: int) -> bytes:
            return self._kept("log", job, s, lambda: self.inner.get_log(job, s))

        def get_checkpoint(self, job: Any, interval: int) -> bytes:
            return self._kept("checkpoint", job, interval, lambda: self.inner.get_checkpoint(job, interval))

        def forget(self, kind: str, job: Any, key: Any) -> None:
            """Drop one kept artifact (it decoded badly one level up: fetch it again next time)."""
            self.cache.pop((kind, str(job), key), None)

    return CachingReader(inner)


def _why(agent, interval: int) -> str:
    if not agent.honest:
        return "without cause"
    from vtrain.commit.roots import interval_root

    site = agent.nonfinite.get(interval)
    if site is not None:
        return f"step {site.step} has no finite value at op {site.op} element {site.index}, yet it was posted"
    first, n = agent.ctx.interval_span(interval)
    posted = bytes(agent.proto.chain.call(agent.proto.registry.functions.getInterval(agent.job_id, interval))[0])
    if posted != interval_root([agent.book.records[s].leaf() for s in range(first, first + n)]):
        return "its root differs from the replay"
    abused = [s for s in sorted(agent.overruled_steps) if first <= s < first + n]
    return f"step {abused[0]}'s log claims a value exact arithmetic overrules" if abused else "?"


def _pid() -> int:
    import os

    return os.getpid()


def _without_cheats(cmd: click.Command) -> click.Command:
    """The production ``vtrain trainer``: the same command without ``--cheat``/``--cheat-step``, which
    only the demo's and the tests' agent processes (``python -m protocol.agents_cli trainer``) offer."""
    import copy
    import functools

    prod = copy.copy(cmd)
    prod.params = [p for p in cmd.params if p.name not in ("cheat", "cheat_step")]
    inner = cmd.callback
    assert inner is not None
    prod.callback = functools.wraps(inner)(lambda **kw: inner(cheat=None, cheat_step=None, **kw))
    return prod


AGENT_COMMANDS: list[click.Command] = [client, _without_cheats(trainer_cmd), auditor_cmd]
"""Register with ``for c in AGENT_COMMANDS: main.add_command(c)`` (names: client, trainer, auditor).
The trainer here has no cheats; ``agents_main`` (demo and test processes) registers the one that has."""


@click.group()
@click.option("-v", "--verbose", count=True, help="More log output (-v info, -vv debug).")
def agents_main(verbose: int) -> None:
    """The protocol's agents (also registered in `vtrain`)."""
    from rich.logging import RichHandler

    level = [logging.WARNING, logging.INFO, logging.DEBUG][min(verbose, 2)]
    logging.basicConfig(
        level=level,
        format="%(name)s: %(message)s",
        handlers=[RichHandler(console=Console(stderr=True), show_path=False)],
    )


for _cmd in (client, trainer_cmd, auditor_cmd):
    agents_main.add_command(_cmd)


if __name__ == "__main__":
    agents_main()
