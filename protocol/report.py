"""``vtrain report JOB``: one static HTML page of a job, read from the chain.

The page shows the job's terms and timeline, then each game's bisection path (level, disputed
range, who moved, gas per move) down to where it was decided: the opened op, the picked element
with its claimed value, and, for a ruling, the inputs the Adjudicator read and the element's log
entry, decoded from the ruling transaction's proof. No script, no external resource: it opens from
disk in any browser.
"""

from __future__ import annotations

import datetime as dt
import html
import struct
from typing import Any

from protocol.jobview import GameRecord, JobRecord, MoveRecord, read_job
from protocol.reverts import enum_name

_CSS = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 2em auto; max-width: 70em; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 2em; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; margin: .5em 0 1em; } td, th { padding: .2em .7em; border: 1px solid #ddd; }
th { background: #f4f4f4; text-align: left; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
.trainer { color: #0b5394; } .challenger { color: #a61c00; } .other { color: #555; }
.status { font-weight: bold; padding: .1em .5em; border-radius: .3em; background: #eee; }
.Fraudulent, .ChallengerWon { background: #f4cccc; } .Finalized, .TrainerWon { background: #d9ead3; }
code { font-size: 12px; } .bar { display: inline-block; height: .7em; background: #9fc5e8; }
"""

_CODES = {0: "none", 1: "down", 2: "up", 3: "explicit"}


def _t(ts: int) -> str:
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%d %H:%M:%S")


def _e(x: Any) -> str:
    return html.escape(str(x))


def _f32(bits: int) -> str:
    return f"{struct.unpack('<f', struct.pack('<I', bits & 0xFFFFFFFF))[0]:.9g}"


def _hexbytes(v: Any) -> bytes:
    if isinstance(v, str) and v.startswith("0x"):
        return bytes.fromhex(v[2:])
    return bytes(v)


def render_report(proto: Any, job: int) -> str:
    """The HTML page of ``job`` on ``proto``'s chain."""
    return render(read_job(proto, job), proto)


def render(j: JobRecord, proto: Any = None) -> str:
    p = j.params
    out = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>vtrain job {j.job}</title><style>{_CSS}</style></head><body>",
        f"<h1>Job {j.job} <span class='status {_e(j.status)}'>{_e(j.status)}</span></h1>",
        "<table>",
        f"<tr><th>client</th><td><code>{_e(j.client)}</code></td></tr>",
        f"<tr><th>trainer</th><td><code>{_e(j.trainer)}</code></td></tr>",
        f"<tr><th>payment / stake / bond</th><td>{j.payment / 1e18:g} / {int(p.get('trainerStake', 0)) / 1e18:g} / "
        f"{int(p.get('challengerBond', 0)) / 1e18:g} ETH</td></tr>",
        f"<tr><th>steps, K, ops per step</th><td>{_e(p.get('nSteps'))}, {_e(p.get('intervalLength'))}, "
        f"{_e(p.get('nOps'))}</td></tr>",
        f"<tr><th>window / clock / posting period / accept period</th><td>{_e(p.get('challengeWindow'))} s / "
        f"{_e(p.get('clock'))} s / {_e(p.get('postingPeriod'))} s / {_e(p.get('acceptPeriod'))} s</td></tr>",
        f"<tr><th>spec hash</th><td><code>{_e(p.get('specHash'))}</code></td></tr>",
        "</table>",
        "<h2>Timeline</h2><table><tr><th>time (UTC)</th><th>block</th><th>event</th><th>details</th></tr>",
    ]
    for e in j.timeline:
        details = ", ".join(f"{k}={v}" for k, v in e.args.items() if k not in ("job", "params"))
        out.append(f"<tr><td>{_t(e.time)}</td><td class='num'>{e.block}</td><td>{_e(e.name)}</td>"
                   f"<td><code>{_e(details)}</code></td></tr>")
    out.append("</table>")
    for g in j.games:
        out += _game(g)
    if any(j.owed.values()):
        out.append("<h2>Credits not yet withdrawn</h2><table>")
        out += [f"<tr><td><code>{_e(a)}</code></td><td class='num'>{v / 1e18:g} ETH</td></tr>"
                for a, v in j.owed.items() if v]
        out.append("</table>")
    out.append(f"<p><small>Read from the chain at {_t(j.now)} UTC.</small></p></body></html>")
    return "\n".join(out)


def _game(g: GameRecord) -> list[str]:
    verdict = f"{g.winner} won by {g.ruling}" if g.winner else g.status
    out = [
        f"<h2 id='game-{g.game}'>Game {g.game} on interval {g.interval} "
        f"<span class='status {_e(g.status)}'>{_e(verdict)}</span></h2>",
        f"<p>challenger <code>{_e(g.challenger)}</code>; {len(g.moves)} moves, {g.gas:,} gas</p>",
        "<table><tr><th>#</th><th>time (UTC)</th><th>who</th><th>move</th><th>level</th><th>range</th>"
        "<th>gas</th><th></th></tr>",
    ]
    biggest = max((m.gas for m in g.moves), default=1) or 1
    for n, m in enumerate(g.moves, 1):
        level, rng = _level(m)
        out.append(
            f"<tr><td class='num'>{n}</td><td>{_t(m.time)}</td><td class='{m.role}'>{m.role}</td>"
            f"<td>{_e(m.function)}</td><td>{_e(level)}</td><td>{_e(rng)}</td><td class='num'>{m.gas:,}</td>"
            f"<td><span class='bar' style='width:{max(1, 120 * m.gas // biggest)}px'></span></td></tr>"
        )
    out.append("</table>")
    out += _decided(g)
    return out


def _level(m: MoveRecord) -> tuple[str, str]:
    for e in m.events:
        a = e.args
        if "phase" in a and "lo" in a:
            return enum_name("Phase", int(a["phase"])), f"[{a['lo']}, {int(a['lo']) + int(a['size'])})"
        if e.name == "StepOpened":
            return "step", f"step {a['step']}"
        if e.name == "TraceCommitted":
            return "trace", f"{a['nOps']} ops"
        if e.name == "OpOpened":
            return "op", f"op {a['op']}"
        if e.name == "ChunkOpened":
            return "element", f"chunk {a['chunk']}"
        if e.name == "ElementPicked":
            return "element", f"element {a['index']}"
        if e.name in ("PartialsPosted", "ChunkDisputed", "PartialsAccepted"):
            return "chunk level", e.name
        if e.name == "GameResolved":
            return "ruling", enum_name("Ruling", int(a["ruling"]))
    return "", ""


def _decided(g: GameRecord) -> list[str]:
    """Where the game ended: the step, the op (kind, shape), the element, its inputs and log entry."""
    from vtrain.graph.step_graph import OpKind
    from vtrain.numerics.exact import OpDesc

    ev = {e.name: e.args for m in g.moves for e in m.events}
    out: list[str] = []
    if "StepOpened" in ev:
        out.append(f"<p>Disputed step: <b>{_e(ev['StepOpened']['step'])}</b></p>")
    if "OpOpened" in ev:
        a = ev["OpOpened"]
        try:
            desc = OpDesc.of(_hexbytes(a["descriptor"]))
            kind = OpKind(desc.kind).name
            what = f"{kind}, inputs {list(desc.inputs)}, shape {list(desc.shape)}, input shapes " \
                   f"{[list(s) for s in desc.in_shapes]}"
        except (ValueError, TypeError):
            what = f"kind {a['kind']}"
        out.append(f"<p>Disputed op: <b>{_e(a['op'])}</b> ({_e(what)}); output root <code>{_e(a['outRoot'])}</code>, "
                   f"op log root <code>{_e(a['opLogRoot'])}</code></p>")
    if "ElementPicked" in ev:
        a = ev["ElementPicked"]
        out.append(f"<p>Disputed element: <b>{_e(a['index'])}</b>, claimed <code>0x{int(a['claimed']):08x}</code> "
                   f"= {_e(_f32(int(a['claimed'])))}</p>")
    for m in g.moves:
        if m.function in ("oneStep", "settlePartials") and "proof" in m.args:
            out += _proof(m)
    return out


def _proof(m: MoveRecord) -> list[str]:
    """The inputs read and the log pair of a ruling transaction's proof (docs/protocol.md)."""
    from eth_abi import decode

    raw = _hexbytes(m.args["proof"])
    try:
        openings, log = decode(["(bytes,bytes32[])[]", "(uint256,uint256,bytes,bytes32[])"], raw)
    except Exception:  # a chunk-level proof (Opening[] only) or a malformed one: show what decodes
        try:
            (openings,) = decode(["(bytes,bytes32[])[]"], raw)
            log = None
        except Exception:
            return [f"<p>Ruling proof: {len(raw)} bytes (not decodable as a one-step proof)</p>"]
    out = [f"<p>Ruled by <b>{_e(m.function)}</b> ({m.gas:,} gas), sent by the {m.role}. Inputs read:</p>",
           "<table><tr><th>opening</th><th>values (FP32)</th><th>siblings</th></tr>"]
    for n, (data, siblings) in enumerate(openings):
        vals = [_f32(v) for v in struct.unpack(f"<{len(data) // 4}I", data[: len(data) // 4 * 4])]
        shown = ", ".join(vals[:16]) + (f", … ({len(vals)} values)" if len(vals) > 16 else "")
        out.append(f"<tr><td class='num'>{n}</td><td><code>{_e(shown)}</code></td>"
                   f"<td class='num'>{len(siblings)}</td></tr>")
    out.append("</table>")
    if log is not None:
        position, size, leaves, _ = log
        rows = []
        for k in range(len(leaves) // 9):
            key, code, value = struct.unpack(">IBI", leaves[9 * k: 9 * k + 9])
            label = "LOW" if key == 0 else "HIGH" if key == 0xFFFFFFFF else f"element {key - 1}"
            rows.append(f"<tr><td class='num'>{position + k}</td><td>{label}</td><td>{_CODES.get(code, code)}</td>"
                        f"<td><code>0x{value:08x}</code></td></tr>")
        out += [f"<p>Log entries around the element (op log tree of {size} leaves):</p>",
                "<table><tr><th>leaf</th><th>key</th><th>code</th><th>value</th></tr>", *rows, "</table>"]
    return out
