"""Plots drawn on the server as inline SVG: no script, no assets, readable without JavaScript.

Every label goes through ``markupsafe.escape``: journal sentences carry host names and
reasons a worker or producer wrote, and they end up inside the page.
"""

from __future__ import annotations

from markupsafe import Markup, escape

from runfleet.ops.cli.common import clock
from runfleet.ops.dashboard.models import Chart
from runfleet.ops.models import JournalEntry
from runfleet.store import journal_records as jr
from runfleet.store.journal_records import Kind
from runfleet.store.types import RunStatus

W, H = 640, 140
_PAD_L, _PAD_B, _PAD_T = 34, 18, 16


def chart(c: Chart) -> Markup:
    """Stacked bars, one per bucket, oldest left; the legend gives each series' total."""
    n = len(c.series[0].values) if c.series else 0
    totals = [sum(s.values[i] for s in c.series) for i in range(n)]
    top = max([1, *totals])
    plot_w, plot_h = W - _PAD_L - 4, H - _PAD_B - _PAD_T
    bar_w = plot_w / max(1, n)
    parts = [
        f'<svg class="chart" viewBox="0 0 {W} {H}" width="{W}" height="{H}" role="img" '
        f'aria-label="{escape(c.title)}">',
        f'<text x="{_PAD_L}" y="11" class="t">{escape(c.title)}</text>',
        f'<line x1="{_PAD_L}" y1="{H - _PAD_B}" x2="{W - 4}" y2="{H - _PAD_B}" class="axis"/>',
        f'<text x="{_PAD_L - 4}" y="{_PAD_T + 8}" class="l" text-anchor="end">{top}</text>',
        f'<text x="{_PAD_L - 4}" y="{H - _PAD_B}" class="l" text-anchor="end">0</text>',
        f'<text x="{_PAD_L}" y="{H - 4}" class="l">-{n * c.bucket_ms // 60_000} min</text>',
        f'<text x="{W - 4}" y="{H - 4}" class="l" text-anchor="end">now</text>',
    ]
    for i in range(n):
        y = float(H - _PAD_B)
        for s in c.series:
            v = s.values[i]
            if not v:
                continue
            h = plot_h * v / top
            y -= h
            parts.append(
                f'<rect x="{_PAD_L + i * bar_w:.1f}" y="{y:.1f}" width="{max(1.0, bar_w - 1):.1f}" '
                f'height="{h:.1f}" fill="{escape(s.color)}"><title>{escape(s.name)}: {v}</title>'
                "</rect>"
            )
    x = W - 4
    for s in reversed(c.series):
        label = f"{s.name} {sum(s.values)}"
        parts.append(
            f'<text x="{x}" y="11" class="l" text-anchor="end" fill="{escape(s.color)}">'
            f"{escape(label)}</text>"
        )
        x -= 8 + 6 * len(label)
    parts.append("</svg>")
    return Markup("".join(parts))


