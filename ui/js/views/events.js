// A resource's recent events (pool or upgrade job), newest first.

import { el, fmtShortTime, renderInto } from '../dom.js';

export function renderEvents(node, events) {
  const rows = events.map((e) => [e.id, e.time, e.type, e.reason, e.message]);
  renderInto(node, JSON.stringify(rows), () => (rows.length ? rows : [null]).map((r) => (r
    ? el('li', { class: r[2] === 'Warning' ? 'warning' : '', 'data-testid': 'event' },
      el('time', { datetime: r[1], text: fmtShortTime(r[1]) }), el('span', { class: 'reason', text: r[3] }), r[4])
    : el('li', { class: 'muted', text: 'No events yet.' }))));
}
