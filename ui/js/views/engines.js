// #/engines: the Docker engines drover drives (GET /v1/engines), each a
// failure domain: where it is, whether it answers, what it holds, and
// whether new machines go there.

import { listAll } from '../api.js';
import { $, el, fmtAgo, renderInto } from '../dom.js';
import { clearProblemIfStale } from '../feedback.js';
import { poll } from '../live.js';

const labelsText = (labels) => Object.entries(labels || {}).map(([k, v]) => `${k}=${v}`).join(', ');

// Whether new machines go there, and why not: placement never takes a
// machine away, so an engine that takes none keeps what it has.
function placementCell(p) {
  const refused = (p.refused_images || []).map((r) => `${r.image} refused: ${r.error}`);
  const why = p.eligible ? 'yes' : `no: ${p.blocked.replace('_', ' ')}${p.message ? ` (${p.message})` : ''}`;
  return el('td', { class: p.eligible && refused.length === 0 ? '' : 'bad', 'data-testid': 'engine-placement',
    'data-blocked': p.blocked || '' },
  why, ...refused.map((r) => el('div', { class: 'muted', text: r })));
}

function row(e) {
  const s = e.status;
  const reach = s.reachability;
  return el('tr', { 'data-testid': 'engine-row', 'data-engine': e.name, 'data-reachability': reach,
    'data-draining': String(e.draining) },
  el('th', { scope: 'row' }, e.name, e.builtin ? el('span', { class: 'muted', text: ' (built in)' }) : null),
  el('td', { class: 'mono', text: e.endpoint }),
  el('td', {},
    el('span', { class: `reach reach-${reach}`, text: reach }),
    el('span', { class: 'muted' }, ' since ', el('time', { datetime: s.since, title: new Date(s.since).toLocaleString(),
      text: fmtAgo(s.since) }))),
  el('td', { text: s.version || '—' }),
  el('td', { class: 'num', 'data-testid': 'engine-machines', text: s.machines }),
  el('td', { class: e.draining ? 'bad' : '', text: e.draining ? 'draining' : 'no' }),
  placementCell(s.placement),
  el('td', { text: labelsText(e.labels) || '—' }),
  el('td', {}, s.last_seen ? el('time', { datetime: s.last_seen, title: new Date(s.last_seen).toLocaleString(),
    text: fmtAgo(s.last_seen) }) : '—'),
  el('td', { class: s.last_error ? 'bad' : 'muted', 'data-testid': 'engine-error', text: s.last_error || 'none' }));
}

export const enginesView = {
  id: 'view-engines',
  nav: 'nav-engines',
  title: () => 'Engines',
  async run(_params, signal) {
    await poll(async () => {
      const engines = await listAll('/v1/engines?limit=500', signal);
      if (signal.aborted) return;
      clearProblemIfStale();
      $('engines-empty').hidden = engines.length > 0;
      // Rebuilt when an engine changes, and every 10 s for the relative times.
      const key = JSON.stringify([engines, Math.floor(Date.now() / 10000)]);
      renderInto($('engines-body'), key, () => engines.map(row));
    }, signal);
  },
};
