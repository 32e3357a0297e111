// #/upgrades and #/upgrades/<id>: upgrade jobs, and one job component by
// component with its steps, kept live.

import { get, listAll } from '../api.js';
import { $, el, fmtShortTime, fmtTime, renderInto, reset, summary, table } from '../dom.js';
import { clearProblemIfStale, notice } from '../feedback.js';
import { poll, watch } from '../live.js';
import { renderEvents } from './events.js';

const versions = (j) => `${j.from_version || '?'} → ${j.version}`;

export const upgradesView = {
  id: 'view-upgrades',
  nav: 'nav-upgrades',
  title: () => 'Upgrades',
  async run(_params, signal) {
    await poll(async () => {
      const jobs = await listAll('/v1/upgrades?limit=100', signal);
      if (signal.aborted) return;
      clearProblemIfStale();
      $('upgrades-empty').hidden = jobs.length > 0;
      const rows = jobs.map((j) => [j.id, j.cluster, versions(j), j.state,
        j.current ? `${j.current.component}: ${j.current.step_name}` : '—', fmtTime(j.created_at)]);
      renderInto($('upgrades-body'), JSON.stringify(rows), () => rows.map(([id, cluster, vs, state, now, created]) =>
        el('tr', { 'data-testid': 'upgrade-row' },
          el('td', {}, el('a', { href: `#/upgrades/${id}`, 'data-testid': 'upgrade-link', text: `#${id}` })),
          el('td', { text: cluster }), el('td', { text: vs }), el('td', { class: `state-${state}`, text: state }),
          el('td', { text: now }), el('td', { text: created }))));
    }, signal);
  },
};

const STEP_HEADINGS = ['Step', 'Name', 'State', 'Attempts', 'API retries', 'Started', 'Finished', 'Error'];

function component(c) {
  const steps = c.steps.map((s) => [String(s.step), s.name, el('span', { class: `state-${s.state}`, text: s.state }),
    String(s.attempts), String(s.api_retries), fmtShortTime(s.started_at), fmtShortTime(s.finished_at), s.error || '']);
  return el('section', { class: 'component', 'data-testid': 'upgrade-component', 'data-component': c.component },
    el('h3', {}, `${c.component} `, el('span', { class: `state-${c.state}`, text: `(${c.state.replace('_', ' ')})` })),
    el('p', { class: 'muted', text: `${c.old_image || '?'} → ${c.new_image}` }),
    steps.length
      ? table(STEP_HEADINGS, steps, () => ({ 'data-testid': 'upgrade-step' }))
      : el('p', { class: 'muted', text: 'Not started.' }));
}

function renderJob(j) {
  summary($('upgrade-summary'), [
    ['Cluster', j.cluster],
    ['Version', versions(j)],
    ['State', `${j.state}${j.cancel_requested ? ' (cancel requested)' : ''}`],
    ['Now', j.current ? `${j.current.component}, step ${j.current.step}: ${j.current.step_name}` : '—'],
    ['Driven by', j.driver || '—'],
    ['Images from', j.image_repository],
    ['Forced', j.force ? 'yes' : 'no'],
    ['Created', fmtTime(j.created_at)],
    ['Finished', fmtTime(j.finished_at)],
    ['Error', j.error || 'none'],
  ]);
  renderInto($('upgrade-components'), JSON.stringify(j.progress), () => j.progress.map(component));
}

export const upgradeView = {
  id: 'view-upgrade',
  nav: 'nav-upgrades',
  title: ([id]) => `Upgrade #${id}`,
  async run([id], signal) {
    $('upgrade-title').textContent = `Upgrade job #${id}`;
    reset('upgrade-summary', 'upgrade-components', 'upgrade-events');
    const base = `/v1/upgrades/${encodeURIComponent(id)}`;
    const refresh = async () => {
      const [job, events] = await Promise.all([get(base, signal), get(`${base}/events?limit=20`, signal)]);
      if (signal.aborted) return;
      clearProblemIfStale();
      renderJob(job);
      renderEvents($('upgrade-events'), events.items || []);
    };
    await watch(`${base}/stream`, refresh, {
      status: (j) => { if (j && j.progress) renderJob(j); },
      deleted: () => { notice(`Upgrade job #${id} was deleted.`); location.hash = '#/upgrades'; },
    }, signal);
  },
};