LANES = ("admitted", "ownership", "steps", "recovery", "waits", "cancel", "settled")
_LANE_OF: dict[str, tuple[str, str]] = {
    Kind.CREATED: ("admitted", "#455a64"),
    Kind.PARENT_RECORDED: ("admitted", "#90a4ae"),
    Kind.CLAIMED: ("ownership", "#1565c0"),
    Kind.ACTIVATED: ("ownership", "#1565c0"),
    Kind.CLAIMED_AND_ACTIVATED: ("ownership", "#1565c0"),
    Kind.CLAIM_LOST: ("ownership", "#90caf9"),
    Kind.ACTIVATION_LOST: ("ownership", "#90caf9"),
    Kind.CLAIM_ABANDONED: ("ownership", "#90caf9"),
    Kind.STOLEN_AND_ACTIVATED: ("recovery", "#e65100"),
    Kind.STEAL_REFUSED_OWNER_ALIVE: ("recovery", "#f9a825"),
    Kind.CLAIM_RECOVERED: ("recovery", "#ef6c00"),
    Kind.INTERRUPT_RELEASED: ("recovery", "#6a1b9a"),
    Kind.LEASE_RECONFIRMED: ("recovery", "#bcaaa4"),
    Kind.STEP_RECORDED: ("steps", "#78909c"),
    Kind.STEP_COMPENSATED: ("steps", "#ef6c00"),
    Kind.STEP_COMPENSATION_FAILED: ("steps", "#c62828"),
    Kind.PARKED: ("waits", "#8e24aa"),
    Kind.WOKEN: ("waits", "#00897b"),
    Kind.CLOCK_FIRED: ("waits", "#00897b"),
    Kind.DEFERRED_COMPLETED: ("waits", "#00897b"),
    Kind.EVENT_SET: ("waits", "#5e35b1"),
    Kind.MESSAGE_SENT: ("waits", "#00897b"),
    Kind.MESSAGE_RECEIVED: ("waits", "#00897b"),
    Kind.FORKED: ("admitted", "#6d4c41"),
    Kind.RESUMED_AS: ("settled", "#6d4c41"),
    Kind.FORKED_FROM: ("admitted", "#6d4c41"),
    Kind.APPROVAL_APPROVED: ("waits", "#2e7d32"),
    Kind.APPROVAL_DENIED: ("waits", "#c62828"),
    Kind.QUARANTINED: ("waits", "#c62828"),
    Kind.RESUMED: ("waits", "#00897b"),
    Kind.CANCEL_REQUESTED: ("cancel", "#757575"),
    Kind.CHILD_POLICY_APPLIED: ("cancel", "#9e9e9e"),
    Kind.INTERRUPTED: ("settled", "#757575"),
    Kind.HANDED_OFF: ("settled", "#2e7d32"),
    Kind.LINEAGE_EXHAUSTED: ("settled", "#c62828"),
}
_SETTLE_COLOR = {
    RunStatus.COMPLETED: "#2e7d32",
    RunStatus.FAILED: "#c62828",
    RunStatus.CANCELLED: "#757575",
}


def _place(e: JournalEntry) -> tuple[str, str]:
    if e.kind == Kind.TRANSITIONED:
        moved = jr.decode(e.kind, e.payload)
        if isinstance(moved, jr.Transitioned) and moved.to in _SETTLE_COLOR:
            return "settled", _SETTLE_COLOR[moved.to]
        return "waits", "#8e24aa"
    return _LANE_OF.get(e.kind, ("ownership", "#9e9e9e"))


def timeline(entries: list[JournalEntry], now_ms: int, settled: bool) -> Markup:
    """The journal as lanes over time: each record a mark whose tooltip is its sentence."""
    if not entries:
        return Markup('<p class="dim">no journal records</p>')
    t0 = entries[0].at_ms
    t1 = entries[-1].at_ms if settled else max(now_ms, entries[-1].at_ms)
    span = max(1, t1 - t0)
    lane_h, left, width = 22, 84, W + 160
    height = lane_h * len(LANES) + 24
    plot = width - left - 10
    parts = [
        f'<svg class="timeline" viewBox="0 0 {width} {height}" width="{width}" '
        f'height="{height}" role="img" aria-label="journal timeline">'
    ]
    for i, lane in enumerate(LANES):
        y = 12 + i * lane_h
        parts.append(f'<text x="{left - 6}" y="{y + 4}" class="l" text-anchor="end">{lane}</text>')
        parts.append(f'<line x1="{left}" y1="{y}" x2="{width - 10}" y2="{y}" class="lane"/>')
    base = 12 + len(LANES) * lane_h
    parts.append(f'<text x="{left}" y="{base + 6}" class="l">{clock(t0)}</text>')
    parts.append(
        f'<text x="{width - 10}" y="{base + 6}" class="l" text-anchor="end">'
        f"{clock(t1)}{'' if settled else ' (now)'}</text>"
    )
    for e in entries:
        lane, color = _place(e)
        x = left + plot * (e.at_ms - t0) / span
        y = 12 + LANES.index(lane) * lane_h
        shape = (
            f'<rect x="{x - 5:.1f}" y="{y - 5}" width="10" height="10"'
            if lane in ("recovery", "settled")
            else f'<circle cx="{x:.1f}" cy="{y}" r="5"'
        )
        parts.append(
            f'{shape} fill="{color}" class="mark" data-kind="{escape(e.kind)}">'
            f"<title>{escape(clock(e.at_ms))} {escape(e.kind)}: {escape(e.sentence)}</title>"
            f"{'</rect>' if shape.startswith('<rect') else '</circle>'}"
        )
    parts.append("</svg>")
    return Markup("".join(parts))
